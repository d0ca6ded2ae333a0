package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
)

// recordsCost measures what the request records cost: streamed
// throughput and time to first token through a frontend that writes them
// and one that does not (--failover-records=false), rounds alternating;
// and etcd writes per request (the etcd revision's growth over
// sequential requests, nothing else writing).
func recordsCost(c *benchCluster) error {
	on, err := c.frontend()
	if err != nil {
		return err
	}
	off, err := c.frontend("--failover-records=false")
	if err != nil {
		return err
	}
	const rounds, streams, tokens = 3, 8, 64
	var tpsOn, tpsOff []float64
	var ttftOn, ttftOff []time.Duration
	for r := 0; r < rounds; r++ {
		for _, f := range []struct {
			url  string
			tps  *[]float64
			ttft *[]time.Duration
		}{{on, &tpsOn, &ttftOn}, {off, &tpsOff, &ttftOff}} {
			tps, ttft, err := streamLoad(f.url, streams, tokens, r)
			if err != nil {
				return err
			}
			*f.tps = append(*f.tps, tps)
			*f.ttft = append(*f.ttft, ttft...)
		}
	}
	writesOn, err := etcdWritesPerRequest(c, on, 20)
	if err != nil {
		return err
	}
	writesOff, err := etcdWritesPerRequest(c, off, 20)
	if err != nil {
		return err
	}
	sortFloats(tpsOn)
	sortFloats(tpsOff)
	mOn, mOff := tpsOn[len(tpsOn)/2], tpsOff[len(tpsOff)/2]
	fmt.Printf("| request records (%d rounds of %d concurrent %d-token streams) | tokens/s (median round) | TTFT p50 | TTFT p99 | etcd writes per request |\n|---|---|---|---|---|\n", rounds, streams, tokens)
	fmt.Printf("| on (default) | %.0f | %v | %v | %.2f |\n", mOn, pct(ttftOn, 50), pct(ttftOn, 99), writesOn)
	fmt.Printf("| off (`--failover-records=false`) | %.0f | %v | %v | %.2f |\n", mOff, pct(ttftOff, 50), pct(ttftOff, 99), writesOff)
	fmt.Printf("| on ÷ off | **%.2f×** | %.2f× | | |\n\n", mOn/mOff, float64(pct(ttftOn, 50))/float64(pct(ttftOff, 50)))
	return nil
}

// streamLoad runs n concurrent seeded streams of tokens through url and
// returns the tokens per second over the whole and each stream's time to
// its first token.
func streamLoad(url string, n, tokens, round int) (float64, []time.Duration, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ttft []time.Duration
	var errs []error
	got := 0
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Go(func() {
			t0 := time.Now()
			body := fmt.Sprintf(`{"model":"small","prompt":"Load %d of round %d","max_tokens":%d,"seed":%d,"temperature":0.9,"stream":true,"ignore_eos":true}`, i, round, tokens, i)
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			defer resp.Body.Close()
			k := 0
			for rd := sse.NewReader(resp.Body); ; {
				ev, err := rd.Next()
				if err != nil {
					break
				}
				if ev.ID == "" {
					continue
				}
				if k == 0 {
					mu.Lock()
					ttft = append(ttft, time.Since(t0))
					mu.Unlock()
				}
				k++
			}
			mu.Lock()
			got += k
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return 0, nil, errs[0]
	}
	if got != n*tokens {
		return 0, nil, fmt.Errorf("%d tokens streamed, want %d", got, n*tokens)
	}
	return float64(got) / time.Since(start).Seconds(), ttft, nil
}

// etcdWritesPerRequest is the growth of the etcd revision (every write
// bumps it) over n sequential streamed requests through url, per request.
func etcdWritesPerRequest(c *benchCluster, url string, n int) (float64, error) {
	rev := func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.env.Client.Get(ctx, "/lifeline/v1/bench-revision")
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
	before, err := rev()
	if err != nil {
		return 0, err
	}
	completes := completeWrites(url)
	for i := 0; i < n; i++ {
		if _, _, err := streamLoad(url, 1, 8, 1000+i); err != nil {
			return 0, err
		}
	}
	// The completion write follows the stream's end: wait for the n
	// completions (a frontend without records counts none).
	for deadline := time.Now().Add(5 * time.Second); completes > 0 || completeWrites(url) > 0; {
		if completeWrites(url) >= completes+float64(n) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	after, err := rev()
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(n), nil
}

// completeWrites is the frontend's count of completion record writes.
func completeWrites(url string) float64 {
	m, ok := localcluster.MetricsURLOf(url)
	if !ok {
		return 0
	}
	resp, err := http.Get(m + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, `lifeline_frontend_request_record_writes_total{kind="complete"} `); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
