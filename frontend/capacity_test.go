package frontend

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
	"github.com/lifeline-llm/lifeline/kv/blockid"
)

// TestNoRouteWaitsForCapacity: a request that finds no instance waits,
// woken by registrations, until CapacityWait after its wait began; a
// route ends the wait, and a later migration waits afresh; past the bound
// it fails with no_capacity.
func TestNoRouteWaitsForCapacity(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	rte, _ := has[reqfsm.Route](r.Start(t0))
	aw, ok := has[reqfsm.AwaitCapacity](r.NoRoute(rte.Epoch, false, t0))
	if !ok || aw.Epoch != rte.Epoch || !aw.Until.Equal(t0.Add(reqfsm.DefaultCapacityWait)) || r.State != reqfsm.Admitted {
		t.Fatalf("no route: %+v, state %s", aw, r.State)
	}
	again, ok := has[reqfsm.Route](r.CapacityChanged(aw.Epoch))
	if !ok || again.Epoch != r.Epoch {
		t.Fatal("a registration did not route again")
	}
	// Woken for another model's instance: the bound does not move.
	if aw, _ := has[reqfsm.AwaitCapacity](r.NoRoute(again.Epoch, false, t0.Add(5*time.Second))); !aw.Until.Equal(t0.Add(reqfsm.DefaultCapacityWait)) {
		t.Fatalf("second wait until %v", aw.Until)
	}
	if _, ok := has[reqfsm.Dispatch](r.Routed(r.Epoch, reqfsm.Endpoint{InstanceID: "a", Generation: 1}, t0.Add(6*time.Second))); !ok || r.CapacityWaited != 6*time.Second {
		t.Fatalf("routed after the wait: waited %v", r.CapacityWaited)
	}
	if acts := r.CapacityChanged(r.Epoch); len(acts) != 0 {
		t.Fatalf("a wake after the wait ended: %v", acts)
	}
	r.OnFrame(frame(r, 1), t0.Add(7*time.Second))
	mig, _ := has[reqfsm.Route](r.OnWorkerFailed(r.Epoch, "killed", true, t0.Add(10*time.Second)))
	if aw, _ := has[reqfsm.AwaitCapacity](r.NoRoute(mig.Epoch, false, t0.Add(10*time.Second))); !aw.Until.Equal(t0.Add(10*time.Second + reqfsm.DefaultCapacityWait)) {
		t.Fatalf("the migration's wait until %v", aw.Until)
	}
	acts := r.NoRoute(mig.Epoch, false, t0.Add(10*time.Second+reqfsm.DefaultCapacityWait))
	if _, ok := has[reqfsm.Finish](acts); !ok || r.State != reqfsm.Failed || r.Err.Type != openai.ErrNoCapacity || r.Received() != 1 {
		t.Fatalf("past the bound: %v, state %s, err %v", acts, r.State, r.Err)
	}
}

// TestNoRouteBounds: the deadline bounds a wait; busy instances and a
// zero CapacityWait fail at once; a cancel ends a wait.
func TestNoRouteBounds(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 10, t0.Add(3*time.Second), reqfsm.DefaultPolicy, t0)
	rte, _ := has[reqfsm.Route](r.Start(t0))
	if aw, _ := has[reqfsm.AwaitCapacity](r.NoRoute(rte.Epoch, false, t0)); !aw.Until.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("wait until %v, want the deadline", aw.Until)
	}
	if r.OnDeadline(t0.Add(3 * time.Second)); r.State != reqfsm.Failed || r.Err.Type != openai.ErrDeadlineExceeded {
		t.Fatalf("deadline during the wait: %s %v", r.State, r.Err)
	}

	r = reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	rte, _ = has[reqfsm.Route](r.Start(t0))
	if r.NoRoute(rte.Epoch, true, t0); r.State != reqfsm.Failed || r.Err.Type != openai.ErrOverloaded {
		t.Fatalf("overloaded: %s %v", r.State, r.Err)
	}

	p := reqfsm.DefaultPolicy
	p.CapacityWait = 0
	r = reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, p, t0)
	rte, _ = has[reqfsm.Route](r.Start(t0))
	if r.NoRoute(rte.Epoch, false, t0); r.State != reqfsm.Failed || r.Err.Type != openai.ErrNoCapacity {
		t.Fatalf("no wait: %s %v", r.State, r.Err)
	}

	r = reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	rte, _ = has[reqfsm.Route](r.Start(t0))
	aw, _ := has[reqfsm.AwaitCapacity](r.NoRoute(rte.Epoch, false, t0))
	r.Cancel()
	if acts := r.CapacityChanged(aw.Epoch); len(acts) != 0 {
		t.Fatalf("a cancelled wait routed: %v", acts)
	}
	if acts := r.NoRoute(aw.Epoch, false, t0.Add(time.Hour)); len(acts) != 0 || r.State != reqfsm.Cancelling {
		t.Fatalf("a stale no-route acted: %v, state %s", acts, r.State)
	}
}

// TestRestartIsNotExcluded: a request excludes the endpoints that failed
// it, not their restarts at higher generations.
func TestRestartIsNotExcluded(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	rte, _ := has[reqfsm.Route](r.Start(t0))
	r.Routed(rte.Epoch, reqfsm.Endpoint{InstanceID: "a", Generation: 4}, t0)
	rte, _ = has[reqfsm.Route](r.OnWorkerFailed(r.Epoch, "killed", true, t0))
	if !rte.Exclude["a"] || rte.Generations["a"] != 4 {
		t.Fatalf("route %+v", rte)
	}
	rt := route.NewRouter()
	rt.Update(route.Instance{ID: "a", Generation: 4, Model: "m", Ready: true})
	if _, _, _, err := rt.PickCached("m", "", "", rte.Exclusion(), t0, func(route.Instance) []blockid.BlockKey { return nil }); err == nil {
		t.Fatal("the failed endpoint picked again")
	}
	rt.Update(route.Instance{ID: "a", Generation: 5, Model: "m", Ready: true})
	if in, _, _, err := rt.PickCached("m", "", "", rte.Exclusion(), t0, func(route.Instance) []blockid.BlockKey { return nil }); err != nil || in.Generation != 5 {
		t.Fatalf("the restart: %+v %v", in, err)
	}
	if _, err := rt.Pick("m", "", "", map[string]bool{"a": true}, t0); err == nil {
		t.Fatal("Pick's exclude covers every generation")
	}
}

// TestStopIsNotACancel: a request the frontend ends as it stops fails
// with frontend_stopping; one the client cancelled first stays cancelled.
func TestStopIsNotACancel(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	start(t, r, "a")
	if _, ok := has[reqfsm.Finish](r.Stop()); !ok || r.State != reqfsm.Failed || r.Err.Type != openai.ErrFrontendStopping {
		t.Fatalf("stop: %s %v", r.State, r.Err)
	}
	if acts := r.Stop(); len(acts) != 0 {
		t.Fatal("a finished request stopped again")
	}
	r = reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	start(t, r, "a")
	r.Cancel()
	if r.Stop(); r.State != reqfsm.Cancelled || r.Err.Type != openai.ErrCancelledType {
		t.Fatalf("cancel then stop: %s %v", r.State, r.Err)
	}
}

// TestCancelCause: the run reports a client's cancel (DELETE, disconnect)
// as cancelled, and its context ending with the server's as
// frontend_stopping.
func TestCancelCause(t *testing.T) {
	for _, c := range []struct {
		name string
		end  func(server context.CancelFunc, request context.CancelCauseFunc)
		want openai.ErrorType
	}{
		{"DELETE", func(_ context.CancelFunc, req context.CancelCauseFunc) { req(errClientCancelled) }, openai.ErrCancelledType},
		{"disconnect", func(_ context.CancelFunc, req context.CancelCauseFunc) { req(errClientGone) }, openai.ErrCancelledType},
		{"not followed", func(_ context.CancelFunc, req context.CancelCauseFunc) { req(errNotFollowed) }, openai.ErrCancelledType},
		{"frontend stops", func(srv context.CancelFunc, _ context.CancelCauseFunc) { srv() }, openai.ErrFrontendStopping},
	} {
		sctx, stop := context.WithCancel(context.Background())
		rctx, cancel := context.WithCancelCause(sctx)
		r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
		start(t, r, "a")
		x := &run{r: r}
		c.end(stop, cancel)
		acts := x.onCancel(rctx)
		if _, ok := has[reqfsm.Finish](acts); !ok || r.Err == nil || r.Err.Type != c.want {
			t.Errorf("%s: %v, err %v", c.name, acts, r.Err)
		}
		stop()
		cancel(nil)
	}
}

// TestWorkerCancelMigrates: a worker that cancels the request itself
// (it is stopping) is a worker failure to migrate from, not the end of
// the request.
func TestWorkerCancelMigrates(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	start(t, r, "a")
	r.OnFrame(frame(r, 1), t0)
	x := &run{r: r}
	acts := x.onWorkerError(r.Epoch, &wire.Error{Code: wire.Code_CANCELLED, Message: "sched: cancelled"}, t0)
	if _, ok := has[reqfsm.Route](acts); !ok || r.State != reqfsm.Migrating || r.Err != nil {
		t.Fatalf("worker cancel: %v, state %s, err %v", acts, r.State, r.Err)
	}
	x.onWorkerError(r.Epoch, &wire.Error{Code: wire.Code_INVALID_REQUEST, Message: "bad"}, t0)
	if r.State != reqfsm.Failed || r.Err.Type != openai.ErrInvalidRequest {
		t.Fatalf("a non-retryable error: %s %v", r.State, r.Err)
	}
}

// TestCapacitySignal: a registration wakes the waiters of its model
// only, including one that took the signal before it.
func TestCapacitySignal(t *testing.T) {
	var c capacitySignal
	m, other := c.watch("m"), c.watch("other")
	c.signal("m")
	select {
	case <-m:
	default:
		t.Fatal("the model's waiter not woken")
	}
	select {
	case <-other:
		t.Fatal("another model's waiter woken")
	default:
	}
	if next := c.watch("m"); next == m {
		t.Fatal("a fired signal reused")
	}
	c.signal("nobody waits") // no panic, nothing to wake
}

// TestWatchHealth: ready only once synced, and while etcd answered
// within watchStale; a broken watch is unhealthy until the next sync.
func TestWatchHealth(t *testing.T) {
	var h watchHealth
	if h.problem(t0) == "" {
		t.Fatal("healthy before any read")
	}
	h.heard(t0, true)
	if p := h.problem(t0.Add(watchStale)); p != "" {
		t.Fatalf("synced: %s", p)
	}
	if h.problem(t0.Add(watchStale+time.Second)) == "" {
		t.Fatal("healthy after a silence")
	}
	h.heard(t0.Add(10*time.Second), false)
	if p := h.problem(t0.Add(10 * time.Second)); p != "" {
		t.Fatalf("progress heard: %s", p)
	}
	h.broken()
	h.heard(t0.Add(11*time.Second), false)
	if h.problem(t0.Add(11*time.Second)) == "" {
		t.Fatal("healthy after the watch broke, before a new sync")
	}
}

// TestAllTokensInCompletes: a worker that fails after the last token, its
// finish frame lost, leaves nothing to migrate: the request completes by
// its length.
func TestAllTokensInCompletes(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 3, time.Time{}, reqfsm.DefaultPolicy, t0)
	start(t, r, "a")
	for seq := 1; seq <= 3; seq++ {
		r.OnFrame(frame(r, seq), t0)
	}
	acts := r.OnWorkerFailed(r.Epoch, "connection closed", true, t0)
	if _, ok := has[reqfsm.Finish](acts); !ok || r.State != reqfsm.Completed || r.FinishReason != "length" || r.Migrations != 0 || r.Err != nil {
		t.Fatalf("after every token: %v, state %s, finish %q, err %v", acts, r.State, r.FinishReason, r.Err)
	}
}

// TestDrainMigrationWithoutRoute: a migration away from a worker whose
// node drains (a DRAINING error) that finds no routable instance ends at
// once with draining, without a wait for capacity; with a route it
// migrates as any failure does; a migration of another cause still
// waits, and so does a later one once the drain's migration was routed.
func TestDrainMigrationWithoutRoute(t *testing.T) {
	for _, c := range []struct {
		name  string
		drain bool
		// routeFirst: the drain's migration is routed, then the new
		// worker fails for another cause before the route that finds
		// nothing.
		routeFirst bool
		overloaded bool
		want       string // draining, await, overloaded
	}{
		{name: "drain, no route", drain: true, want: "draining"},
		{name: "other failure, no route", want: "await"},
		{name: "drain, busy instances", drain: true, overloaded: true, want: "overloaded"},
		{name: "drain routed, then another failure", drain: true, routeFirst: true, want: "await"},
	} {
		r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
		start(t, r, "a")
		r.OnFrame(frame(r, 1), t0)
		fail := r.OnWorkerFailed
		if c.drain {
			fail = func(epoch uint64, reason string, _ bool, now time.Time) []reqfsm.Action {
				return r.OnWorkerDraining(epoch, reason, now)
			}
		}
		rte, ok := has[reqfsm.Route](fail(r.Epoch, "node drains", true, t0))
		if !ok || r.State != reqfsm.Migrating {
			t.Fatalf("%s: no migration: state %s", c.name, r.State)
		}
		if c.routeFirst {
			if _, ok := has[reqfsm.Dispatch](r.Routed(rte.Epoch, reqfsm.Endpoint{InstanceID: "b", Generation: 1}, t0)); !ok {
				t.Fatalf("%s: the drain's migration was not dispatched", c.name)
			}
			r.OnFrame(frame(r, 2), t0)
			rte, _ = has[reqfsm.Route](r.OnWorkerFailed(r.Epoch, "killed", true, t0))
		}
		acts := r.NoRoute(rte.Epoch, c.overloaded, t0)
		var got string
		switch aw, waits := has[reqfsm.AwaitCapacity](acts); {
		case waits && aw.Epoch == r.Epoch && r.State == reqfsm.Migrating:
			got = "await"
		case r.State == reqfsm.Failed && r.Err != nil:
			got = string(r.Err.Type)
			if _, ok := has[reqfsm.Finish](acts); !ok {
				t.Errorf("%s: failed without a Finish: %v", c.name, acts)
			}
		default:
			got = fmt.Sprintf("%v, state %s, err %v", acts, r.State, r.Err)
		}
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// TestDrainMigrationRouted: a drain's migration that finds an instance
// migrates there as any migration does, continuing after the received
// tokens.
func TestDrainMigrationRouted(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	start(t, r, "a")
	r.OnFrame(frame(r, 1), t0)
	rte, _ := has[reqfsm.Route](r.OnWorkerDraining(r.Epoch, "node drains", t0))
	if !rte.Exclude["a"] {
		t.Fatalf("the draining instance not excluded: %+v", rte)
	}
	d, ok := has[reqfsm.Dispatch](r.Routed(rte.Epoch, reqfsm.Endpoint{InstanceID: "b", Generation: 1}, t0))
	if !ok || d.To.InstanceID != "b" || len(d.Prefix) != 1 || r.Migrations != 1 || r.State != reqfsm.Prefilling {
		t.Fatalf("routed drain migration: %+v, %d migrations, state %s", d, r.Migrations, r.State)
	}
	if acts := r.OnWorkerDraining(r.Epoch-1, "stale", t0); len(acts) != 0 {
		t.Fatalf("a stale drain notice acted: %v", acts)
	}
}

// TestWorkerDrainingErrorEndsTyped: the interpreter hands a DRAINING
// worker error to the machine as the drain's: with no route the request
// ends with draining, answered 503 with Retry-After.
func TestWorkerDrainingErrorEndsTyped(t *testing.T) {
	r := reqfsm.NewRequest("r", []int{1}, 10, time.Time{}, reqfsm.DefaultPolicy, t0)
	start(t, r, "a")
	x := &run{r: r}
	rte, ok := has[reqfsm.Route](x.onWorkerError(r.Epoch, &wire.Error{Code: wire.Code_DRAINING, Message: "node drains", Retryable: true}, t0))
	if !ok || x.drainFailure == "" {
		t.Fatalf("DRAINING error: state %s, drain failure %q", r.State, x.drainFailure)
	}
	if r.NoRoute(rte.Epoch, false, t0); r.State != reqfsm.Failed || r.Err.Type != openai.ErrDraining {
		t.Fatalf("no route after a DRAINING error: %s %v", r.State, r.Err)
	}
	w := httptest.NewRecorder()
	writeRequestError(w, r.Err)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), `"type":"draining"`) {
		t.Fatalf("draining answered %d, Retry-After %q: %s", w.Code, w.Header().Get("Retry-After"), w.Body.String())
	}
}
