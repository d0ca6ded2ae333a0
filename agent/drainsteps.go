package agent

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/kv"
)

// drainPoll is how often a drain looks at what its workers still serve.
const drainPoll = 200 * time.Millisecond

// load is what a node's workers serve: the requests in flight, and the
// count of requests each instance has started; and, per instance, its
// drain decisions so far: requests moved early, requests kept that
// finished here.
type load struct {
	inFlight        int
	started         map[string]uint64
	moved, finished map[string]uint64
}

// drainLoad asks every running worker what it serves. A worker that does
// not answer counts as serving nothing: it is stopped with the others.
func (a *Agent) drainLoad(ctx context.Context) load {
	l := load{started: map[string]uint64{}, moved: map[string]uint64{}, finished: map[string]uint64{}}
	for _, inst := range a.running() {
		if h, err := a.health(ctx, inst); err == nil {
			l.inFlight += int(h.InFlight)
			l.started[inst.id] = h.RequestsStarted
			l.moved[inst.id], l.finished[inst.id] = h.DrainMovedEarly, h.DrainFinishedInPlace
		}
	}
	return l
}

// outcomesSince sums the drain decisions the workers made since base.
func (l load) outcomesSince(base load) (moved, finished int) {
	since := func(now, then map[string]uint64) (n int) {
		for id, v := range now {
			if b := then[id]; v > b {
				n += int(v - b)
			}
		}
		return n
	}
	return since(l.moved, base.moved), since(l.finished, base.finished)
}

// adminDrain tells an instance's worker that the node drains: it refuses
// new requests (DRAINING), and with end, ends those in flight.
func (a *Agent) adminDrain(ctx context.Context, inst *instance, end bool) error {
	_, err := a.callWorker(ctx, inst, func(ctx context.Context, c *workerclient.Client, cur uint64) (*wire.HealthReply, error) {
		return c.AdminWith(ctx, &wire.Admin{InstanceId: inst.id, CurrentGeneration: cur, Draining: true, EndInFlight: end})
	})
	return err
}

// enterNotReady is a drain's first step: every instance becomes not
// ready; those that were ready stay registered, marked draining, so that
// frontends route nothing new to them while their streams go on.
func (a *Agent) enterNotReady(ctx context.Context, d *drain) {
	a.mu.Lock()
	d.Phase = controlapi.DrainNotReady
	registered := 0
	for _, inst := range a.instances {
		inst.drainRegistered = inst.ready && inst.pid != 0
		inst.draining, inst.ready, inst.notReady = true, false, "draining"
		if inst.drainRegistered {
			registered++
		}
	}
	a.mu.Unlock()
	a.registerAll(ctx)
	l := a.drainLoad(ctx)
	a.mu.Lock()
	d.ActiveAtStart, d.InFlight, d.started = l.inFlight, l.inFlight, l.started
	a.mu.Unlock()
	a.metrics.drainActive.WithLabelValues("start").Set(float64(l.inFlight))
	a.drainEvent(d, fmt.Sprintf("%d registrations marked draining; %d requests in flight", registered, l.inFlight))
}

// settle is a drain's second step: it waits until every live frontend
// has acknowledged the draining registrations (at most DrainSettle,
// within the deadline) — what they route meanwhile is still served —
// then makes the workers refuse new requests with a retryable DRAINING
// error. Requests the workers started after the acknowledgement (or the
// bound) are counted: routed after not-ready, 0 when frontends keep their
// word.
func (a *Agent) settle(ctx context.Context, d *drain) {
	a.mu.Lock()
	registered := false
	for _, inst := range a.instances {
		registered = registered || inst.drainRegistered
	}
	wait := min(time.Duration(a.opts.DrainSettle), time.Until(d.Deadline))
	a.mu.Unlock()
	k := acks{all: true}
	if registered && wait > 0 {
		k = a.settleWait(ctx, wait)
	}
	acked := a.drainLoad(ctx)
	a.mu.Lock()
	d.Frontends, d.FrontendsAcked, d.AllAcked, d.AckWait = k.frontends, k.acked, k.all, k.took
	a.mu.Unlock()
	a.drainEvent(d, k.String())
	for _, inst := range a.running() {
		a.mu.Lock()
		inst.refusing = true
		a.mu.Unlock()
		if err := a.adminDrain(ctx, inst, false); err != nil {
			a.log.Warn("drain: cannot tell the worker", "instance_id", inst.id, "err", err)
		}
	}
	l := a.drainLoad(ctx)
	a.mu.Lock()
	routed := 0
	for id, n := range l.started {
		if before, ok := acked.started[id]; ok && n > before {
			routed += int(n - before)
		}
	}
	d.RoutedAfterNotReady, d.InFlight, d.Phase = routed, l.inFlight, controlapi.DrainInFlight
	a.mu.Unlock()
	a.metrics.drainRoutedAfterNotReady.Add(float64(routed))
	a.drainEvent(d, fmt.Sprintf("new requests refused; %d routed here after the acknowledgement; %d in flight", routed, l.inFlight))
}

// Outcomes of the requests a drain finds in flight.
const (
	outcomeFinishedInPlace = "finished_in_place"
	outcomeMovedEarly      = "moved_early"
	outcomeEndedAtDeadline = "ended_at_deadline"
)

// tellDeadline gives every worker the drain's deadline: each decides per
// request in flight whether it finishes before the deadline at the
// worker's step time (it stays) or not (it ends now with a retryable
// DRAINING error and the frontend migrates it, pulling its KV from this
// node while it is still up).
func (a *Agent) tellDeadline(ctx context.Context, d *drain) {
	a.mu.Lock()
	deadline := d.Deadline.UnixMilli()
	a.mu.Unlock()
	for _, inst := range a.running() {
		_, err := a.callWorker(ctx, inst, func(ctx context.Context, c *workerclient.Client, cur uint64) (*wire.HealthReply, error) {
			return c.AdminWith(ctx, &wire.Admin{InstanceId: inst.id, CurrentGeneration: cur, Draining: true, DrainDeadlineUnixMs: deadline})
		})
		if err != nil {
			a.log.Warn("drain: cannot give the worker the deadline", "instance_id", inst.id, "err", err)
		}
	}
}

// recordOutcomes brings the drain's counters (and metrics) up to the
// workers' decisions since base.
func (a *Agent) recordOutcomes(d *drain, base, l load) {
	moved, finished := l.outcomesSince(base)
	a.mu.Lock()
	dm, df := max(0, moved-d.MovedEarly), max(0, finished-d.FinishedInPlace)
	d.MovedEarly += dm
	d.FinishedInPlace += df
	d.ForcedEnded = d.MovedEarly + d.EndedAtDeadline
	a.mu.Unlock()
	a.metrics.drainForced.Add(float64(dm))
	a.metrics.drainOutcomes.WithLabelValues(outcomeMovedEarly).Add(float64(dm))
	a.metrics.drainOutcomes.WithLabelValues(outcomeFinishedInPlace).Add(float64(df))
}

// forcedEndWait bounds how long a drain waits for the requests it ended
// at the deadline to be gone before it stops the workers.
const forcedEndWait = 5 * time.Second

// finishInFlight is a drain's third step: the workers get the deadline
// and decide per request in flight (tellDeadline): one that fits finishes
// here, a longer one moves now. Those left at the deadline are ended with
// a retryable DRAINING error (the frontend migrates them, pulling their
// KV from this node while it is still up).
func (a *Agent) finishInFlight(ctx context.Context, d *drain) {
	base := a.drainLoad(ctx)
	a.tellDeadline(ctx, d)
	l := a.drainLoad(ctx)
	a.recordOutcomes(d, base, l)
	a.mu.Lock()
	moved := d.MovedEarly
	a.mu.Unlock()
	a.drainEvent(d, fmt.Sprintf("deadline given to the workers: %d requests moved now (they cannot finish by it), %d finishing here", moved, l.inFlight))
	for {
		l = a.drainLoad(ctx)
		a.recordOutcomes(d, base, l)
		a.mu.Lock()
		d.InFlight = l.inFlight
		deadline := d.Deadline
		a.mu.Unlock()
		if l.inFlight == 0 || ctx.Err() != nil {
			break
		}
		if time.Now().After(deadline) {
			l = a.endInFlight(ctx, d, l.inFlight)
			a.recordOutcomes(d, base, l)
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(drainPoll):
		}
	}
	a.metrics.drainActive.WithLabelValues("end").Set(float64(l.inFlight))
	a.mu.Lock()
	d.Phase, d.InFlight = controlapi.DrainStopping, l.inFlight
	summary := fmt.Sprintf("%d finished in place, %d moved early, %d ended at the deadline", d.FinishedInPlace, d.MovedEarly, d.EndedAtDeadline)
	a.mu.Unlock()
	a.drainEvent(d, fmt.Sprintf("%s; %d requests in flight; stopping the workers", summary, l.inFlight))
}

// endInFlight ends the n requests in flight at the deadline and waits a
// bounded time for them to be gone.
func (a *Agent) endInFlight(ctx context.Context, d *drain, n int) load {
	for _, inst := range a.running() {
		if err := a.adminDrain(ctx, inst, true); err != nil {
			a.log.Warn("drain: cannot end the requests in flight", "instance_id", inst.id, "err", err)
		}
	}
	a.mu.Lock()
	d.EndedAtDeadline += n
	d.ForcedEnded = d.MovedEarly + d.EndedAtDeadline
	until := minTime(time.Now().Add(forcedEndWait), d.HardDeadline.Add(-stopReserve))
	a.mu.Unlock()
	a.metrics.drainForced.Add(float64(n))
	a.metrics.drainOutcomes.WithLabelValues(outcomeEndedAtDeadline).Add(float64(n))
	a.drainEvent(d, fmt.Sprintf("deadline passed: %d requests ended (retryable, draining)", n))
	for {
		l := a.drainLoad(ctx)
		if l.inFlight == 0 || time.Now().After(until) || ctx.Err() != nil {
			return l
		}
		select {
		case <-ctx.Done():
		case <-time.After(drainPoll):
		}
	}
}

// stopReserve is the time before a drain's hard deadline kept for
// stopping the workers.
const stopReserve = 2 * time.Second

// stopInstances is a drain's last step: every instance's supervisor stops
// its worker (SIGTERM, then SIGKILL), its KV leases and unpublished
// blocks are released, and its registration goes. Workers still running
// a second before the hard deadline are killed.
func (a *Agent) stopInstances(d *drain) {
	a.mu.Lock()
	hard := d.HardDeadline
	var insts []*instance
	var dones []chan struct{}
	for _, inst := range a.instances {
		insts = append(insts, inst)
		if inst.stop != nil {
			inst.stop()
			dones = append(dones, inst.done)
		}
	}
	a.mu.Unlock()
	kill := time.NewTimer(time.Until(hard) - time.Second)
	defer kill.Stop()
	killed := false
	for _, done := range dones {
		select {
		case <-done:
		case <-kill.C:
			a.log.Error("drain: workers still running near the hard deadline", "recovery_action", "kill")
			a.killWorkers()
			killed = true
			<-done
		}
	}
	reclaimed := 0
	for _, inst := range insts {
		reclaimed += a.releaseInstance(inst)
	}
	a.registerAll(a.life)
	a.metrics.orphans.Add(float64(reclaimed))
	a.drainEvent(d, fmt.Sprintf("%d workers stopped (killed: %v); %d KV blocks reclaimed", len(insts), killed, reclaimed))
}

// releaseInstance forgets a worker a drain stopped, releases its KV
// leases and unpublished blocks, and returns how many blocks it reclaimed.
func (a *Agent) releaseInstance(inst *instance) int {
	a.mu.Lock()
	pid, kvGen := inst.pid, inst.kvGen
	delete(a.byPID, pid)
	inst.pid, inst.addr, inst.ready, inst.drainRegistered = 0, "", false, false
	inst.state, inst.notReady, inst.running, inst.queued = "drained", "drained", 0, 0
	a.mu.Unlock()
	if pid != 0 {
		a.detector.Unwatch(pid)
	}
	a.forgetWorker(inst.id)
	if kvGen == 0 {
		return 0
	}
	return a.kvOwner.WriterDead(kv.Writer{Instance: inst.id, Gen: kvGen})
}

// killWorkers SIGKILLs every worker: a drain past its hard deadline.
func (a *Agent) killWorkers() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, inst := range a.instances {
		if inst.pid != 0 {
			syscall.Kill(inst.pid, syscall.SIGKILL)
		}
	}
}

// startInstance starts inst's supervisor, which a drain can stop alone.
func (a *Agent) startInstance(inst *instance) {
	ctx, cancel := context.WithCancel(a.life)
	done := make(chan struct{})
	a.mu.Lock()
	inst.stop, inst.done = cancel, done
	a.mu.Unlock()
	a.track(func() {
		defer close(done)
		defer cancel()
		a.supervise(ctx, inst)
	})
}
