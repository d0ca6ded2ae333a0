package agent

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// Drain triggers.
const (
	triggerNodectl = "nodectl"
	triggerSIGTERM = "SIGTERM"
)

// drain is one drain of the node: nodectl's (the agent stays up with its
// instances stopped until undrain) or SIGTERM's (the agent exits after
// it). Its fields are guarded by Agent.mu.
type drain struct {
	controlapi.Drain
	// stay: the agent stays up once drained (nodectl), else it exits.
	stay bool
	// force: go on without the disruption budget (SIGTERM cannot wait).
	force bool
	// started is the counters of requests started on each instance when
	// it became not ready.
	started map[string]uint64
	// untold is the instances whose workers did not answer when given
	// the deadline: they are told again at each poll.
	untold map[string]bool
	cancel context.CancelFunc
	// finished is closed when the drain has stopped the workers or was
	// cancelled.
	finished chan struct{}
	// reclaimed is closed when a drain restored at start (the node was
	// drained before the agent restarted) stops retaking its share of the
	// disruption budget; nil for any other drain.
	reclaimed chan struct{}
}

// drainDeadlines parses a drain request's durations, with the given
// defaults.
func drainDeadlines(req controlapi.DrainRequest, defDeadline, defHard time.Duration) (deadline, hard time.Duration, err error) {
	deadline, hard = defDeadline, defHard
	parse := func(field, s string, into *time.Duration) error {
		if s == "" {
			return nil
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return &controlapi.Error{Code: controlapi.ErrBadRequest.Code, Message: fmt.Sprintf("%s: %q: want a positive duration like 60s", field, s)}
		}
		*into = d
		return nil
	}
	if err := parse("deadline", req.Deadline, &deadline); err != nil {
		return 0, 0, err
	}
	if err := parse("hard_deadline", req.HardDeadline, &hard); err != nil {
		return 0, 0, err
	}
	if req.HardDeadline == "" && hard <= deadline {
		hard = deadline + defHard - defDeadline
	}
	if hard <= deadline {
		return 0, 0, &controlapi.Error{Code: controlapi.ErrBadRequest.Code,
			Message: fmt.Sprintf("hard_deadline %v is not after deadline %v", hard, deadline)}
	}
	return deadline, hard, nil
}

// startDrain starts a drain of the node, or returns the one in progress
// (an undrain in progress is replaced). A SIGTERM drain joining one in
// progress forces it past the budget and tightens its deadlines to its
// own. budgetHeld says the caller took the budget already (no_wait).
func (a *Agent) startDrain(trigger string, deadline, hard time.Duration, budgetHeld bool) *drain {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if d := a.drain; d != nil && d.Phase != controlapi.DrainUndraining {
		if trigger == triggerSIGTERM {
			d.force, d.stay = true, false
			d.Deadline, d.HardDeadline = minTime(d.Deadline, now.Add(deadline)), minTime(d.HardDeadline, now.Add(hard))
		}
		return d
	}
	ctx, cancel := context.WithCancel(a.life)
	d := &drain{Drain: controlapi.Drain{Phase: controlapi.DrainWaitingForBudget, Trigger: trigger, StartedAt: now, Deadline: now.Add(deadline),
		HardDeadline: now.Add(hard), BudgetHeld: budgetHeld}, stay: trigger == triggerNodectl, force: trigger == triggerSIGTERM,
		started: map[string]uint64{}, untold: map[string]bool{}, cancel: cancel, finished: make(chan struct{})}
	if prev := a.drain; prev != nil {
		d.BudgetHeld = d.BudgetHeld || prev.BudgetHeld // an undraining node still holds its share
	}
	a.drain = d
	a.metrics.drains.WithLabelValues(trigger).Inc()
	a.track(func() { a.runDrain(ctx, d) })
	return d
}

// drainRunning is the age in seconds of the drain under way, 0 when
// none is (none begun, drained, or undrained).
func (a *Agent) drainRunning() float64 {
	a.mu.Lock()
	d := a.drain
	a.mu.Unlock()
	if d == nil {
		return 0
	}
	select {
	case <-d.finished:
		return 0
	default:
	}
	return time.Since(d.StartedAt).Seconds()
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// runDrain runs a drain's steps in order: the disruption budget, not
// ready (registrations marked draining), routing settles, requests in
// flight finish or are ended at the deadline, workers stopped.
func (a *Agent) runDrain(ctx context.Context, d *drain) {
	defer close(d.finished)
	defer d.cancel()
	sctx, span := a.trc().Start(ctx, "lifeline.drain", trace.WithTimestamp(d.StartedAt),
		trace.WithAttributes(a.nodeAttr(), attribute.String("trigger", d.Trigger)))
	drained := false
	defer func() {
		if !drained {
			endSpan(span, "cancelled")
		}
	}()
	var budget bool
	a.drainStep(sctx, "budget", func() { budget = a.awaitBudget(ctx, d) })
	if !budget {
		return
	}
	// Under the lock undrain checks the phase under: a drain undrain
	// cancelled while it waited for the budget never begins.
	a.mu.Lock()
	if a.drain != d || ctx.Err() != nil {
		a.mu.Unlock()
		return
	}
	d.Phase = controlapi.DrainNotReady
	a.mu.Unlock()
	began := time.Now()
	a.drainStep(sctx, "not_ready", func() { a.enterNotReady(ctx, d) })
	var base load
	a.drainStep(sctx, "settle", func() { base = a.settle(ctx, d) })
	a.drainStep(sctx, "in_flight", func() { a.finishInFlight(ctx, d, base) })
	a.drainStep(sctx, "stop", func() { a.stopInstances(d) })
	a.mu.Lock()
	d.Phase, d.DrainedAt, d.InFlight = controlapi.DrainDrained, time.Now(), 0
	forced, keep, snap := d.ForcedEnded, keepDrained(d.Drain, d.stay), d.Drain
	a.mu.Unlock()
	span.SetAttributes(attribute.Int("finished_in_place", snap.FinishedInPlace), attribute.Int("forced_ended", forced))
	span.End()
	drained = true
	if keep {
		if err := a.saveDrained(snap); err != nil {
			a.log.Warn("drain: an agent restart will not find the node drained", "err", err)
		}
	}
	a.metrics.drainDuration.Observe(time.Since(began).Seconds())
	a.drainEvent(d, fmt.Sprintf("drained in %v; %d requests ended by the deadline", time.Since(began).Round(time.Millisecond), forced))
}

// drainEvent records a drain's step.
func (a *Agent) drainEvent(d *drain, detail string) {
	a.mu.Lock()
	phase, trigger := d.Phase, d.Trigger
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventDrain, Reason: phase, Detail: detail})
	a.log.Info("drain", "phase", phase, "trigger", trigger, "detail", detail)
}

// awaitBudget takes a share of the disruption budget, waiting for one
// while other nodes hold it all. A forced drain (SIGTERM) tries once and
// goes on without. It reports false when the drain was cancelled.
func (a *Agent) awaitBudget(ctx context.Context, d *drain) bool {
	for logged := false; ; {
		a.mu.Lock()
		held, force := d.BudgetHeld, d.force
		a.mu.Unlock()
		if held {
			return true
		}
		ans, err := a.takeBudget(ctx, d.Trigger)
		a.mu.Lock()
		d.BudgetHeld = ans.taken
		switch {
		case ans.taken:
			d.Detail = ""
		case err != nil:
			d.Detail = "waiting for the disruption budget: " + err.Error()
		default:
			d.Detail = "waiting for the disruption budget: " + ans.String()
		}
		detail := d.Detail
		a.mu.Unlock()
		if ans.taken {
			return true
		}
		if force {
			a.log.Warn("drain without a share of the disruption budget: SIGTERM cannot wait", "detail", detail)
			return true
		}
		if !logged {
			a.drainEvent(d, detail)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// undrain starts a drained node's instances again, at new generations;
// its share of the disruption budget goes back once they are ready. A
// drain still waiting for the budget is cancelled.
func (a *Agent) undrain() (controlapi.Drain, error) {
	a.mu.Lock()
	d := a.drain
	switch {
	case d == nil || d.Phase == controlapi.DrainUndraining:
		a.mu.Unlock()
		return controlapi.Drain{}, &controlapi.Error{Code: controlapi.ErrNotDrained.Code, Message: fmt.Sprintf("node %s is not drained", a.opts.NodeID)}
	case d.Phase == controlapi.DrainWaitingForBudget:
		a.drain = nil
		snap := d.Drain
		a.mu.Unlock()
		d.cancel()
		<-d.finished
		if snap.BudgetHeld || d.BudgetHeld {
			a.releaseBudget(a.life)
		}
		a.emit(controlapi.Event{Kind: controlapi.EventDrain, Detail: "drain cancelled before it began"})
		return snap, nil
	case d.Phase != controlapi.DrainDrained || !d.stay:
		phase := d.Phase
		a.mu.Unlock()
		return controlapi.Drain{}, &controlapi.Error{Code: controlapi.ErrDrainInProgress.Code,
			Message: fmt.Sprintf("node %s is draining (%s): undrain once it is drained", a.opts.NodeID, phase)}
	}
	d.Phase = controlapi.DrainUndraining
	a.mu.Unlock()
	// A restored drain stops retaking the budget first: the share goes
	// back below, and must not be taken after.
	d.cancel()
	if d.reclaimed != nil {
		<-d.reclaimed
	}
	if err := a.clearDrained(); err != nil {
		a.log.Warn("undrain: an agent restart would find the node drained", "err", err)
	}
	a.mu.Lock()
	if a.drain != d { // a drain began meanwhile: it holds the instances
		a.mu.Unlock()
		return d.Drain, nil
	}
	var insts []*instance
	for _, inst := range a.instances {
		inst.draining, inst.drainRegistered, inst.refusing = false, false, false
		inst.state, inst.notReady = "starting", "starting"
		insts = append(insts, inst)
	}
	snap := d.Drain
	a.mu.Unlock()
	for _, inst := range insts {
		a.startInstance(inst)
	}
	a.drainEvent(d, fmt.Sprintf("starting %d instances again", len(insts)))
	a.track(func() { a.awaitUndrained(d) })
	return snap, nil
}

// restoreDrained makes a node that was drained when its agent stopped
// (nodectl drain, then a crash or a restart) drained again: its
// instances are not started (startSupervision) and nothing is
// registered until undrain, and it takes its share of the disruption
// budget back (the share was under the previous process's lease),
// waiting for it while other nodes hold it all.
func (a *Agent) restoreDrained() error {
	prev, drained, err := a.loadDrained()
	if err != nil || !drained {
		return err
	}
	ctx, cancel := context.WithCancel(a.life)
	finished := make(chan struct{})
	close(finished)
	prev.BudgetHeld, prev.InFlight = false, 0
	prev.Detail = "drained before the agent restarted; `nodectl undrain` starts the instances"
	d := &drain{Drain: prev, stay: true, started: map[string]uint64{}, untold: map[string]bool{}, cancel: cancel, finished: finished, reclaimed: make(chan struct{})}
	a.mu.Lock()
	a.drain = d
	a.mu.Unlock()
	a.log.Info("the node was drained before the agent restarted: instances stay stopped until undrain", "drained_at", prev.DrainedAt)
	a.emit(controlapi.Event{Kind: controlapi.EventDrain, Reason: controlapi.DrainDrained, Detail: prev.Detail})
	a.track(func() {
		defer close(d.reclaimed)
		if a.awaitBudget(ctx, d) {
			a.mu.Lock()
			d.Detail = prev.Detail
			a.mu.Unlock()
		}
	})
	return nil
}

// undrainWait bounds how long an undrained node holds its share of the
// disruption budget while its instances come back: one that never gets
// ready must not block every other node's drain.
const undrainWait = 2 * time.Minute

// awaitUndrained gives the budget back once every instance is ready
// again (or undrainWait passed), unless another drain took over.
func (a *Agent) awaitUndrained(d *drain) {
	limit := time.Now().Add(undrainWait)
	for {
		a.mu.Lock()
		current, ready := a.drain == d, a.allReadyLocked()
		a.mu.Unlock()
		if !current {
			return
		}
		if ready {
			break
		}
		if time.Now().After(limit) {
			a.log.Warn("undrain: instances not ready yet; giving the disruption budget back anyway", "waited", undrainWait)
			break
		}
		select {
		case <-a.life.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := a.releaseBudget(a.life); err != nil {
		a.log.Warn("undrain", "err", err)
	}
	a.mu.Lock()
	if a.drain == d {
		a.drain = nil
	}
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventDrain, Reason: "undrained", Detail: "instances ready; disruption budget given back"})
}

func (a *Agent) allReadyLocked() bool {
	for _, inst := range a.instances {
		if !inst.ready {
			return false
		}
	}
	return true
}

// drainOnStop is SIGTERM's drain: the same steps, bounded by the drain
// deadlines of the configuration (or a drain already running, if it ends
// sooner). It returns before the hard deadline whatever happens (leaving
// the agent time to exit), with the workers stopped.
func (a *Agent) drainOnStop() {
	d := a.startDrain(triggerSIGTERM, time.Duration(a.opts.DrainDeadline), time.Duration(a.opts.DrainHardDeadline), false)
	a.mu.Lock()
	hard := d.HardDeadline
	a.mu.Unlock()
	select {
	case <-d.finished:
	case <-time.After(time.Until(hard) - stopReserve):
		a.log.Error("drain past its hard deadline: stopping now", "recovery_action", "kill workers")
		a.killWorkers()
	}
}
