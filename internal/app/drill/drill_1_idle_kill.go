package drill

import (
	"context"
	"fmt"
	"time"
)

func init() {
	Register(Drill{Number: 1, Name: seedNames[1][0], Expect: seedNames[1][1], Shape: Standard, Run: runIdleKill})
}

// RemovalTarget is how soon a dead worker must leave routing (kill →
// registration gone or not ready).
const RemovalTarget = 2 * time.Second

// runIdleKill SIGKILLs a decode worker that serves nothing, then runs
// streams at once until it is back at a new generation: it must leave
// routing within RemovalTarget, and no request started after that may
// reach it (a request sent to the dead worker would fail there and be
// moved: counted as a migration, or by the frontends as routed to a
// not-ready instance).
func runIdleKill(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	// The last node's: the first node's keeps serving.
	ws, err := c.decodeWorkersOf(ctx, c.Sockets[len(c.Sockets)-1])
	if err != nil {
		return err
	}
	victim := ws[len(ws)-1]
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: max(cfg.MaxTokens/4, 4), Seed: cfg.Seed, Tag: "1"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	before, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	k, err := c.KillWorker(ctx, victim.InstanceID)
	if err != nil {
		return err
	}
	r.Event(k.At, EvFault, "SIGKILL idle %s (pid %d, generation %d)", k.InstanceID, k.PID, k.Generation)
	stop := l.Steady(ctx)
	r.Event(time.Now(), EvLoadStart, "%d streams × %d tokens, each started again as it ends", cfg.Streams, l.Spec().MaxTokens)
	deregAt, removedAt, rerr := c.Removed(ctx, k, 10*time.Second)
	ev, derr := c.Detected(ctx, k, 10*time.Second)
	back, berr := c.WaitBack(ctx, k.InstanceID, k.Generation, time.Minute)
	backAt := time.Now()
	streams := stop()
	r.Event(time.Now(), EvLoadEnd, "")
	for _, err := range []error{rerr, derr, berr} {
		if err != nil {
			return err
		}
	}
	r.Event(ev.DetectedAt, EvDetected, "exit seen by the agent (%s)", ev.Detector)
	r.Event(deregAt, EvRemoved, "%s generation %d deregistered", k.InstanceID, k.Generation)
	r.Event(removedAt, EvRemoved, "every frontend's routing view without it")
	r.Event(backAt, EvRecovered, "%s ready again at generation %d", back.InstanceID, back.Generation)
	after, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	var later []*Stream
	reached := Delta(before, after, "lifeline_frontend_routed_to_not_ready_total")
	for _, s := range streams {
		if s.Started.After(removedAt) {
			later = append(later, s)
			reached += float64(s.Result.Migrations)
		}
	}
	o := l.Compare(streams)
	Latencies(r, streams)
	figuresOf(r, o)
	r.Figure("detection_ms", ms(ev.DetectedAt.Sub(k.At)))
	r.Figure("deregistered_ms", ms(deregAt.Sub(k.At)))
	r.Figure("removed_ms", ms(removedAt.Sub(k.At)))
	r.Figure("back_ms", ms(backAt.Sub(k.At)))
	r.Figure("streams_after_removal", float64(len(later)))
	r.Figure("reached_dead_worker", reached)
	var ck Check
	ck.That(removedAt.Sub(k.At) <= RemovalTarget, "removed from routing after %v (target %v)", removedAt.Sub(k.At).Round(time.Millisecond), RemovalTarget)
	ck.That(len(later) > 0, "no stream started after the removal")
	ck.That(reached == 0, "%v requests started after the removal reached the dead worker", reached)
	ck.That(o.Failed == 0, "%d streams failed (%v)", o.Failed, o.FirstError)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.Verdict(r, fmt.Sprintf("%s left routing %.1f ms after the kill (detected in %.1f ms); none of %d later streams reached it",
		k.InstanceID, ms(removedAt.Sub(k.At)), ms(ev.DetectedAt.Sub(k.At)), len(later)))
	return nil
}
