package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
)

// runDetectionBench measures, for the eBPF and pidfd detectors, kill →
// agent event and kill → etcd key gone over repeated SIGKILLs of a real
// worker under a real agent, next to the lease-expiry path in the same run.
func runDetectionBench(kills int) error {
	fmt.Printf("## Failure detection (%d SIGKILLs of a worker per detector)\n\n", kills)
	if os.Geteuid() != 0 {
		fmt.Printf("skipped: not root (eBPF needs it)\n\n")
		return nil
	}
	env, err := buildEnv("lifeline-detect")
	if err != nil {
		return err
	}
	defer closeEnv(env)
	cli := env.Client

	fmt.Printf("| path | p50 | p99 | samples |\n|---|---|---|---|\n")
	for _, det := range []string{"ebpf", "pidfd"} {
		toEvent, toGone, err := killLoop(env, det, kills)
		if err != nil {
			return fmt.Errorf("%s: %w", det, err)
		}
		fmt.Printf("| %s: kill → agent event | %v | %v | %d |\n", det, pct(toEvent, 50), pct(toEvent, 99), len(toEvent))
		fmt.Printf("| %s: kill → etcd key gone (seen by a watcher) | %v | %v | %d |\n", det, pct(toGone, 50), pct(toGone, 99), len(toGone))
	}
	lease, err := leaseExpiry(cli, 5)
	if err != nil {
		return err
	}
	fmt.Printf("| lease expiry (TTL 2s): last keepalive → key gone | %v | %v | %d |\n\n", pct(lease, 50), pct(lease, 99), len(lease))
	return nil
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))].Round(10 * time.Microsecond)
}

func killLoop(env *localcluster.Env, det string, kills int) (toEvent, toGone []time.Duration, err error) {
	node := "bench-" + det
	o := env.NodeOptions(node, filepath.Join(env.Dir, node))
	o.ArenaSlots, o.Detector = 64, det
	o.CanaryIdle = agent.Duration(time.Hour)
	o.RestartBackoff, o.RestartMax = agent.Duration(10*time.Millisecond), agent.Duration(10*time.Millisecond)
	o.CrashLoopLimit, o.CrashLoopWindow = 1000, agent.Duration(time.Second)
	n := env.NewNode(o)
	logf, err := os.Create(filepath.Join(env.Dir, node+".log"))
	if err != nil {
		return nil, nil, err
	}
	defer logf.Close()
	n.Stderr = logf
	if err := n.Start(); err != nil {
		return nil, nil, err
	}
	defer n.RemoveArena()
	defer n.Stop(20 * time.Second)
	cli, ctx := env.Client, context.Background()
	id := node + "-decode-tiny-0"
	key := schema.InstancesPrefix + id
	var gen uint64
	reaped := 0
	defer func() {
		if reaped > 0 {
			fmt.Printf("| %s: deaths first reported by the reaper (Wait) instead | %d of %d | | |\n", det, reaped, kills)
		}
	}()
	for k := 0; k < kills; k++ {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		reg, err := env.WaitRegistration(wctx, id, gen)
		cancel()
		if err != nil {
			log, _ := os.ReadFile(logf.Name())
			return nil, nil, fmt.Errorf("%w; agent log:\n%s", err, log)
		}
		gen = reg.Generation
		ws, err := n.Workers(ctx)
		if err != nil || len(ws) != 1 || ws[0].Generation != gen {
			return nil, nil, fmt.Errorf("workers: %v %v", ws, err)
		}
		wctx, cancel = context.WithCancel(ctx)
		watch := cli.Watch(wctx, key, clientv3.WithRev(0))
		killed := time.Now()
		syscall.Kill(ws[0].PID, syscall.SIGKILL)
		gone := false
		deadline := time.After(10 * time.Second)
		for !gone {
			select {
			case wr, ok := <-watch:
				if !ok || wr.Err() != nil {
					cancel()
					return nil, nil, fmt.Errorf("the watch of %s ended: %v", key, wr.Err())
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						toGone = append(toGone, time.Since(killed))
						gone = true
					}
				}
			case <-deadline:
				cancel()
				return nil, nil, fmt.Errorf("key not deleted within 10s")
			}
		}
		cancel()
		// The event follows the deregistration by a few steps: poll for it.
		var evs []controlapi.Event
		for deadline := time.Now().Add(5 * time.Second); len(evs) == 0 && time.Now().Before(deadline); {
			all, err := n.Events(ctx)
			if err != nil {
				return nil, nil, err
			}
			for _, e := range all {
				if e.Kind == controlapi.EventExit && e.Generation == gen {
					evs = append(evs, e)
				}
			}
			if len(evs) == 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if len(evs) != 1 || (evs[0].Detector != det && evs[0].Detector != "wait") {
			return nil, nil, fmt.Errorf("exit events for generation %d: %+v", gen, evs)
		}
		if evs[0].Detector == "wait" {
			reaped++
		}
		toEvent = append(toEvent, evs[0].DetectedAt.Sub(killed))
	}
	return toEvent, toGone, nil
}

// leaseExpiry measures the path a detector replaces: a key under a 2 s
// lease whose holder stops renewing, as a watcher sees it go.
func leaseExpiry(cli *clientv3.Client, samples int) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < samples; i++ {
		ctx := context.Background()
		g, err := cli.Grant(ctx, 2)
		if err != nil {
			return nil, err
		}
		key := fmt.Sprintf("/lifeline/bench/lease-%d", i)
		if _, err := cli.Put(ctx, key, "x", clientv3.WithLease(g.ID)); err != nil {
			return nil, err
		}
		wctx, cancel := context.WithCancel(ctx)
		watch := cli.Watch(wctx, key)
		if _, err := cli.KeepAliveOnce(ctx, g.ID); err != nil {
			cancel()
			return nil, err
		}
		last := time.Now()
		deadline := time.After(30 * time.Second)
		for done := false; !done; {
			select {
			case wr, ok := <-watch:
				if !ok || wr.Err() != nil {
					cancel()
					return nil, fmt.Errorf("the watch ended: %v", wr.Err())
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						out = append(out, time.Since(last))
						done = true
					}
				}
			case <-deadline:
				cancel()
				return nil, fmt.Errorf("lease never expired")
			}
		}
		cancel()
	}
	return out, nil
}
