package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
)

// The Responses API bench: a background streamed response read by the
// official Go SDK; its frontend SIGKILLed at an event → the next event
// at the SDK, which resumes with retrieve(stream, starting_after) at the
// other frontend, beside the RTO of a decode worker's SIGKILL in the same
// run; and the throughput of /v1/responses ÷ /v1/chat/completions for the
// same streamed load, rounds alternating.

// dispatches reads frontends' logs for the instance each request was
// dispatched to.
type dispatches struct {
	mu sync.Mutex
	to map[string]string
}

func (d *dispatches) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		var l struct {
			Msg       string `json:"msg"`
			RequestID string `json:"request_id"`
			Instance  string `json:"instance_id"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "dispatch" {
			d.mu.Lock()
			d.to[l.RequestID] = l.Instance
			d.mu.Unlock()
		}
	}
	return len(p), nil
}

func (d *dispatches) of(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.to[id]
}

func benchResponse(k int) responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: "small", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("Failover run %d began when", k))},
		MaxOutputTokens: openai.Int(48), Temperature: openai.Float(0.9), Background: openai.Bool(true)}
}

// sdkEvents reads s to its end, calling at on each event's sequence
// number (stop: leave the stream there); it returns the text and the
// last sequence number.
func sdkEvents(s *ssestream.Stream[responses.ResponseStreamEventUnion], at func(seq int64, id string) bool) (string, int64, error) {
	var text strings.Builder
	last := int64(-1)
	for s.Next() {
		e := s.Current()
		if e.Type == "error" {
			return text.String(), last, fmt.Errorf("error event %s: %s", e.Code, e.Message)
		}
		text.WriteString(e.Delta)
		last = e.SequenceNumber
		if at != nil && at(e.SequenceNumber, e.Response.ID) {
			return text.String(), last, nil
		}
	}
	return text.String(), last, s.Err()
}

func runResponsesBench(kills int) error {
	fmt.Printf("## The Responses API (small preset, 2 nodes × 1 worker, 2 frontends; the official Go SDK; real processes)\n\n")
	c, err := startBenchCluster(256)
	if err != nil {
		return err
	}
	defer c.close()
	log := &dispatches{to: map[string]string{}}
	fronts := make([]*localcluster.Frontend, 2)
	listen := make([]string, 2)
	start := func(i int) error {
		f, err := c.env.StartFrontend(listen[i], log, "--id", fmt.Sprintf("R%d", i))
		fronts[i] = f
		return err
	}
	for i := range fronts {
		if listen[i], err = freePort(); err != nil {
			return err
		}
		if err := start(i); err != nil {
			return err
		}
	}
	defer func() {
		for _, f := range fronts {
			f.Stop(10 * time.Second)
		}
	}()
	ctx := context.Background()
	client := func(i int) openai.Client {
		return openai.NewClient(option.WithBaseURL(fronts[i].URL+"/v1/"), option.WithAPIKey("bench"), option.WithMaxRetries(0))
	}
	seed := func(k int) option.RequestOption { return option.WithJSONSet("seed", 200+k) }
	eos := option.WithJSONSet("ignore_eos", true)
	const at = 12
	var fe, wk []time.Duration
	diverged := 0
	for k := 0; k < kills; k++ {
		c0 := client(0)
		want, _, err := sdkEvents(c0.Responses.NewStreaming(ctx, benchResponse(k), seed(k), eos), nil)
		if err != nil {
			return fmt.Errorf("reference %d: %w", k, err)
		}
		// The frontend serving the stream, killed at event at.
		p, o := k%2, (k+1)%2
		cp, co := client(p), client(o)
		s := cp.Responses.NewStreaming(ctx, benchResponse(k), seed(k), eos)
		var id string
		head, last, err := sdkEvents(s, func(seq int64, rid string) bool {
			if rid != "" {
				id = rid
			}
			return seq == at
		})
		if err != nil {
			return fmt.Errorf("frontend kill %d: %w", k, err)
		}
		killed := time.Now()
		fronts[p].Signal(syscall.SIGKILL)
		<-fronts[p].Exited()
		s.Close()
		var gap time.Duration
		rest, _, err := sdkEvents(co.Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(last)}), func(int64, string) bool {
			if gap == 0 {
				gap = time.Since(killed)
			}
			return false
		})
		if err != nil {
			return fmt.Errorf("resume %d: %w", k, err)
		}
		fe = append(fe, gap)
		if head+rest != want {
			diverged++
		}
		if err := start(p); err != nil {
			return err
		}
		// The decode worker serving it, killed at event at.
		var ws time.Time
		victim := ""
		got, _, err := sdkEvents(c0.Responses.NewStreaming(ctx, benchResponse(k), seed(k), eos), func(seq int64, rid string) bool {
			switch {
			case rid != "":
				id = rid
			case seq == at:
				victim = log.of(id)
				ws = c.kill(victim)
			case seq == at+1:
				wk = append(wk, time.Since(ws))
			}
			return false
		})
		if err != nil {
			return fmt.Errorf("worker kill %d: %w", k, err)
		}
		if got != want {
			diverged++
		}
		if err := c.waitBack(victim); err != nil {
			return err
		}
	}
	fmt.Printf("| SIGKILL at event %d → next event at the SDK | kills | p50 | p99 | streams not identical |\n|---|---|---|---|---|\n", at)
	fmt.Printf("| frontend (the SDK resumes at the other: retrieve, stream, starting_after) | %d | %v | %v | %d |\n", len(fe), pct(fe, 50), pct(fe, 99), diverged)
	fmt.Printf("| decode worker (baseline: migration inside the frontend, unseen by the SDK) | %d | %v | %v | |\n", len(wk), pct(wk, 50), pct(wk, 99))
	fmt.Printf("| frontend kill ÷ worker kill, p50 | | **%.2f×** | | |\n\n", float64(pct(fe, 50))/float64(pct(wk, 50)))
	return responsesThroughput(fronts[0].URL)
}

// waitBack waits for a killed instance's next registration.
func (c *benchCluster) waitBack(instance string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := c.env.WaitRegistration(ctx, instance, c.regs[instance].Generation)
	if err == nil {
		c.regs[instance] = reg
	}
	return err
}

// responsesThroughput streams the same load (8 clients, 6 requests each,
// 48 tokens) as responses and as chat completions, rounds alternating,
// and reports tokens per second of each and their ratio.
func responsesThroughput(url string) error {
	const clients, each, tokens = 8, 6, 48
	round := func(responses bool) (float64, error) {
		start := time.Now()
		errs := make(chan error, clients)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				for j := range each {
					path, body := "/v1/chat/completions", map[string]any{"model": "small", "max_tokens": tokens, "seed": i*each + j, "stream": true, "ignore_eos": true,
						"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("Throughput run %d began when", j)}}}
					if responses {
						path, body = "/v1/responses", map[string]any{"model": "small", "max_output_tokens": tokens, "seed": i*each + j, "stream": true, "ignore_eos": true,
							"input": fmt.Sprintf("Throughput run %d began when", j)}
					}
					b, _ := json.Marshal(body)
					resp, err := http.Post(url+path, "application/json", bytes.NewReader(b))
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							err = fmt.Errorf("%s: %s", path, resp.Status)
						}
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return 0, err
		}
		return float64(clients*each*tokens) / time.Since(start).Seconds(), nil
	}
	var chat, resp []float64
	for range 3 {
		for _, r := range []bool{false, true} {
			v, err := round(r)
			if err != nil {
				return err
			}
			if r {
				resp = append(resp, v)
			} else {
				chat = append(chat, v)
			}
		}
	}
	slices.Sort(chat)
	slices.Sort(resp)
	fmt.Printf("| streamed load (%d clients × %d requests × %d tokens), median of 3 alternating rounds | tokens/s |\n|---|---|\n", clients, each, tokens)
	fmt.Printf("| /v1/chat/completions (baseline) | %.0f |\n| /v1/responses | %.0f |\n| responses ÷ chat | **%.2f×** (goal ≥ 0.95) |\n\n", chat[1], resp[1], resp[1]/chat[1])
	return nil
}
