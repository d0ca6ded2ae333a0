package drill

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// kvOwnerShape is drill 7's cluster: one node whose decode worker
// prefills its prompts itself against the node's arena, and an etcd
// lease long enough that pausing the arena's owner (the agent) does not
// also take the node out of routing (that is drill 6).
var kvOwnerShape = Shape{Nodes: 1, DecodePerNode: 1, Frontends: 1, LeaseTTL: 10 * time.Second}

// KVOwnerPause is how long drill 7 may hold the owner paused at most:
// well inside kvOwnerShape's lease.
const KVOwnerPause = 6 * time.Second

func init() {
	Register(Drill{Number: 7, Name: seedNames[7][0], Expect: seedNames[7][1], Shape: kvOwnerShape,
		LocalOnly: "the pause must stay inside the node's lease, which the drill sets on the cluster it starts",
		Run:       runPauseKVOwner})
}

// runPauseKVOwner runs streams of long prompts three times: fault-free
// (their prompts' blocks are published in the arena, and a second run
// reuses them: the cache works), with the agent that owns the arena's
// manifests paused (SIGSTOP), and after it resumed. While it is paused a
// worker cannot have a block verified and leased, so the cache must
// degrade to a miss: every stream completes, bit-identical, with its
// prompt computed (no position reused), within the pause. Afterwards the
// blocks are reused again, still bit-identical, and the owner counted no
// checksum failure, dropped no corrupt block, and holds no slot or lease
// for a request.
func runPauseKVOwner(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: min(max(cfg.MaxTokens/4, 4), 16), PromptWords: 200, Seed: cfg.Seed, Tag: "7"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	base, err := holding(ctx, c)
	if err != nil {
		return err
	}
	run := func(phase string) ([]*Stream, Outcome, int) {
		start := time.Now()
		r.Event(start, EvLoadStart, "%s: %d streams of ~200-word prompts", phase, l.Spec().Streams)
		streams := l.Run(ctx)
		r.Event(time.Now(), EvLoadEnd, "%s", phase)
		reused := 0
		for _, s := range streams {
			reused += s.Result.KVReusedPositions
		}
		return streams, l.Compare(streams), reused
	}
	_, warm, reusedWarm := run("cache warm")
	socket := c.Sockets[0]
	f, err := c.FreezeAgent(ctx, socket)
	if err != nil {
		return err
	}
	defer f.Thaw()
	r.Event(f.At, EvFault, "SIGSTOP the KV owner (agent of %s, pid %d)", f.Node, f.PID)
	pausedStreams, paused, reusedPaused := run("owner paused")
	pausedFor := time.Since(f.At)
	stillStopped, state := f.Stopped()
	thawAt, err := f.Thaw()
	if err != nil {
		return err
	}
	r.Event(thawAt, EvRecovered, "SIGCONT the KV owner after %.0f ms", ms(thawAt.Sub(f.At)))
	Latencies(r, pausedStreams)
	// The owner answers again: the worker reconnects at the next reuse.
	again, reusedAgain := Outcome{}, 0
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, again, reusedAgain = run("owner back")
		if reusedAgain > 0 || time.Now().After(deadline) {
			break
		}
	}
	left, err := waitNoOrphans(ctx, c, 15*time.Second)
	if err != nil {
		return err
	}
	checksum, corrupt, err := c.arenaFaults(ctx)
	if err != nil {
		return err
	}
	all := sumOutcomes(warm, paused, again)
	figuresOf(r, all)
	r.Figure("reused_positions_warm", float64(reusedWarm))
	r.Figure("reused_positions_paused", float64(reusedPaused))
	r.Figure("reused_positions_after", float64(reusedAgain))
	r.Figure("paused_ms", ms(pausedFor))
	r.Figure("checksum_failures", checksum)
	r.Figure("corrupt_dropped", corrupt)
	r.Figure("leaked_slots", float64(left.over(base).slots))
	r.Figure("leaked_leases", float64(left.over(base).leases))
	var ck Check
	ck.That(reusedWarm > 0, "the warm run reused no position: the cache was never hit")
	ck.That(stillStopped, "the owner did not stay stopped through the paused run (%s): something resumed it", state)
	ck.That(reusedPaused == 0, "%d positions reused while the owner was paused (no block can be verified then): %s", reusedPaused, reusers(pausedStreams, f.At))
	ck.That(pausedFor < KVOwnerPause, "the streams took %v with the owner paused (bound %v)", pausedFor.Round(time.Millisecond), KVOwnerPause)
	ck.That(reusedAgain > 0, "no position reused after the owner resumed")
	ck.That(all.Failed == 0, "%d streams failed (%v)", all.Failed, all.FirstError)
	ck.That(all.Gaps == 0 && all.Duplicates == 0, "%d gaps, %d duplicates", all.Gaps, all.Duplicates)
	ck.That(all.Identical == all.Streams, "%d of %d streams bit-identical", all.Identical, all.Streams)
	ck.That(checksum == 0 && corrupt == 0, "the owner counted %v checksum failures, dropped %v corrupt blocks", checksum, corrupt)
	ck.That(left.over(base) == (leaks{}), "the node holds %+v after the drill (before: %+v); leases by session: %s", left, base, leaseHolders(ctx, c))
	ck.Verdict(r, fmt.Sprintf("owner paused %.0f ms: %d streams served as cache misses, bit-identical; %d positions reused before, %d after",
		ms(pausedFor), paused.Streams, reusedWarm, reusedAgain))
	return nil
}

// arenaFaults sums the owners' checksum failures and corrupt blocks
// dropped.
func (c *Cluster) arenaFaults(ctx context.Context) (checksum, corrupt float64, err error) {
	sts, err := c.Statuses(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, st := range sts {
		v, _ := st.Arena["checksum_failures"].(float64)
		w, _ := st.Arena["corrupt_dropped"].(float64)
		checksum, corrupt = checksum+v, corrupt+w
	}
	return checksum, corrupt, nil
}

// sumOutcomes adds outcomes' counts up.
func sumOutcomes(os ...Outcome) Outcome {
	var all Outcome
	for _, o := range os {
		all.Streams, all.Failed, all.Identical = all.Streams+o.Streams, all.Failed+o.Failed, all.Identical+o.Identical
		all.Gaps, all.Duplicates, all.Migrations = all.Gaps+o.Gaps, all.Duplicates+o.Duplicates, all.Migrations+o.Migrations
		if all.FirstError == nil {
			all.FirstError = o.FirstError
		}
	}
	return all
}

// reusers names the streams that reused positions, with their request
// ids and when they started after at.
func reusers(streams []*Stream, at time.Time) string {
	var out []string
	for _, s := range streams {
		if s.Result.KVReusedPositions > 0 {
			out = append(out, fmt.Sprintf("stream %d (%s, started %.0f ms after the SIGSTOP): %d",
				s.Index, s.Result.RequestID, ms(s.Started.Sub(at)), s.Result.KVReusedPositions))
		}
	}
	return strings.Join(out, "; ")
}
