package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/tests/binaries"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// runDrainBench measures, on two small nodes behind a frontend, the time
// from `nodectl drain` to the frontend no longer counting the node's
// instance as routable, over repeated drains and undrains; then one drain
// with short and long streams in flight against its deadline.
func runDrainBench(drains int) error {
	fmt.Printf("## Drain (small preset, 2 nodes × 1 worker, %d drains of node b1)\n\n", drains)
	c, err := startBenchCluster(256)
	if err != nil {
		return err
	}
	defer c.close()
	url, err := c.frontend()
	if err != nil {
		return err
	}
	ctx := context.Background()
	sock := c.nodes[1].Options.Socket
	var toNotRoutable []time.Duration
	for k := 0; k < drains; k++ {
		if err := waitRoutable(url, 2, time.Minute); err != nil {
			return err
		}
		start := time.Now()
		if _, err := nodectl.Drain(ctx, sock, controlapi.DrainRequest{Deadline: "5s", HardDeadline: "10s"}); err != nil {
			return err
		}
		if err := waitRoutable(url, 1, 10*time.Second); err != nil {
			return err
		}
		toNotRoutable = append(toNotRoutable, time.Since(start))
		if err := waitDrained(ctx, sock); err != nil {
			return err
		}
		if _, err := nodectl.Undrain(ctx, sock); err != nil {
			return err
		}
	}
	fmt.Printf("| measure | p50 | p99 | samples |\n|---|---|---|---|\n")
	fmt.Printf("| `nodectl drain` → not routable at the frontend | %v | %v | %d |\n\n", pct(toNotRoutable, 50), pct(toNotRoutable, 99), len(toNotRoutable))
	return drainWithStreams(ctx, c, url, sock)
}

// drainWithStreams starts two short and two long streams, drains the
// node serving most of them with a 3 s deadline, and reports how long the
// drain took against it.
func drainWithStreams(ctx context.Context, c *benchCluster, url, _ string) error {
	if err := waitRoutable(url, 2, time.Minute); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var failed, migrated atomic.Int64
	serving := make(chan string, 4)
	for i, n := range []int{32, 32, 1500, 1500} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := map[string]any{"model": "small", "prompt": fmt.Sprintf("Drain %d", i), "max_tokens": n, "seed": i, "stream": true, "ignore_eos": true}
			_, last, err := clustertest.Stream(url, body, func(t clustertest.Token) {
				if t.Seq == 1 {
					serving <- t.Instance
				}
			})
			if err != nil {
				failed.Add(1)
			} else if ll, _ := last["lifeline"].(map[string]any); ll["migrations"] != 0.0 {
				migrated.Add(1)
			}
		}()
	}
	count := map[string]int{}
	for range 4 {
		count[strings.SplitN(<-serving, "-", 2)[0]]++
	}
	node := "b0"
	if count["b1"] > count["b0"] {
		node = "b1"
	}
	sock := c.nodeOf(node).Options.Socket
	const deadline = 3 * time.Second
	if _, err := nodectl.Drain(ctx, sock, controlapi.DrainRequest{Deadline: deadline.String(), HardDeadline: "15s"}); err != nil {
		return err
	}
	if err := waitDrained(ctx, sock); err != nil {
		return err
	}
	st, err := nodectl.GetStatus(ctx, sock)
	if err != nil || st.Drain == nil {
		return fmt.Errorf("drain status: %v", err)
	}
	wg.Wait()
	d := st.Drain
	took := d.DrainedAt.Sub(d.StartedAt)
	fmt.Printf("| drain of the node serving %d of 4 streams (2 of 32 tokens, 2 of 1,500), deadline %v | |\n|---|---|\n", count[node], deadline)
	fmt.Printf("| drain duration | %v (%.2f× the deadline) |\n", took.Round(time.Millisecond), took.Seconds()/deadline.Seconds())
	fmt.Printf("| requests on the node at the start: finished in place / moved early / ended at the deadline | %d: %d / %d / %d |\n",
		d.ActiveAtStart, d.FinishedInPlace, d.MovedEarly, d.EndedAtDeadline)
	fmt.Printf("| streams migrated / failed at the client | %d / %d of 4 |\n\n", migrated.Load(), failed.Load())
	_, err = nodectl.Undrain(ctx, sock)
	return err
}

func waitDrained(ctx context.Context, sock string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := nodectl.GetStatus(ctx, sock); err == nil && st.Drain != nil && st.Drain.Phase == controlapi.DrainDrained {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s not drained within 30s", sock)
}

// waitRoutable polls the frontend's /readyz until it counts want routable
// instances.
func waitRoutable(url string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			var r struct {
				Routable int `json:"routable_instances"`
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if json.Unmarshal(b, &r) == nil && r.Routable == want {
				return nil
			}
			last = string(b)
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("frontend never counted %d routable instances (last %s)", want, last)
}

// runUpgradeBench runs a 3-node `lifeline up` (tiny preset) under three
// clients streaming seeded requests, and compares the goodput (tokens of
// streams that completed) during `lifeline upgrade --rolling` with the
// goodput before it.
func runUpgradeBench() error {
	fmt.Printf("## Rolling upgrade (tiny preset, 3 nodes × 1 worker, 3 clients streaming 200-token requests)\n\n")
	dir, err := os.MkdirTemp("", "lifeline-upgrade-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := binaries.Build(dir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- localcluster.Run(ctx, localcluster.Options{DataDir: filepath.Join(dir, "up"), Nodes: 3, Preset: "tiny", Listen: "127.0.0.1:0", Binary: bin}, out)
	}()
	defer func() { cancel(); <-done }()
	url, err := out.waitURL(2 * time.Minute)
	if err != nil {
		return err
	}
	load := startLoad(url)
	time.Sleep(10 * time.Second)
	before := load.window()
	socks, _ := filepath.Glob(filepath.Join(dir, "up", "node-*", "agent.sock"))
	sort.Strings(socks)
	start := time.Now()
	err = nodectl.RollingUpgrade(ctx, nodectl.RollingOptions{Sockets: socks, Deadline: "10s", HardDeadline: "20s"}, io.Discard)
	during := load.window()
	load.stop()
	if err != nil {
		return err
	}
	fmt.Printf("| measure | before | during the upgrade (%v) | ratio |\n|---|---|---|---|\n", time.Since(start).Round(time.Millisecond))
	fmt.Printf("| goodput, tokens/s | %.0f | %.0f | %.2f |\n", before.rate, during.rate, during.rate/before.rate)
	fmt.Printf("| streams completed / failed | %d / %d | %d / %d | |\n\n", before.ok, before.failed, during.ok, during.failed)
	return nil
}

// load is clients streaming seeded requests without pause.
type load struct {
	mu       sync.Mutex
	tokens   int
	ok, fail int
	since    time.Time
	quit     chan struct{}
	wg       sync.WaitGroup
}

type window struct {
	rate       float64
	ok, failed int
}

func startLoad(url string) *load {
	l := &load{since: time.Now(), quit: make(chan struct{})}
	for c := 0; c < 3; c++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for k := c; ; k += 3 {
				select {
				case <-l.quit:
					return
				default:
				}
				body := map[string]any{"model": "tiny", "prompt": fmt.Sprintf("Story %d:", k%6), "max_tokens": 200, "seed": 100 + k%6,
					"temperature": 0.9, "stream": true, "ignore_eos": true}
				toks, _, err := clustertest.Stream(url, body, nil)
				l.mu.Lock()
				if err != nil || len(toks) != 200 {
					l.fail++
				} else {
					l.ok++
					l.tokens += len(toks)
				}
				l.mu.Unlock()
				if err != nil && len(toks) == 0 {
					// Refused at once: not again in a hot loop.
					select {
					case <-l.quit:
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		}()
	}
	return l
}

// window returns what completed since the last window and starts a new one.
func (l *load) window() window {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := window{rate: float64(l.tokens) / time.Since(l.since).Seconds(), ok: l.ok, failed: l.fail}
	l.tokens, l.ok, l.fail, l.since = 0, 0, 0, time.Now()
	return w
}

func (l *load) stop() { close(l.quit); l.wg.Wait() }

// lineBuffer collects `lifeline up`'s output.
type lineBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lineBuffer) waitURL(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		s := b.b.String()
		b.mu.Unlock()
		for _, l := range strings.Split(s, "\n") {
			if u, ok := strings.CutPrefix(l, "URL "); ok {
				return u, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("lifeline up did not come up within %v", timeout)
}
