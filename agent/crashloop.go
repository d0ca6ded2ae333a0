package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// restartHistory is one instance's record of exits: the backoff before
// the next start, the exits within the crash-loop window, and how many
// crash loops in a row it has had. It is pure: the supervisor feeds it
// exit times.
type restartHistory struct {
	opts    *Options
	backoff time.Duration
	recent  []time.Time
	loops   int
}

func newRestartHistory(opts *Options) *restartHistory {
	return &restartHistory{opts: opts, backoff: time.Duration(opts.RestartBackoff)}
}

// exited records the exit (at now) of a worker started at started. It
// returns the backoff before the next start, or, when this exit makes a
// crash loop (more than CrashLoopLimit exits within CrashLoopWindow), the
// cool-down before the next attempt.
func (h *restartHistory) exited(started, now time.Time) (backoff, cooldown time.Duration) {
	window := time.Duration(h.opts.CrashLoopWindow)
	// A worker that ran for a whole window was healthy: start over.
	if now.Sub(started) > window {
		h.backoff, h.recent, h.loops = time.Duration(h.opts.RestartBackoff), h.recent[:0], 0
	}
	h.recent = append(h.recent, now)
	for len(h.recent) > 0 && now.Sub(h.recent[0]) > window {
		h.recent = h.recent[1:]
	}
	if len(h.recent) > h.opts.CrashLoopLimit {
		h.loops++
		h.backoff, h.recent = time.Duration(h.opts.RestartBackoff), h.recent[:0]
		return 0, h.cooldown()
	}
	backoff = h.backoff
	h.backoff = min(2*h.backoff, time.Duration(h.opts.RestartMax))
	return backoff, 0
}

// cooldown is CrashLoopCooldown doubled for every crash loop in a row
// after the first, capped at CrashLoopCooldownMax.
func (h *restartHistory) cooldown() time.Duration {
	d, ceiling := time.Duration(h.opts.CrashLoopCooldown), time.Duration(h.opts.CrashLoopCooldownMax)
	for i := 1; i < h.loops && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// operatorReset forgets the crash loops in a row: after an operator's
// reset the next crash loop cools down for CrashLoopCooldown again.
func (h *restartHistory) operatorReset() { h.loops = 0 }

// coolDown holds inst in crash_loop for d, or until an operator resets
// it; it reports false when the agent stops meanwhile.
func (a *Agent) coolDown(ctx context.Context, inst *instance, h *restartHistory, d time.Duration) bool {
	next := time.Now().Add(d)
	a.mu.Lock()
	inst.state, inst.nextAttempt, inst.crashLoops = "crash_loop", next, h.loops
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventCrashLoop, InstanceID: inst.id,
		Detail: fmt.Sprintf("more than %d exits within %v; next attempt in %v (crash loop %d in a row)", a.opts.CrashLoopLimit,
			time.Duration(a.opts.CrashLoopWindow), d, h.loops)})
	a.log.Error("crash loop: cooling down", "instance_id", inst.id, "cooldown", d, "crash_loops", h.loops,
		"recovery_action", "retry after the cool-down, or at once on nodectl reset")
	timer := time.NewTimer(d)
	defer timer.Stop()
	why := "cool-down over"
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
	case <-inst.reset:
		why = "reset by the operator"
		h.operatorReset()
	}
	a.mu.Lock()
	// Under the lock that resetInstance sends under: no reset sent for
	// this crash loop outlives it.
	select {
	case <-inst.reset:
	default:
	}
	inst.state, inst.nextAttempt = "restarting", time.Time{}
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventRetry, InstanceID: inst.id, Detail: why})
	a.log.Info("crash loop: trying again", "instance_id", inst.id, "why", why)
	return true
}

// resetInstance makes an instance in crash_loop try again at once.
func (a *Agent) resetInstance(id string) (controlapi.Worker, error) {
	a.mu.Lock()
	inst, ok := a.instances[id]
	if !ok {
		a.mu.Unlock()
		return controlapi.Worker{}, &controlapi.Error{Code: controlapi.ErrUnknownInstance.Code,
			Message: fmt.Sprintf("node %s has no instance %q", a.opts.NodeID, id)}
	}
	if inst.state != "crash_loop" {
		state := inst.state
		a.mu.Unlock()
		return controlapi.Worker{}, &controlapi.Error{Code: controlapi.ErrNotInCrashLoop.Code,
			Message: fmt.Sprintf("instance %s is %s, not in crash_loop: reset only retries an instance in crash_loop", id, state)}
	}
	select {
	case inst.reset <- struct{}{}:
	default: // already asked
	}
	w := a.workerLocked(inst)
	a.mu.Unlock()
	return w, nil
}
