package agent

import (
	"context"
	"fmt"
	"sync"
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
	// unanswered is how many running workers did not answer: what they
	// serve is unknown, not nothing.
	unanswered int
}

// idle: every running worker answered, and none serves a request.
func (l load) idle() bool { return l.inFlight == 0 && l.unanswered == 0 }

func newLoad() load {
	return load{started: map[string]uint64{}, moved: map[string]uint64{}, finished: map[string]uint64{}}
}

// add counts what one instance's worker reported.
func (l *load) add(id string, h *wire.HealthReply) {
	l.inFlight += int(h.InFlight)
	l.started[id] = h.RequestsStarted
	l.moved[id], l.finished[id] = h.DrainMovedEarly, h.DrainFinishedInPlace
}

// eachRunning calls fn for every running instance, all at once, and
// waits for every call: a worker slow to answer (stopped, starved of CPU,
// hung until the call's timeout) holds up what a drain tells no other.
func (a *Agent) eachRunning(fn func(inst *instance)) {
	var wg sync.WaitGroup
	for _, inst := range a.running() {
		wg.Go(func() { fn(inst) })
	}
	wg.Wait()
}

// drainLoad asks every running worker what it serves. A worker that does
// not answer is counted unanswered: a drain waits for it (until its
// deadline) as for one that serves requests, since a worker slow to
// answer (starved of CPU, stalled in a long step) may well stream still.
func (a *Agent) drainLoad(ctx context.Context) load {
	l := newLoad()
	var mu sync.Mutex
	a.eachRunning(func(inst *instance) {
		h, err := a.health(ctx, inst)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			l.unanswered++
			return
		}
		l.add(inst.id, h)
	})
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

// endRequests tells an instance's worker to end the requests it serves
// with a retryable DRAINING error: the drain's deadline passed.
func (a *Agent) endRequests(ctx context.Context, inst *instance) error {
	_, err := a.callWorker(ctx, inst, func(ctx context.Context, c *workerclient.Client, cur uint64) (*wire.HealthReply, error) {
		return c.AdminWith(ctx, &wire.Admin{InstanceId: inst.id, CurrentGeneration: cur, Draining: true, EndInFlight: true})
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
// within the deadline) — what they route meanwhile is still served.
// Then each worker, on its own (refuseAndDecide), makes the requests it
// started so far the baseline, and gets the drain's deadline: it refuses
// new requests with a retryable DRAINING error and decides for those in
// flight. Requests the workers started after the baseline are counted:
// routed after not-ready, 0 when frontends keep their word. It returns
// the baseline, whose drain decisions finishInFlight counts from.
func (a *Agent) settle(ctx context.Context, d *drain) (base load) {
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
	a.mu.Lock()
	d.Frontends, d.FrontendsAcked, d.AllAcked, d.AckWait = k.frontends, k.acked, k.all, k.took
	a.mu.Unlock()
	a.drainEvent(d, k.String())
	acked, refused := a.refuseAndDecide(ctx, d)
	a.mu.Lock()
	routed := 0
	for id, n := range refused.started {
		if before, ok := acked.started[id]; ok && n > before {
			routed += int(n - before)
		}
	}
	d.RoutedAfterNotReady, d.InFlight, d.Phase = routed, refused.inFlight, controlapi.DrainInFlight
	a.mu.Unlock()
	a.metrics.drainRoutedAfterNotReady.Add(float64(routed))
	a.drainEvent(d, fmt.Sprintf("new requests refused; %d routed here after the acknowledgement; %d in flight", routed, refused.inFlight))
	return acked
}

// refuseAndDecide takes every running worker, each on its own, through
// the two calls that end its part in routing: what it has started
// (acked), then the drain's deadline (refused: its answer). Told the
// deadline, a worker refuses new requests and decides per request in
// flight whether it finishes before the deadline at its step time (it
// stays) or not (it ends now with a retryable DRAINING error and the
// frontend migrates it, pulling its KV from this node while it is still
// up). A worker slow to answer delays its own decisions, not another's:
// requests that fit the deadline on a prompt worker are not left to run
// out the clock while the drain waits on a stalled one.
func (a *Agent) refuseAndDecide(ctx context.Context, d *drain) (acked, refused load) {
	acked, refused = newLoad(), newLoad()
	var mu sync.Mutex
	a.eachRunning(func(inst *instance) {
		if h, err := a.health(ctx, inst); err == nil {
			mu.Lock()
			acked.add(inst.id, h)
			mu.Unlock()
		}
		a.mu.Lock()
		inst.refusing = true
		a.mu.Unlock()
		if h := a.tellDeadline(ctx, d, inst); h != nil {
			mu.Lock()
			refused.add(inst.id, h)
			mu.Unlock()
		}
	})
	return acked, refused
}

// tellDeadline tells inst's worker the node drains (it refuses new
// requests) and gives it the drain's deadline, at which it decides per
// request in flight; its answer is what it serves once it decided. A
// worker that did not answer (nil) is told again at each poll of
// finishInFlight (retellDeadlines) until it does.
func (a *Agent) tellDeadline(ctx context.Context, d *drain, inst *instance) *wire.HealthReply {
	a.mu.Lock()
	deadline := d.Deadline.UnixMilli()
	a.mu.Unlock()
	h, err := a.callWorker(ctx, inst, func(ctx context.Context, c *workerclient.Client, cur uint64) (*wire.HealthReply, error) {
		return c.AdminWith(ctx, &wire.Admin{InstanceId: inst.id, CurrentGeneration: cur, Draining: true, DrainDeadlineUnixMs: deadline})
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		d.untold[inst.id] = true
		a.log.Warn("drain: cannot give the worker the deadline; telling it again at the next poll", "instance_id", inst.id, "err", err)
		return nil
	}
	delete(d.untold, inst.id)
	return h
}

// retellDeadlines gives the deadline again to the workers that did not
// answer when it was first told.
func (a *Agent) retellDeadlines(ctx context.Context, d *drain) {
	a.eachRunning(func(inst *instance) {
		a.mu.Lock()
		untold := d.untold[inst.id]
		a.mu.Unlock()
		if untold {
			a.tellDeadline(ctx, d, inst)
		}
	})
}

// Outcomes of the requests a drain finds in flight.
const (
	outcomeFinishedInPlace = "finished_in_place"
	outcomeMovedEarly      = "moved_early"
	outcomeEndedAtDeadline = "ended_at_deadline"
)

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

// finishInFlight is a drain's third step: the workers, given the
// deadline (refuseAndDecide), decided per request in flight: one that fits
// finishes here, a longer one moved at once; it counts those decisions
// since base and waits for the requests kept. Those left at the deadline
// are ended with a retryable DRAINING error (the frontend migrates them,
// pulling their KV from this node while it is still up).
func (a *Agent) finishInFlight(ctx context.Context, d *drain, base load) {
	l := a.drainLoad(ctx)
	a.recordOutcomes(d, base, l)
	a.mu.Lock()
	moved := d.MovedEarly
	a.mu.Unlock()
	a.drainEvent(d, fmt.Sprintf("deadline given to the workers: %d requests moved now (they cannot finish by it), %d finishing here", moved, l.inFlight))
	for {
		a.retellDeadlines(ctx, d)
		l = a.drainLoad(ctx)
		a.recordOutcomes(d, base, l)
		a.mu.Lock()
		d.InFlight = l.inFlight
		deadline := d.Deadline
		a.mu.Unlock()
		if l.idle() || ctx.Err() != nil {
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
	a.eachRunning(func(inst *instance) {
		if err := a.endRequests(ctx, inst); err != nil {
			a.log.Warn("drain: cannot end the requests in flight", "instance_id", inst.id, "err", err)
		}
	})
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
		if l.idle() || time.Now().After(until) || ctx.Err() != nil {
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
