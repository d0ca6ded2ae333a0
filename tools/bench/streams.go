package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/internal/app/overload"
	"github.com/lifeline-llm/lifeline/internal/debugsock"
)

// The frontend at scale: one frontend holding streamsOpen concurrent
// streamed chat completions of tiny workers, every streamsSlowEvery-th
// one a slow reader (one event a second), the others reading an event
// every streamsPace, all over HTTP/2 with 8 KiB stream windows (so that
// the frontend's writers wait on them instead of handing a whole stream
// to the kernel's loopback buffers). A tiny worker holds the KV
// of about 16 whole contexts (decode.kvBlocks), so the streams are
// generated in waves and stay open because their readers are slower
// than the workers, as on a real cluster where decoding is what is
// slow. It measures the memory of an open stream (the frontend's Go
// heap and stacks, and its RSS, before and with every stream open), that
// the frontend's memory does not grow while every reader lags behind a
// finished log, and, in a phase of its own with readers as fast as the
// tokens come (a write and a flush per token: the frontend's worst
// case), the frontend's CPU per relayed token against the workers' CPU
// per token they generated in the same window.
const (
	streamsOpen      = 1000
	streamsSlowEvery = 5
	streamsMaxTokens = 200 // within tiny's context (4,096)
	streamsPace      = 500 * time.Millisecond
	cpuStreams       = 400
	streamsNodes     = 2
	streamsWorkers   = 2 // per node
	streamsSlots     = 300
	perStreamGoal    = 50 << 10
	cpuShareGoal     = 0.05
)

// streamsCluster is the bench's cluster: nodes of tiny decode workers
// with room for every stream at once, and one frontend.
type streamsCluster struct {
	env   *localcluster.Env
	nodes []*localcluster.Node
	fe    *localcluster.Frontend
}

func startStreamsCluster() (c *streamsCluster, err error) {
	c = &streamsCluster{}
	if c.env, err = buildEnv("lifeline-streams-bench"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	var ids []string
	for i := 0; i < streamsNodes; i++ {
		id := fmt.Sprintf("s%d", i)
		o := c.env.NodeOptions(id, c.env.Dir+"/node-"+fmt.Sprint(i))
		o.ArenaSlots, o.ArenaSlotBytes = 4096, 16384
		o.CanaryIdle = agent.Duration(time.Hour)
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: streamsWorkers, MaxRunning: streamsSlots, MaxQueued: streamsSlots}}
		n := c.env.NewNode(o)
		if err := n.Start(); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		for k := 0; k < streamsWorkers; k++ {
			ids = append(ids, fmt.Sprintf("%s-decode-tiny-%d", id, k))
		}
	}
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := c.env.WaitRegistration(ctx, id, 0)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	c.fe, err = c.env.StartFrontend("127.0.0.1:0", nil, "--max-conns", strconv.Itoa(4*streamsOpen))
	return c, err
}

func (c *streamsCluster) close() {
	if c.fe != nil {
		c.fe.Stop(10 * time.Second)
	}
	for _, n := range c.nodes {
		n.Stop(20 * time.Second)
		n.RemoveArena()
	}
	closeEnv(c.env)
}

// workerPIDs are the decode workers' processes, from the agents.
func (c *streamsCluster) workerPIDs() ([]int, error) {
	var pids []int
	for _, n := range c.nodes {
		ws, err := n.Workers(context.Background())
		if err != nil {
			return nil, err
		}
		for _, w := range ws {
			pids = append(pids, w.PID)
		}
	}
	return pids, nil
}

// cpuTicks is a process's user+system CPU time in clock ticks
// (/proc/<pid>/stat fields 14 and 15; 100 a second on Linux).
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: /proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return u + s, nil
}

// feMemory is the frontend's memory after a collection: Go heap and
// stacks in use, RSS, goroutines, and its tokens so far.
type feMemory struct {
	heap, stacks, rss, goroutines, tokens, slowClosed float64
}

func (m feMemory) inUse() float64 { return m.heap + m.stacks }

// sampleMemory collects the frontend's garbage and reads its metrics
// (overload.ScrapeAfterGC).
func (c *streamsCluster) sampleMemory() (feMemory, error) {
	m, err := overload.ScrapeAfterGC(context.Background(), c.fe.Debug, c.fe.MetricsURL)
	if err != nil {
		return feMemory{}, err
	}
	// The live heap the collection found (heap in use also counts the
	// free room of spans still in use: how the allocator happens to be
	// laid out, not what the streams hold).
	heap, ok := m["go_gc_heap_live_bytes"]
	if !ok {
		return feMemory{}, fmt.Errorf("bench: the frontend exports no go_gc_heap_live_bytes")
	}
	return feMemory{heap: heap, stacks: m["go_memstats_stack_inuse_bytes"], rss: m["process_resident_memory_bytes"],
		goroutines: m["go_goroutines"], tokens: m["lifeline_frontend_tokens_total"], slowClosed: m["lifeline_frontend_slow_clients_closed_total"]}, nil
}

// streamClients are the bench's open streams and their counts.
type streamClients struct {
	opened, finished, received atomic.Int64
	errs                       atomic.Int64
	firstErr                   atomic.Value
	wg                         sync.WaitGroup
	cancel                     context.CancelFunc
}

// windowTransport speaks cleartext HTTP/2 with an 8 KiB window per
// stream, so that a reader that lags makes the frontend's writer wait (on
// loopback the kernel's socket buffers would otherwise take a whole
// stream, whatever the client's receive buffer).
func windowTransport() *http.Transport {
	tr := &http.Transport{Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 8 << 10, MaxReceiveBufferPerConnection: 4 << 20}}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return tr
}

// openStreams starts n streams of maxTokens against url, every
// slowEvery-th a slow reader (an event a second); the others read an
// event every pace, or as fast as they come with pace 0 (HTTP/1.1).
// Paced readers speak HTTP/2 with small windows (windowTransport): the
// frontend's writer of a stream whose reader lags waits, as over a real
// network.
func openStreams(url string, n, slowEvery, maxTokens int, pace time.Duration) *streamClients {
	ctx, cancel := context.WithCancel(context.Background())
	sc := &streamClients{cancel: cancel}
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if pace > 0 {
		cl = &http.Client{Transport: windowTransport()}
	}
	for i := 0; i < n; i++ {
		wait := pace
		if i%slowEvery == slowEvery-1 {
			wait = time.Second
		}
		sc.wg.Go(func() { sc.stream(ctx, cl, url, i, maxTokens, wait) })
	}
	return sc
}

func (sc *streamClients) fail(err error) {
	if sc.errs.Add(1) == 1 {
		sc.firstErr.Store(err)
	}
}

func (sc *streamClients) stream(ctx context.Context, cl *http.Client, url string, i, maxTokens int, pace time.Duration) {
	body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"Stream %d of the scale bench"}],"max_tokens":%d,"seed":%d,"temperature":0.9,"stream":true,"ignore_eos":true}`,
		i, maxTokens, i)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := cl.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			sc.fail(err)
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		sc.fail(fmt.Errorf("stream %d: %s", i, resp.Status))
		return
	}
	first := true
	for rd := sse.NewReader(resp.Body); ; {
		ev, err := rd.Next()
		if err != nil {
			if errors.Is(err, io.EOF) { // [DONE]
				sc.finished.Add(1)
			} else if ctx.Err() == nil {
				sc.fail(fmt.Errorf("stream %d: %w", i, err))
			}
			return
		}
		if ev.ID == "" {
			continue
		}
		if first {
			sc.opened.Add(1)
			first = false
		}
		sc.received.Add(1)
		if pace > 0 {
			select {
			case <-time.After(pace):
			case <-ctx.Done():
				return
			}
		}
	}
}

func (sc *streamClients) stop() {
	sc.cancel()
	sc.wg.Wait()
}

// pollUntil polls cond every 100 ms until it holds or d passes.
func pollUntil(d time.Duration, what string, cond func() bool) error {
	for end := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			return fmt.Errorf("bench: %s: not within %v", what, d)
		}
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

// runStreamsBench measures what open streams cost one frontend.
func runStreamsBench() error {
	fmt.Printf("## The frontend at scale (tiny preset, %d nodes × %d workers; real processes)\n\n", streamsNodes, streamsWorkers)
	c, err := startStreamsCluster()
	if err != nil {
		return err
	}
	defer c.close()
	workers, err := c.workerPIDs()
	if err != nil {
		return err
	}
	// Warm up (connections to every worker), then CPU per token with fast
	// readers.
	warm := openStreams(c.fe.URL, 16, 1<<30, streamsMaxTokens, 0)
	warm.wg.Wait()
	fe0, wk0, tok0, hand0, err := c.cpuSample(workers)
	if err != nil {
		return err
	}
	fast := openStreams(c.fe.URL, cpuStreams, 1<<30, streamsMaxTokens, 0)
	if path := os.Getenv("LIFELINE_BENCH_STREAMS_CPUPROFILE"); path != "" {
		c.saveProfile(path, "/debug/pprof/profile?seconds=5")
	}
	fast.wg.Wait()
	fe1, wk1, tok1, hand1, err := c.cpuSample(workers)
	if err != nil {
		return err
	}
	if n := fast.errs.Load(); n > 0 {
		return fmt.Errorf("bench: %d streams failed, the first: %v", n, fast.firstErr.Load())
	}
	cpu := cpuFigures{fe: fe1 - fe0, wk: wk1 - wk0, tokens: tok1 - tok0, handOffs: hand1 - hand0, received: fast.received.Load()}
	mem, err := c.memoryPhase()
	if err != nil {
		fmt.Printf("CPU phase: frontend %d ticks, workers %d ticks, %.0f tokens (%d received)\n", cpu.fe, cpu.wk, cpu.tokens, cpu.received)
		return err
	}
	printStreamsTable(mem, cpu)
	return nil
}

// cpuFigures are the CPU phase's: ticks of the frontend and the workers,
// the tokens the frontend committed, those its clients received.
type cpuFigures struct {
	fe, wk   int64
	tokens   float64
	handOffs float64 // of worker frames to run loops
	received int64
}

// memFigures are the memory phase's samples.
type memFigures struct {
	base, open, lag1, lag2 feMemory
	slowRead               int64
}

// memoryPhase opens streamsOpen streams of paced and slow readers and
// samples the frontend's memory before, with every stream open, and twice
// once every log is complete while the readers lag.
func (c *streamsCluster) memoryPhase() (f memFigures, err error) {
	if f.base, err = c.sampleMemory(); err != nil {
		return f, err
	}
	sc := openStreams(c.fe.URL, streamsOpen, streamsSlowEvery, streamsMaxTokens, streamsPace)
	defer sc.stop()
	if err := pollUntil(3*time.Minute, "every stream open", func() bool { return sc.opened.Load()+sc.errs.Load() >= streamsOpen }); err != nil {
		return f, err
	}
	if n := sc.errs.Load(); n > 0 {
		return f, fmt.Errorf("bench: %d streams failed, the first: %v", n, sc.firstErr.Load())
	}
	if n := sc.finished.Load(); n > 0 {
		return f, fmt.Errorf("bench: %d streams finished before the last opened: not %d open at once", n, streamsOpen)
	}
	if f.open, err = c.sampleMemory(); err != nil {
		return f, err
	}
	if path := os.Getenv("LIFELINE_BENCH_STREAMS_HEAPPROFILE"); path != "" {
		c.saveProfile(path, "/debug/pprof/heap")
	}
	if err := c.waitTokensSettle(f.base.tokens + streamsOpen*streamsMaxTokens); err != nil {
		return f, err
	}
	if f.lag1, err = c.sampleMemory(); err != nil {
		return f, err
	}
	read := sc.received.Load()
	time.Sleep(5 * time.Second) // the interval between the two samples is the measure
	if f.lag2, err = c.sampleMemory(); err != nil {
		return f, err
	}
	f.slowRead = sc.received.Load() - read
	if n := sc.finished.Load(); n > 0 {
		return f, fmt.Errorf("bench: %d streams finished before the second sample: make the readers slower", n)
	}
	if n := sc.errs.Load(); n > 0 {
		return f, fmt.Errorf("bench: %d streams failed, the first: %v", n, sc.firstErr.Load())
	}
	return f, nil
}

// cpuSample is the frontend's and the workers' CPU ticks, and the
// frontend's tokens and hand-offs of frames so far.
func (c *streamsCluster) cpuSample(workers []int) (fe, wk int64, tokens, handOffs float64, err error) {
	if fe, err = cpuTicks(c.fe.PID()); err != nil {
		return
	}
	for _, p := range workers {
		t, err := cpuTicks(p)
		if err != nil {
			return 0, 0, 0, 0, err
		}
		wk += t
	}
	m, err := overload.Scrape(context.Background(), c.fe.MetricsURL)
	return fe, wk, m["lifeline_frontend_tokens_total"], m["lifeline_frontend_frame_batches_total"], err
}

// waitTokensSettle waits until the frontend has committed want tokens:
// every log complete.
func (c *streamsCluster) waitTokensSettle(want float64) error {
	return pollUntil(2*time.Minute, "every log complete", func() bool {
		m, err := overload.Scrape(context.Background(), c.fe.MetricsURL)
		return err == nil && m["lifeline_frontend_tokens_total"] >= want
	})
}

func printStreamsTable(f memFigures, cpu cpuFigures) {
	per := (f.open.inUse() - f.base.inUse()) / streamsOpen
	rss := (f.open.rss - f.base.rss) / streamsOpen
	logTokens := (f.open.tokens - f.base.tokens) / streamsOpen
	feTok := float64(cpu.fe) * 1e7 / cpu.tokens // ticks are 10 ms: ns per token
	wkTok := float64(cpu.wk) * 1e7 / cpu.tokens
	grow := f.lag2.inUse() - f.lag1.inUse()
	fmt.Printf("| measure | figure | baseline (same run) | ratio | goal |\n|---|---|---|---|---|\n")
	fmt.Printf("| frontend memory per open stream (Go heap + stacks after GC; %d streams open, 1 in %d a slow reader, %.0f tokens in a log on average) | %.1f KiB (heap %.1f, stacks %.1f) | %.1f MiB before the streams | | < 50 KB: %s |\n",
		streamsOpen, streamsSlowEvery, logTokens, per/1024, (f.open.heap-f.base.heap)/streamsOpen/1024, (f.open.stacks-f.base.stacks)/streamsOpen/1024,
		f.base.inUse()/(1<<20), verdict(per < perStreamGoal))
	fmt.Printf("| frontend RSS per open stream | %.1f KiB | %.1f MiB before | | |\n", rss/1024, f.base.rss/(1<<20))
	fmt.Printf("| frontend goroutines per open stream | %.2f | %.0f before | | |\n", (f.open.goroutines-f.base.goroutines)/streamsOpen, f.base.goroutines)
	fmt.Printf("| frontend memory growth over 5 s, every log complete, every reader behind (they read %d events meanwhile) | %+.1f KiB | %.1f MiB held | %.4f | no growth: %s |\n",
		f.slowRead, grow/1024, f.lag1.inUse()/(1<<20), grow/f.lag1.inUse(), verdict(grow <= f.lag1.inUse()/100))
	fmt.Printf("| slow clients cut by the write timeout | %.0f | | | |\n", f.lag2.slowClosed)
	fmt.Printf("| frontend CPU per relayed token (%d fast-reading streams × %d tokens, %d received) | %.1f µs | workers' CPU per generated token: %.1f µs | %.3f | < %.2f: %s |\n",
		cpuStreams, streamsMaxTokens, cpu.received, feTok/1e3, wkTok/1e3, feTok/wkTok, cpuShareGoal, verdict(feTok/wkTok < cpuShareGoal))
	fmt.Printf("| worker frames per hand-off to a request's run loop, same phase (1: the relay kept up) | %.2f | | | |\n\n", cpu.tokens/max(cpu.handOffs, 1))
}

// saveProfile writes one of the frontend's profiles to path (a diagnosis:
// LIFELINE_BENCH_STREAMS_CPUPROFILE, LIFELINE_BENCH_STREAMS_HEAPPROFILE).
func (c *streamsCluster) saveProfile(path, endpoint string) {
	b, err := debugsock.Get(context.Background(), c.fe.Debug, endpoint, 256<<20)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: profile:", err)
		return
	}
	os.WriteFile(path, b, 0o644)
}
