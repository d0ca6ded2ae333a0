package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
)

// runTPBench measures tensor parallelism on this machine: decode
// tokens/s of small at tp 2 (two ranks in this process, each its own
// goroutine and KV, the real shared-memory collective) ÷ tp 1; one
// layer's all-reduce at batch 1 against a memcpy of the same bytes; and,
// with an agent running a tp=2 tiny group, kills of rank 1: kill → every
// other rank gone (the agent's abort) and kill → the group ready again.
func runTPBench(kills int) error {
	fmt.Printf("# Tensor-parallel groups\n\n")
	m, err := model.Synthetic("small", 1)
	if err != nil {
		return err
	}
	const tokens = 64
	one, err := median3(func() (float64, error) { return decodeThroughput(m, 1, tokens) })
	if err != nil {
		return err
	}
	two, err := median3(func() (float64, error) { return tpDecodeThroughput(m, 2, tokens) })
	if err != nil {
		return err
	}
	fmt.Printf("| measure | tp 1 | tp 2 | tp 2 ÷ tp 1 |\n|---|---|---|---|\n")
	fmt.Printf("| decode tokens/s, small, batch 1 | %.0f | %.0f | %.2f× |\n\n", one, two, two/one)
	ar, cp, err := allReduceCost(m.Config.Dim, 20000)
	if err != nil {
		return err
	}
	fmt.Printf("| one all-reduce of a layer's output (batch 1: %d floats, %d B) | µs | ÷ memcpy |\n|---|---|---|\n", m.Config.Dim, 4*m.Config.Dim)
	fmt.Printf("| 2 ranks, shared memory, spin then futex | %.2f | %.0f× |\n| memcpy of the same bytes | %.3f | 1× |\n\n", ar, ar/cp, cp)
	abort, restart, err := groupKills(kills)
	if err != nil {
		return err
	}
	fmt.Printf("| rank 1 of a tp=2 tiny group SIGKILLed, %d times | p50 | p99 |\n|---|---|---|\n", kills)
	fmt.Printf("| kill → every other rank gone (abort) | %v | %v |\n", pct(abort, 50), pct(abort, 99))
	fmt.Printf("| kill → the group registered ready at the next generation | %v | %v |\n\n", pct(restart, 50).Round(time.Millisecond), pct(restart, 99).Round(time.Millisecond))
	return nil
}

// tpDecodeThroughput is decodeThroughput for a group of tp ranks of m in
// this process: rank 0's scheduler leads, the others follow on their own
// KV.
func tpDecodeThroughput(m *model.Model, tp, tokens int) (float64, error) {
	dir, err := os.MkdirTemp("", "lifeline-tp-bench")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	seg := filepath.Join(dir, "group")
	if err := collective.Create(seg, tp, 1, 512*m.Config.Dim); err != nil {
		return 0, err
	}
	groups := make([]*collective.Group, tp)
	shards := make([]*model.Model, tp)
	for r := range groups {
		if groups[r], err = collective.Open(seg, r, tp, 1); err != nil {
			return 0, err
		}
		defer groups[r].Close()
		if shards[r], err = m.Shard(r, tp, groups[r].AllReduce); err != nil {
			return 0, err
		}
	}
	done := make(chan error, tp)
	for r := 1; r < tp; r++ {
		go func() {
			store, err := kvcache.NewMemStore(shards[r].KVLayout(kvcache.DefaultBlockSize), 512)
			if err != nil {
				done <- err
				return
			}
			var ws model.Workspace
			done <- shards[r].Follow(&ws, store, func() ([]byte, error) { return groups[r].Broadcast(nil, true) })
		}()
	}
	lead := shards[0].Lead(func(in []model.Input) error {
		_, err := groups[0].Broadcast(model.EncodeInputs(in), false)
		return err
	})
	rate, err := decodeThroughput(lead, 1, tokens)
	groups[0].Abort()
	for r := 1; r < tp; r++ {
		<-done
	}
	return rate, err
}

// allReduceCost is the mean time of one all-reduce of n floats between 2
// ranks, and of a memcpy of the same bytes, in µs.
func allReduceCost(n, rounds int) (ar, cp float64, err error) {
	dir, err := os.MkdirTemp("", "lifeline-ar-bench")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	seg := filepath.Join(dir, "group")
	if err := collective.Create(seg, 2, 1, n); err != nil {
		return 0, 0, err
	}
	g0, err := collective.Open(seg, 0, 2, 1)
	if err != nil {
		return 0, 0, err
	}
	defer g0.Close()
	g1, err := collective.Open(seg, 1, 2, 1)
	if err != nil {
		return 0, 0, err
	}
	defer g1.Close()
	done := make(chan error, 1)
	go func() {
		buf := make([]float32, n)
		for i := 0; i < rounds; i++ {
			if err := g1.AllReduce(buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	buf := make([]float32, n)
	start := time.Now()
	for i := 0; i < rounds; i++ {
		if err := g0.AllReduce(buf); err != nil {
			return 0, 0, err
		}
	}
	ar = float64(time.Since(start).Microseconds()) / float64(rounds)
	if err := <-done; err != nil {
		return 0, 0, err
	}
	src, dst := make([]float32, n), make([]float32, n)
	const copies = 1000000
	start = time.Now()
	for i := 0; i < copies; i++ {
		copy(dst, src)
		src[i%n] = dst[(i+1)%n]
	}
	cp = float64(time.Since(start).Nanoseconds()) / copies / 1000
	return ar, cp, nil
}

// groupKills runs an agent with one tp=2 tiny group and SIGKILLs rank 1
// kills times: it returns kill → the other rank gone and kill →
// the group ready at the next generation.
func groupKills(kills int) (abort, restart []time.Duration, err error) {
	env, err := buildEnv("lifeline-tp-bench")
	if err != nil {
		return nil, nil, err
	}
	defer closeEnv(env)
	o := env.NodeOptions("t0", env.Dir+"/node")
	o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1, TP: 2}}
	o.CanaryIdle = agent.Duration(time.Hour)
	o.RestartBackoff, o.RestartMax = agent.Duration(20*time.Millisecond), agent.Duration(50*time.Millisecond)
	o.CrashLoopLimit = 1000
	n := env.NewNode(o)
	if err := n.Start(); err != nil {
		return nil, nil, err
	}
	defer func() { n.Stop(20 * time.Second); n.RemoveArena() }()
	const id = "t0-decode-tiny-tp2-0"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reg, err := env.WaitRegistration(ctx, id, 0)
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i < kills; i++ {
		ws, err := n.Workers(ctx)
		if err != nil {
			return nil, nil, err
		}
		i := slices.IndexFunc(ws, func(w controlapi.Worker) bool { return w.InstanceID == id })
		if i < 0 || len(ws[i].Ranks) != 2 {
			return nil, nil, fmt.Errorf("tp bench: %s not listed with 2 ranks: %+v", id, ws)
		}
		rank0, rank1 := ws[i].Ranks[0].PID, ws[i].Ranks[1].PID
		at := time.Now()
		if err := syscall.Kill(rank1, syscall.SIGKILL); err != nil {
			return nil, nil, err
		}
		for running(rank0) {
			if time.Since(at) > 10*time.Second {
				return nil, nil, fmt.Errorf("tp bench: rank 0 (pid %d) still runs 10 s after rank 1's kill", rank0)
			}
			time.Sleep(100 * time.Microsecond)
		}
		abort = append(abort, time.Since(at))
		if reg, err = env.WaitRegistration(ctx, id, reg.Generation); err != nil {
			return nil, nil, err
		}
		restart = append(restart, time.Since(at))
	}
	return abort, restart, nil
}

// running says whether pid runs (a zombie does not).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(string(b))
	return err == nil && len(f) > 2 && f[2] != "Z"
}
