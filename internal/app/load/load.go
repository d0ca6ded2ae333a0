// Package load is a load generator for frontends: Requests streamed
// completions started at Rate a second across the frontends' URLs, each
// with a seeded prompt and read to its end. It reports what the clients
// saw: how many were admitted and completed, the start rate reached, the
// most streams open at once, and the time to the first token and between
// tokens (p50, p99). What the servers spent (CPU per token, memory per
// stream, etcd writes) the caller reads around a run (Server, Scrape).
// `lifeline load` and the bench's fleet mode run it.
package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is one run.
type Config struct {
	// URLs are the frontends; request i goes to URLs[i%len(URLs)].
	URLs  []string
	Model string
	// Requests are started at Rate a second (0: all at once), each asking
	// for MaxTokens tokens (ignore_eos) with seed Seed+i.
	Requests  int
	Rate      float64
	MaxTokens int
	Seed      uint64
	// HTTP2 sends them over cleartext HTTP/2 (prior knowledge): streams
	// share a few connections, as a load balancer's do. Off: HTTP/1.1, a
	// connection per open stream.
	HTTP2 bool
	// Client sends them (nil: HTTP2's).
	Client *http.Client
}

// Report is what the clients saw.
type Report struct {
	Requests, Completed, Failed int
	FirstError                  string
	Tokens                      int64
	Elapsed                     time.Duration
	// StartRate is the requests started a second over the start window;
	// PeakOpen the most streams between their first token and their end.
	StartRate float64
	PeakOpen  int64
	// TTFT is from a request's send to its first token; Gap between two
	// tokens of a stream.
	TTFT, Gap Quantiles
}

// Quantiles are a latency distribution's median and 99th percentile.
type Quantiles struct{ P50, P99 time.Duration }

func (q Quantiles) String() string {
	return fmt.Sprintf("p50 %v, p99 %v", q.P50.Round(10*time.Microsecond), q.P99.Round(10*time.Microsecond))
}

// Validate refuses a run that cannot be made, naming the field.
func (c *Config) Validate() error {
	switch {
	case len(c.URLs) == 0:
		return errors.New("load: no frontend URL")
	case c.Model == "":
		return errors.New("load: no model")
	case c.Requests <= 0:
		return fmt.Errorf("load: requests %d (want > 0)", c.Requests)
	case c.Rate < 0:
		return fmt.Errorf("load: rate %v (want ≥ 0; 0: all at once)", c.Rate)
	case c.MaxTokens <= 0:
		return fmt.Errorf("load: max tokens %d (want > 0)", c.MaxTokens)
	}
	return nil
}

// run is one Run's shared state.
type run struct {
	cfg             Config
	client          *http.Client
	ttft, gap       Histogram
	completed, fail atomic.Int64
	tokens          atomic.Int64
	open, peak      atomic.Int64
	firstErr        sync.Once
	errText         string
}

// Run makes the run and waits for every stream to end (or ctx).
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	r := &run{cfg: cfg, client: cfg.Client}
	if r.client == nil {
		t := &http.Transport{MaxIdleConnsPerHost: 1024}
		if cfg.HTTP2 {
			t.Protocols = new(http.Protocols)
			t.Protocols.SetUnencryptedHTTP2(true)
		}
		r.client = &http.Client{Transport: t}
	}
	start := time.Now()
	var wg sync.WaitGroup
	started := 0
	for i := range cfg.Requests {
		if cfg.Rate > 0 {
			at := start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
			if d := time.Until(at); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
				case <-t.C:
				}
			}
		}
		if ctx.Err() != nil {
			break
		}
		started++
		wg.Go(func() { r.stream(ctx, i) })
	}
	window := time.Since(start)
	wg.Wait()
	rep := Report{Requests: started, Completed: int(r.completed.Load()), Failed: int(r.fail.Load()), FirstError: r.errText,
		Tokens: r.tokens.Load(), Elapsed: time.Since(start), PeakOpen: r.peak.Load(),
		TTFT: Quantiles{r.ttft.Quantile(0.5), r.ttft.Quantile(0.99)}, Gap: Quantiles{r.gap.Quantile(0.5), r.gap.Quantile(0.99)}}
	if started > 1 && window > 0 {
		rep.StartRate = float64(started-1) / window.Seconds()
	}
	return rep, ctx.Err()
}

func (r *run) failed(err error) {
	r.fail.Add(1)
	r.firstErr.Do(func() { r.errText = err.Error() })
}

// stream sends request i and reads its events: a token is an event with
// an id (sequence number); [DONE] ends it; an error event fails it.
func (r *run) stream(ctx context.Context, i int) {
	body := fmt.Sprintf(`{"model":%q,"prompt":"Load stream %d began when","max_tokens":%d,"seed":%d,"temperature":0.9,"stream":true,"ignore_eos":true}`,
		r.cfg.Model, i, r.cfg.MaxTokens, r.cfg.Seed+uint64(i))
	url := r.cfg.URLs[i%len(r.cfg.URLs)]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		r.failed(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		r.failed(fmt.Errorf("request %d: %w", i, err))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// The frontend's typed error says what was wrong.
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		r.failed(fmt.Errorf("request %d: %s: %s", i, resp.Status, bytes.TrimSpace(msg)))
		return
	}
	last, tokens := time.Time{}, 0
	defer func() {
		if tokens > 0 {
			r.open.Add(-1)
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte("id: ")):
			now := time.Now()
			if tokens == 0 {
				r.ttft.Add(now.Sub(sent))
				if n := r.open.Add(1); n > r.peak.Load() {
					r.peak.Store(n) // a peak missed by a racing store is one stream
				}
			} else {
				r.gap.Add(now.Sub(last))
			}
			last = now
			tokens++
			r.tokens.Add(1)
		case bytes.Equal(line, []byte("data: [DONE]")):
			r.completed.Add(1)
			return
		case bytes.HasPrefix(line, []byte(`data: {"error"`)):
			r.failed(fmt.Errorf("request %d after %d tokens: %s", i, tokens, line[len("data: "):]))
			return
		}
	}
	err = sc.Err()
	if err == nil {
		err = errors.New("the stream ended without [DONE]")
	}
	r.failed(fmt.Errorf("request %d after %d tokens: %w", i, tokens, err))
}
