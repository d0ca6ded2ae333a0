package drill

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// tpShape is two nodes, each with one decode instance that is a
// tensor-parallel group of two ranks: a stream on one group migrates to
// the other, of the same layout and numerics.
var tpShape = Shape{Nodes: 2, DecodePerNode: 1, Frontends: 1, TP: 2}

func init() {
	Register(Drill{Number: 5, Name: seedNames[5][0], Expect: seedNames[5][1], Shape: tpShape,
		LocalOnly: "the groups are those of the cluster it starts (tp 2 per decode instance)", Run: runRankKill})
}

// RankExitTarget bounds how soon the surviving ranks of a group are gone
// after one rank's death (their collectives return at once when the agent
// aborts the group; then they exit).
const RankExitTarget = time.Second

// runRankKill SIGKILLs rank 1 of the group serving stream 0 once a
// quarter of its tokens reached the client, while every stream runs. The
// whole group must leave routing (its one registration gone), its
// surviving rank be gone within RankExitTarget (no collective hangs), the
// streams it served migrate to the other group and end bit-identical to
// their references with no gap or duplicate, and the group come back at
// a higher generation with every rank a new process.
func runRankKill(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: cfg.MaxTokens, Seed: cfg.Seed, Tag: "5"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	// Watched from the kill on, while the load runs.
	var (
		survivorsGone, deregAt, removedAt time.Time
		rmErr                             error
		wg                                sync.WaitGroup
	)
	kill := killRankOnToken(ctx, c, l, r, 0, max(cfg.MaxTokens/4, 1), 1, func(k Kill) {
		wg.Add(2)
		go func() {
			defer wg.Done()
			survivorsGone = waitGone(ctx, otherRanks(k), 10*time.Second)
		}()
		go func() {
			defer wg.Done()
			deregAt, removedAt, rmErr = c.Removed(ctx, k, 10*time.Second)
		}()
	})
	r.Event(time.Now(), EvLoadStart, "%d streams × %d tokens", cfg.Streams, cfg.MaxTokens)
	streams := l.Run(ctx)
	r.Event(time.Now(), EvLoadEnd, "")
	k, err := kill()
	if err != nil {
		return err
	}
	wg.Wait()
	if !survivorsGone.IsZero() {
		r.Event(survivorsGone, EvRemoved, "every other rank of %s generation %d gone", k.InstanceID, k.Generation)
	}
	if rmErr != nil {
		return rmErr
	}
	r.Event(deregAt, EvRemoved, "%s generation %d deregistered (one registration for the group)", k.InstanceID, k.Generation)
	r.Event(removedAt, EvRemoved, "every frontend's routing view without it")
	if ev, err := c.Detected(ctx, k, 10*time.Second); err == nil {
		r.Event(ev.DetectedAt, EvDetected, "rank 1's exit seen by the agent (%s)", ev.Detector)
		r.Figure("detection_ms", ms(ev.DetectedAt.Sub(k.At)))
	}
	back, err := c.WaitBack(ctx, k.InstanceID, k.Generation, time.Minute)
	if err != nil {
		return err
	}
	backAt := time.Now()
	r.Event(backAt, EvRecovered, "%s ready again at generation %d, %d ranks", back.InstanceID, back.Generation, len(back.Ranks))
	rto, lost := Recoveries(streams, k.InstanceID, k.At)
	r.Sample("rto_ms", rto...)
	Latencies(r, streams)
	o := l.Compare(streams)
	figuresOf(r, o)
	r.Figure("tp", float64(k.TP))
	r.Figure("migrated_streams", float64(len(rto)))
	r.Figure("lost_streams", float64(lost))
	r.Figure("rto_p50_ms", Percentile(rto, 50))
	r.Figure("rto_p99_ms", Percentile(rto, 99))
	r.Figure("deregistered_ms", ms(deregAt.Sub(k.At)))
	r.Figure("removed_ms", ms(removedAt.Sub(k.At)))
	r.Figure("survivors_gone_ms", ms(survivorsGone.Sub(k.At)))
	r.Figure("group_back_ms", ms(backAt.Sub(k.At)))
	fresh := allNew(back, k)
	var ck Check
	ck.That(k.TP > 1 && len(k.Ranks) == k.TP, "%s is not a tensor-parallel group (%d ranks listed)", k.InstanceID, len(k.Ranks))
	ck.That(len(rto) > 0, "no stream was on the killed group when its rank died")
	ck.That(!survivorsGone.IsZero() && survivorsGone.Sub(k.At) <= RankExitTarget, "the other ranks were gone %.0f ms after the kill (target %v)", ms(survivorsGone.Sub(k.At)), RankExitTarget)
	ck.That(fresh, "back at generation %d with ranks %+v (before %+v): not all new processes", back.Generation, back.Ranks, k.Ranks)
	ck.That(o.Failed == 0 && lost == 0, "%d streams failed (%v), %d lost", o.Failed, o.FirstError, lost)
	ck.That(o.Gaps == 0 && o.Duplicates == 0, "%d gaps, %d duplicates", o.Gaps, o.Duplicates)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.Verdict(r, fmt.Sprintf("rank 1 of %s killed: its other rank gone in %.0f ms, the group out of routing in %.0f ms; %d streams moved (RTO p99 %.0f ms), all %d bit-identical; back at generation %d with new ranks",
		k.InstanceID, ms(survivorsGone.Sub(k.At)), ms(removedAt.Sub(k.At)), len(rto), Percentile(rto, 99), o.Streams, back.Generation))
	return nil
}

// killRankOnToken is KillOnToken for rank of the group serving stream;
// after is called with the kill, at once.
func killRankOnToken(ctx context.Context, c *Cluster, l *Load, r *Recorder, stream, seq, rank int, after func(Kill)) func() (Kill, error) {
	return killOnToken(l, r, stream, seq, func(instance string) (Kill, error) { return c.KillRank(ctx, instance, rank) },
		func(k Kill) string {
			return fmt.Sprintf("SIGKILL rank %d of %s (pid %d, generation %d)", rank, k.InstanceID, k.Ranks[rank].PID, k.Generation)
		}, after)
}

// KillRank SIGKILLs rank of instance's tensor-parallel group.
func (c *Cluster) KillRank(ctx context.Context, instance string, rank int) (Kill, error) {
	ws, err := c.Workers(ctx)
	if err != nil {
		return Kill{}, err
	}
	for _, w := range ws {
		if w.InstanceID != instance {
			continue
		}
		if rank >= len(w.Ranks) {
			return Kill{}, fmt.Errorf("drill: %s lists %d ranks, no rank %d", instance, len(w.Ranks), rank)
		}
		var rev int64
		if c.Etcd != nil {
			resp, err := c.Etcd.Get(ctx, schema.InstancesPrefix+instance)
			if err != nil {
				return Kill{}, fmt.Errorf("drill: etcd: %w", err)
			}
			rev = resp.Header.Revision
		}
		at := time.Now()
		if err := syscall.Kill(w.Ranks[rank].PID, syscall.SIGKILL); err != nil {
			return Kill{}, fmt.Errorf("drill: kill rank %d of %s (pid %d): %w", rank, instance, w.Ranks[rank].PID, err)
		}
		return Kill{Worker: w, At: at, Rev: rev}, nil
	}
	return Kill{}, fmt.Errorf("drill: no agent runs %s", instance)
}

// allNew says whether back's ranks are all new processes, as many as k's.
func allNew(back Worker, k Kill) bool {
	fresh := len(back.Ranks) == k.TP
	for _, nr := range back.Ranks {
		for _, or := range k.Ranks {
			fresh = fresh && nr.PID != or.PID
		}
	}
	return fresh
}

// otherRanks are the pids of k's group but the killed rank 1's.
func otherRanks(k Kill) []int {
	var pids []int
	for _, r := range k.Ranks {
		if r.Rank != 1 {
			pids = append(pids, r.PID)
		}
	}
	return pids
}

// waitGone polls until no process of pids runs (zombies count as gone)
// and says when; zero if some still ran after timeout.
func waitGone(ctx context.Context, pids []int, timeout time.Duration) time.Time {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		running := false
		for _, pid := range pids {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if f := strings.Fields(string(b)); err == nil && len(f) > 2 && f[2] != "Z" {
				running = true
			}
		}
		if !running {
			return time.Now()
		}
		time.Sleep(time.Millisecond)
	}
	return time.Time{}
}
