package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	loadgen "github.com/lifeline-llm/lifeline/internal/app/load"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/internal/app/overload"
)

// The frontend at fleet scale: four frontends in front of eight workers
// of the synthetic engine (a step every 1/fleetStepRate s, nothing
// computed), loaded by internal/app/load. Three phases, each against a
// baseline of the same run: streams relayed through the frontends
// against the same streams straight from the workers (added latency,
// throughput, frontend CPU per relayed token, memory per open stream);
// short requests admitted at a rate by a frontend that writes request
// records against one that does not (CPU per admitted request; etcd
// writes and database growth per request).
const (
	fleetFrontends = 4
	fleetWorkers   = 8
	fleetStepRate  = 20 // synthetic steps (tokens per stream) a second
	fleetTokens    = 100
	fleetStartRate = 500 // streams started a second
	fleetAdmitToks = 4
)

// fleet is the bench's cluster.
type fleet struct {
	env       *localcluster.Env
	node      *localcluster.Node
	fes       []*localcluster.Frontend // records on
	noRecords *localcluster.Frontend
	addrs     map[string]string // instance → its QUIC address
	gens      map[string]uint64
}

func startFleet(streams int, records bool) (f *fleet, err error) {
	// Every stream is a connection to a frontend and one from it.
	lim := syscall.Rlimit{Cur: 1 << 16, Max: 1 << 16}
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	f = &fleet{addrs: map[string]string{}, gens: map[string]uint64{}}
	if f.env, err = buildEnv("lifeline-fleet-bench"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	o := f.env.NodeOptions("f0", f.env.Dir+"/node-f0")
	o.CanaryIdle = agent.Duration(time.Hour)
	slots := 2*streams/fleetWorkers + 64 // a reserve is held back for interactive requests
	o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: fleetWorkers, SyntheticRate: fleetStepRate, MaxRunning: slots, MaxQueued: slots}}
	f.node = f.env.NewNode(o)
	if err := f.node.Start(); err != nil {
		return nil, err
	}
	for k := range fleetWorkers {
		id := fmt.Sprintf("f0-decode-synthetic-tiny-%d", k)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		reg, err := f.env.WaitRegistration(ctx, id, 0)
		cancel()
		if err != nil {
			return nil, err
		}
		f.addrs[id], f.gens[id] = reg.Addr, reg.Generation
	}
	conns := strconv.Itoa(max(2*streams+64, 16384))
	for range fleetFrontends {
		fe, err := f.env.StartFrontend("127.0.0.1:0", nil, "--max-conns", conns, "--failover-records="+strconv.FormatBool(records))
		if err != nil {
			return nil, err
		}
		f.fes = append(f.fes, fe)
	}
	f.noRecords, err = f.env.StartFrontend("127.0.0.1:0", nil, "--max-conns", conns, "--failover-records=false")
	return f, err
}

func (f *fleet) close() {
	for _, fe := range append(f.fes, f.noRecords) {
		if fe != nil {
			fe.Stop(10 * time.Second)
		}
	}
	if f.node != nil {
		f.node.Stop(20 * time.Second)
		f.node.RemoveArena()
	}
	closeEnv(f.env)
}

// usage is what frontends spent: CPU ticks, the tokens they relayed, and
// the streams they served without a record (etcd slower than a second).
type usage struct {
	ticks   int64
	tokens  float64
	skipped float64
}

func (f *fleet) usage(fes ...*localcluster.Frontend) (u usage, err error) {
	for _, fe := range fes {
		t, err := cpuTicks(fe.PID())
		if err != nil {
			return u, err
		}
		m, err := overload.Scrape(context.Background(), fe.MetricsURL)
		if err != nil {
			return u, err
		}
		u.ticks += t
		u.tokens += m["lifeline_frontend_tokens_total"]
		u.skipped += m["lifeline_frontend_request_records_skipped_total"]
	}
	return u, nil
}

func (u usage) since(v usage) usage {
	return usage{u.ticks - v.ticks, u.tokens - v.tokens, u.skipped - v.skipped}
}

// cpuPer is CPU time (clock ticks of 10 ms) per n things.
func cpuPer(ticks int64, n float64) time.Duration {
	return time.Duration(float64(ticks) * float64(10*time.Millisecond) / max(n, 1))
}

// runFleetBench runs the three phases with streams streams and
// admissions at admitRate a second.
func runFleetBench(streams, admitRate int, admitFor time.Duration, records bool) error {
	fmt.Printf("## The frontend at fleet scale (%d frontends × %d synthetic workers at %d tokens/s a stream; %d streams; real processes)\n\n",
		fleetFrontends, fleetWorkers, fleetStepRate, streams)
	f, err := startFleet(streams, records)
	if err != nil {
		return err
	}
	defer f.close()
	urls := make([]string, len(f.fes))
	for i, fe := range f.fes {
		urls[i] = fe.URL
	}
	ctx := context.Background()
	// Warm-up: every frontend's connections to every worker.
	if _, err := loadgen.Run(ctx, loadgen.Config{URLs: urls, Model: "synthetic-tiny", Requests: 4 * fleetFrontends * fleetWorkers, MaxTokens: 2}); err != nil {
		return err
	}
	direct, err := f.direct(streams)
	if err != nil {
		return err
	}
	h1, err := f.relay(urls, streams, false)
	if err != nil {
		return err
	}
	h2, err := f.relay(urls, streams, true)
	if err != nil {
		return err
	}
	printRelay(direct, h1, h2, streams)
	return f.admission(admitRate, admitFor)
}

// relayFigures are a relay phase's.
type relayFigures struct {
	rep  loadgen.Report
	used usage
	mem  memFigures
}

// relay runs the streams through the frontends (over HTTP/2 when h2),
// sampling the first frontend's memory once every stream was started.
func (f *fleet) relay(urls []string, streams int, h2 bool) (relayFigures, error) {
	var mem memFigures
	base, err := f.memory(f.fes[0])
	if err != nil {
		return relayFigures{}, err
	}
	mem.base = base
	u0, err := f.usage(f.fes...)
	if err != nil {
		return relayFigures{}, err
	}
	var wg sync.WaitGroup
	var memErr error
	wg.Go(func() {
		time.Sleep(time.Duration(float64(streams)/fleetStartRate*float64(time.Second)) + time.Second)
		mem.open, memErr = f.memory(f.fes[0])
	})
	if path := os.Getenv("LIFELINE_BENCH_FLEET_CPUPROFILE"); path != "" && !h2 {
		// The first frontend's profile once every stream was started:
		// the relay alone.
		wg.Go(func() {
			time.Sleep(time.Duration(float64(streams) / fleetStartRate * float64(time.Second)))
			(&streamsCluster{fe: f.fes[0]}).saveProfile(path, "/debug/pprof/profile?seconds=3")
		})
	}
	rep, err := loadgen.Run(context.Background(), loadgen.Config{URLs: urls, Model: "synthetic-tiny", Requests: streams, Rate: fleetStartRate, MaxTokens: fleetTokens, Seed: 1, HTTP2: h2})
	wg.Wait()
	if err == nil {
		err = memErr
	}
	if err == nil && rep.Failed > 0 {
		err = fmt.Errorf("bench: %d of %d streams failed, the first: %s", rep.Failed, rep.Requests, rep.FirstError)
	}
	if err != nil {
		return relayFigures{}, err
	}
	u1, err := f.usage(f.fes...)
	return relayFigures{rep: rep, used: u1.since(u0), mem: mem}, err
}

// memory is a frontend's memory after a collection.
func (f *fleet) memory(fe *localcluster.Frontend) (feMemory, error) {
	c := &streamsCluster{fe: fe}
	return c.sampleMemory()
}

// direct runs the same streams straight from the workers over QUIC, one
// connection per worker.
func (f *fleet) direct(streams int) (loadgen.Report, error) {
	tlsConf, err := workerclient.ClientTLS(f.env.Certs)
	if err != nil {
		return loadgen.Report{}, err
	}
	ctx := context.Background()
	var clients []*workerclient.Client
	for id, addr := range f.addrs {
		c, err := workerclient.Dial(ctx, addr, tlsConf, id, f.gens[id])
		if err != nil {
			return loadgen.Report{}, err
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var ttft, gap loadgen.Histogram
	var wg sync.WaitGroup
	var failed, tokens int64
	var mu sync.Mutex
	start := time.Now()
	for i := range streams {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) / fleetStartRate * float64(time.Second)))))
		wg.Go(func() {
			n, err := directStream(ctx, clients[i%len(clients)], i, &ttft, &gap)
			mu.Lock()
			defer mu.Unlock()
			tokens += n
			if err != nil {
				failed++
			}
		})
	}
	wg.Wait()
	if failed > 0 {
		return loadgen.Report{}, fmt.Errorf("bench: %d direct streams failed", failed)
	}
	return loadgen.Report{Requests: streams, Completed: streams, Tokens: tokens, Elapsed: time.Since(start),
		TTFT: loadgen.Quantiles{P50: ttft.Quantile(0.5), P99: ttft.Quantile(0.99)}, Gap: loadgen.Quantiles{P50: gap.Quantile(0.5), P99: gap.Quantile(0.99)}}, nil
}

// directStream is stream i straight from a worker: the load package's
// request, as the frontend would send it.
func directStream(ctx context.Context, c *workerclient.Client, i int, ttft, gap *loadgen.Histogram) (int64, error) {
	sent := time.Now()
	s, err := c.Generate(ctx, &wire.Generate{RequestId: fmt.Sprintf("direct-%d", i), RequestEpoch: 1, Prompt: fmt.Sprintf("Load stream %d began when", i),
		MaxTokens: fleetTokens, Seed: uint64(1 + i), Temperature: 0.9, IgnoreEos: true})
	if err != nil {
		return 0, err
	}
	var n int64
	last := sent
	for {
		fr, err := s.Next()
		if err != nil {
			return n, err
		}
		if fr.Error != nil {
			return n, fmt.Errorf("direct stream %d: %s", i, fr.Error.Message)
		}
		if fr.FinishReason != "" {
			return n, nil
		}
		now := time.Now()
		if n == 0 {
			ttft.Add(now.Sub(sent))
		} else {
			gap.Add(now.Sub(last))
		}
		last = now
		n++
	}
}

func printRelay(direct loadgen.Report, h1, h2 relayFigures, streams int) {
	thr := func(rep loadgen.Report) float64 { return float64(rep.Tokens) / rep.Elapsed.Seconds() }
	perStream := func(r relayFigures) (heap, rss float64) {
		n := float64(streams) / fleetFrontends
		return (r.mem.open.inUse() - r.mem.base.inUse()) / n / 1024, (r.mem.open.rss - r.mem.base.rss) / n / 1024
	}
	row := func(measure, d, goal string, through func(r relayFigures) string) {
		fmt.Printf("| %s | %s | %s | %s | %s |\n", measure, d, through(h1), through(h2), goal)
	}
	fmt.Printf("| measure | direct from the workers | through %d frontends, HTTP/1.1 clients | through them, HTTP/2 clients | goal |\n|---|---|---|---|---|\n", fleetFrontends)
	row(fmt.Sprintf("tokens/s, %d streams of %d tokens started at %d/s (÷ direct)", streams, fleetTokens, fleetStartRate), fmt.Sprintf("%.0f", thr(direct)), "≥ 0.97×",
		func(r relayFigures) string {
			return fmt.Sprintf("%.0f (**%.3f×**)", thr(r.rep), thr(r.rep)/thr(direct))
		})
	row("time to first token p50 / p99 (added)", fmt.Sprintf("%v / %v", direct.TTFT.P50, direct.TTFT.P99), "",
		func(r relayFigures) string {
			return fmt.Sprintf("%v / %v (+%v / +%v)", r.rep.TTFT.P50, r.rep.TTFT.P99, r.rep.TTFT.P50-direct.TTFT.P50, r.rep.TTFT.P99-direct.TTFT.P99)
		})
	row("gap between tokens p50 / p99 (added)", fmt.Sprintf("%v / %v", direct.Gap.P50, direct.Gap.P99), "≤ +1 ms p99",
		func(r relayFigures) string {
			return fmt.Sprintf("%v / %v (+%v / +%v)", r.rep.Gap.P50, r.rep.Gap.P99, r.rep.Gap.P50-direct.Gap.P50, r.rep.Gap.P99-direct.Gap.P99)
		})
	row(fmt.Sprintf("frontend CPU per relayed token (all %d frontends)", fleetFrontends), "", "≤ 5 µs",
		func(r relayFigures) string { return cpuPer(r.used.ticks, r.used.tokens).String() })
	row("frontend memory per open stream (Go heap + stacks after GC; RSS)", "", "≤ 16 KiB",
		func(r relayFigures) string { h, rss := perStream(r); return fmt.Sprintf("%.1f KiB; %.1f KiB", h, rss) })
	row("streams open at once (peak)", "", "", func(r relayFigures) string { return fmt.Sprint(r.rep.PeakOpen) })
	row("streams served without a record (etcd slower than 1 s)", "", "0", func(r relayFigures) string { return fmt.Sprintf("%.0f", r.used.skipped) })
	fmt.Println()
}

// admission admits short requests at rate a second through one frontend
// with request records, then through one without.
func (f *fleet) admission(rate int, admitFor time.Duration) error {
	fmt.Printf("Admission: %d-token requests started at %d/s for %v through one frontend.\n\n", fleetAdmitToks, rate, admitFor)
	fmt.Printf("| frontend | started/s | completed | failed | CPU per admitted request | etcd writes per request | etcd db growth per request | served without a record |\n|---|---|---|---|---|---|---|---|\n")
	n := int(float64(rate) * admitFor.Seconds())
	var base time.Duration
	for _, fe := range []*localcluster.Frontend{f.noRecords, f.fes[0]} {
		rev0, db0, err := f.etcdState()
		if err != nil {
			return err
		}
		u0, err := f.usage(fe)
		if err != nil {
			return err
		}
		if path := os.Getenv("LIFELINE_BENCH_FLEET_ETCD_CPUPROFILE"); path != "" && fe != f.noRecords {
			// This process's profile (etcd runs in it) while records are written.
			if pf, err := os.Create(path); err == nil {
				pprof.StartCPUProfile(pf)
				defer pf.Close()
				defer pprof.StopCPUProfile()
			}
		}
		var prof sync.WaitGroup
		if prefix := os.Getenv("LIFELINE_BENCH_FLEET_ADMIT_CPUPROFILE"); prefix != "" {
			// The admitting frontend's profile from 0.5 s in, for all
			// but the last second of the admissions:
			// prefix-records-on.pb.gz and prefix-records-off.pb.gz.
			path := prefix + "-records-on.pb.gz"
			if fe == f.noRecords {
				path = prefix + "-records-off.pb.gz"
			}
			prof.Go(func() {
				time.Sleep(500 * time.Millisecond)
				(&streamsCluster{fe: fe}).saveProfile(path, fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(1, int(admitFor.Seconds())-1)))
			})
		}
		rep, err := loadgen.Run(context.Background(), loadgen.Config{URLs: []string{fe.URL}, Model: "synthetic-tiny", Requests: n, Rate: float64(rate), MaxTokens: fleetAdmitToks, Seed: 7})
		prof.Wait()
		if err != nil {
			return fmt.Errorf("bench: admission: %w", err)
		}
		time.Sleep(time.Second) // the completion records follow the streams' ends
		u1, err := f.usage(fe)
		if err != nil {
			return err
		}
		rev1, db1, err := f.etcdState()
		if err != nil {
			return err
		}
		name, per := "records off", cpuPer(u1.since(u0).ticks, float64(rep.Completed))
		ratio := ""
		if fe != f.noRecords {
			name, ratio = "records on", fmt.Sprintf(" (%.2f× records off)", float64(per)/float64(max(base, 1)))
		} else {
			base = per
		}
		fmt.Printf("| %s | %.0f | %d | %d | %v%s | %.2f | %.0f B | %.0f |\n", name, rep.StartRate, rep.Completed, rep.Failed, per, ratio,
			float64(rev1-rev0)/float64(max(rep.Completed, 1)), float64(db1-db0)/float64(max(rep.Completed, 1)), u1.since(u0).skipped)
		if rep.Failed > 0 {
			fmt.Fprintf(os.Stderr, "bench: admission (%s): the first failure: %s\n", name, rep.FirstError)
		}
	}
	fmt.Println()
	return nil
}

// etcdState is etcd's revision (every write bumps it) and its database
// size.
func (f *fleet) etcdState() (rev, db int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := f.env.Client.Get(ctx, "/lifeline/v1/bench-revision")
	if err != nil {
		return 0, 0, fmt.Errorf("bench: etcd revision: %w", err)
	}
	st, err := f.env.Client.Status(ctx, f.env.Client.Endpoints()[0])
	if err != nil {
		return 0, 0, fmt.Errorf("bench: etcd status: %w", err)
	}
	return resp.Header.Revision, st.DbSize, nil
}
