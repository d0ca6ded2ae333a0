package reqfsm

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/route"
)

var t0 = time.Unix(1_800_000_000, 0)

func has[T Action](acts []Action) (T, bool) {
	for _, a := range acts {
		if v, ok := a.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

func frame(r *Request, seq int) Frame {
	return Frame{From: r.Endpoint, Epoch: r.Epoch, SequenceNo: seq, TokenID: 100 + seq, Text: fmt.Sprint(" w", seq)}
}

func start(t *testing.T, r *Request, to string) {
	t.Helper()
	rte, ok := has[Route](r.Start(t0))
	if !ok {
		t.Fatal("Start did not ask for a route")
	}
	if _, ok := has[Dispatch](r.Routed(rte.Epoch, Endpoint{to, 1}, t0)); !ok {
		t.Fatal("Routed did not dispatch")
	}
}

// TestMigrationContinuesAfterReceived: a worker dies after 127 tokens; the
// request migrates once, at a new epoch, re-prefilling prompt ‖ y1..y127,
// and tokens continue at 128 with no gap and no duplicate, while the old
// worker's late frames are dropped.
func TestMigrationContinuesAfterReceived(t *testing.T) {
	r := NewRequest("r", []int{1, 2, 3}, 200, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	old := r.Endpoint
	for seq := 1; seq <= 127; seq++ {
		if _, ok := has[Deliver](r.OnFrame(frame(r, seq), t0)); !ok {
			t.Fatalf("token %d not delivered", seq)
		}
	}
	oldEpoch := r.Epoch
	acts := r.OnWorkerFailed(r.Epoch, "stream reset", true, t0)
	rte, ok := has[Route](acts)
	if !ok || r.State != Migrating || r.Epoch != oldEpoch+1 || !rte.Exclude["a"] {
		t.Fatalf("after the failure: %v, state %s, epoch %d", acts, r.State, r.Epoch)
	}
	// A late frame of the dead worker's epoch changes nothing.
	if acts := r.OnFrame(Frame{From: old, Epoch: oldEpoch, SequenceNo: 128, TokenID: 999}, t0); len(acts) != 0 || r.StaleEpochFrames != 1 {
		t.Fatalf("stale frame: %v", acts)
	}
	d, ok := has[Dispatch](r.Routed(rte.Epoch, Endpoint{"b", 4}, t0))
	if !ok || len(d.Prefix) != 127 || d.Prefix[126] != 100+127 || d.Epoch != r.Epoch {
		t.Fatalf("dispatch %+v", d)
	}
	// The new worker repeats nothing it was given; a repeat is dropped.
	r.OnFrame(frame(r, 128), t0)
	if acts := r.OnFrame(frame(r, 128), t0); len(acts) != 0 || r.DuplicateFrames != 1 {
		t.Fatal("duplicate delivered")
	}
	f := frame(r, 129)
	f.FinishReason = "length"
	if _, ok := has[Finish](r.OnFrame(f, t0)); !ok || r.State != Completed {
		t.Fatal("not completed")
	}
	for i, tok := range r.Output.Tokens() {
		if tok.SequenceNo != i+1 {
			t.Fatalf("output %d has sequence %d", i, tok.SequenceNo)
		}
	}
	// Terminal states are idempotent.
	if acts := r.OnWorkerFailed(r.Epoch, "late", true, t0); len(acts) != 0 || r.State != Completed {
		t.Fatal("a completed request moved")
	}
}

func TestGapIsAFailureNotADelivery(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	r.OnFrame(frame(r, 1), t0)
	acts := r.OnFrame(frame(r, 3), t0)
	if _, ok := has[Deliver](acts); ok || r.Received() != 1 || r.Gaps != 1 || r.State != Migrating {
		t.Fatalf("gap: %v, state %s", acts, r.State)
	}
}

func TestBudgetExhaustedFailsTyped(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	for i := 0; i < 3; i++ {
		rte, ok := has[Route](r.OnWorkerFailed(r.Epoch, "killed", true, t0))
		if !ok {
			t.Fatalf("migration %d refused", i+1)
		}
		r.Routed(rte.Epoch, Endpoint{fmt.Sprint("i", i), 1}, t0)
	}
	acts := r.OnWorkerFailed(r.Epoch, "killed", true, t0)
	if _, ok := has[Finish](acts); !ok || r.State != Failed || !errors.Is(r.Err, &RequestError{Type: openai.ErrMigrationExhausted}) {
		t.Fatalf("after the budget: %v, %v", r.State, r.Err)
	}
}

func TestDeadlineShortFailsFast(t *testing.T) {
	p := DefaultPolicy
	p.PrefillPerToken = 10 * time.Millisecond
	r := NewRequest("r", make([]int, 100), 10, t0.Add(500*time.Millisecond), p, t0)
	start(t, r, "a")
	r.OnWorkerFailed(r.Epoch, "killed", true, t0) // 100 tokens × 10ms = 1s > 500ms
	if r.State != Failed || r.Err.Type != openai.ErrDeadlineExceeded {
		t.Fatalf("state %s, err %v", r.State, r.Err)
	}
}

func TestStallMigrates(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	r.OnFrame(frame(r, 1), t0)
	if acts := r.Tick(t0.Add(9 * time.Second)); len(acts) != 0 {
		t.Fatal("migrated before the stall timeout")
	}
	if _, ok := has[Route](r.Tick(t0.Add(11 * time.Second))); !ok || r.State != Migrating {
		t.Fatal("a silent worker was not abandoned")
	}
	// The migration's reason is the machine's own finding.
	if r.LastFailure != "no frame for 11s" {
		t.Fatalf("last failure %q, want the silence", r.LastFailure)
	}
}

// TestGoneEndpointSilenceMigratesSooner: once its registration is gone
// (lease expired), a worker's silence is given up on after GoneSilence,
// not StallTimeout; one that keeps sending keeps the stream, and a
// deregistration of another instance changes nothing.
func TestGoneEndpointSilenceMigratesSooner(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	r.OnFrame(frame(r, 1), t0)
	if acts := r.OnDeregistered("b", t0.Add(3*time.Second)); len(acts) != 0 || len(r.gone) != 0 {
		t.Fatalf("another instance's deregistration acted: %v", acts)
	}
	if acts := r.OnDeregistered("a", t0.Add(time.Second)); len(acts) != 0 {
		t.Fatalf("a stream silent for 1 s was moved at its deregistration: %v", acts)
	}
	// Still sending: kept.
	r.OnFrame(frame(r, 2), t0.Add(1500*time.Millisecond))
	if acts := r.Tick(t0.Add(3 * time.Second)); len(acts) != 0 {
		t.Fatalf("a stream still coming was moved: %v", acts)
	}
	if _, ok := has[Route](r.Tick(t0.Add(3600 * time.Millisecond))); !ok || r.State != Migrating {
		t.Fatalf("a silent deregistered worker was not given up on after %v (state %s)", DefaultPolicy.GoneSilence, r.State)
	}
	// The new endpoint is not gone: the full stall timeout again.
	if acts := r.Routed(r.Epoch, Endpoint{"c", 1}, t0.Add(4*time.Second)); len(acts) == 0 {
		t.Fatal("the migration was not dispatched")
	}
	if acts := r.Tick(t0.Add(9 * time.Second)); len(acts) != 0 {
		t.Fatalf("the new worker was held to the deregistered one's timeout: %v", acts)
	}
}

// TestGoneEndpointPrefillIsWaitedFor: a request still prefilling (no
// token yet) on an endpoint whose registration vanished waits the full
// stall timeout: a long prompt sends nothing for a while.
func TestGoneEndpointPrefillIsWaitedFor(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	r.OnDeregistered("a", t0.Add(time.Second))
	if acts := r.Tick(t0.Add(5 * time.Second)); len(acts) != 0 {
		t.Fatalf("a prefill on a deregistered worker was given up on after 5 s: %v", acts)
	}
	if _, ok := has[Route](r.Tick(t0.Add(11 * time.Second))); !ok {
		t.Fatal("a silent prefill was not given up on at the stall timeout")
	}
}

// TestCancelBeatsLateMigration: the client cancels while a migration is
// being routed; the route answer for the old epoch dispatches nothing.
func TestCancelBeatsLateMigration(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	rte, _ := has[Route](r.OnWorkerFailed(r.Epoch, "killed", true, t0))
	r.Cancel()
	if acts := r.Routed(rte.Epoch, Endpoint{"b", 1}, t0); len(acts) != 0 {
		t.Fatalf("migration completed after cancel: %v", acts)
	}
	r.CancelDone()
	if r.State != Cancelled || r.Err.Type != openai.ErrCancelledType {
		t.Fatalf("state %s", r.State)
	}
	if acts := r.Cancel(); len(acts) != 0 {
		t.Fatal("second cancel acted")
	}
}

func TestNonRetryableFailsWithoutMigrating(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	r.OnWorkerFailed(r.Epoch, "prompt too long", false, t0)
	if r.State != Failed || r.Migrations != 0 {
		t.Fatalf("state %s after %d migrations", r.State, r.Migrations)
	}
}

func TestRouterPrefersNumericsThenLoad(t *testing.T) {
	rt := route.NewRouter()
	for _, in := range []route.Instance{
		{ID: "a", Model: "m", ModelRevision: "r1", NumericsID: "avx", Ready: true, Outstanding: 5},
		{ID: "b", Generation: 3, Model: "m", ModelRevision: "r1", NumericsID: "avx", Ready: true, Outstanding: 1},
		{ID: "c", Model: "m", ModelRevision: "r1", NumericsID: "generic", Ready: true, Outstanding: 0},
		{ID: "d", Model: "m", ModelRevision: "r1", NumericsID: "avx", Ready: false},
		{ID: "e", Model: "m", ModelRevision: "r2", NumericsID: "avx", Ready: true},
		{ID: "f", Model: "m", ModelRevision: "r1", NumericsID: "avx", Ready: true, Draining: true},
	} {
		rt.Update(in)
	}
	pick := func(exclude map[string]bool, now time.Time) string {
		in, err := rt.Pick("m", "r1", "avx", exclude, now)
		if err != nil {
			return err.Error()
		}
		return in.ID
	}
	if got := pick(nil, t0); got != "b" {
		t.Fatalf("picked %s, want b (same numerics, least load)", got)
	}
	rt.Suppress("b", 3, t0)
	if got := pick(nil, t0.Add(time.Second)); got != "a" {
		t.Fatalf("with b suppressed picked %s, want a", got)
	}
	if got := pick(nil, t0.Add(6*time.Second)); got != "b" {
		t.Fatalf("after the suppression picked %s, want b", got)
	}
	// A restart is a new endpoint: not suppressed.
	rt.Suppress("b", 3, t0.Add(7*time.Second))
	rt.Update(route.Instance{ID: "b", Generation: 4, Model: "m", ModelRevision: "r1", NumericsID: "avx", Ready: true, Outstanding: 1})
	if got := pick(nil, t0.Add(8*time.Second)); got != "b" {
		t.Fatalf("b restarted at generation 4 but picked %s", got)
	}
	if got := pick(map[string]bool{"a": true, "b": true}, t0); got != "c" {
		t.Fatalf("only another numerics left: picked %s, want c", got)
	}
	if _, err := rt.Pick("m", "r1", "avx", map[string]bool{"a": true, "b": true, "c": true}, t0); !errors.Is(err, route.ErrNoInstance) {
		t.Fatalf("nothing left: %v", err)
	}
	// An older generation's late registration does not replace a newer one.
	rt.Update(route.Instance{ID: "b", Generation: 7, Model: "m", ModelRevision: "r1", NumericsID: "avx", Ready: true})
	rt.Update(route.Instance{ID: "b", Generation: 6, Model: "m", ModelRevision: "r1", NumericsID: "avx", Ready: false})
	if got := pick(nil, t0.Add(10*time.Second)); got != "b" {
		t.Fatalf("stale registration won: picked %s", got)
	}
}

func TestOverloadedReroutesWithoutSpendingBudget(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	for i := 0; i < 5; i++ {
		prev, epoch := r.Endpoint.InstanceID, r.Epoch
		acts := r.OnOverloaded(r.Epoch)
		rte, ok := has[Route](acts)
		if !ok || !rte.Exclude[prev] {
			t.Fatal("an overloaded refusal did not re-route away from the busy instance")
		}
		if cw, ok := has[CancelWorker](acts); !ok || cw.Epoch != epoch || cw.At.InstanceID != prev {
			t.Fatalf("the refused epoch's calls are not ended: %v", acts)
		}
		r.Routed(rte.Epoch, Endpoint{fmt.Sprint("i", i), 1}, t0)
	}
	if r.Migrations != 0 || r.State != Prefilling {
		t.Fatalf("after five refusals: %d migrations, state %s", r.Migrations, r.State)
	}
	r.OnFrame(frame(r, 1), t0)
	if acts := r.OnOverloaded(r.Epoch); len(acts) != 0 {
		t.Fatal("an overloaded refusal after tokens re-routed without a migration")
	}
}

// TestPrefillDecodeHandOff: PREFILLING → TRANSFERRING → DECODING across
// nodes; on one node the decode instance starts right after the prefill.
func TestPrefillDecodeHandOff(t *testing.T) {
	d, p := Endpoint{"d", 3}, Endpoint{"p", 5}
	keys := [][]byte{make([]byte, 32)}
	for _, sameNode := range []bool{false, true} {
		r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
		rte, _ := has[Route](r.Start(t0))
		pre, ok := has[Prefill](r.RoutedPD(rte.Epoch, d, p, t0))
		if !ok || pre.At != p || r.State != Prefilling {
			t.Fatalf("routed P/D: %+v, state %s", pre, r.State)
		}
		acts := r.OnPrefilled(r.Epoch, KVRef{From: p, Node: "n2", Keys: keys}, sameNode, t0)
		if sameNode {
			if dis, ok := has[Dispatch](acts); !ok || dis.To != d || r.PD != "same_node" {
				t.Fatalf("same node: %v", acts)
			}
			continue
		}
		tr, ok := has[Transfer](acts)
		if !ok || r.State != Transferring || tr.To != d || tr.TransferEpoch != 1 {
			t.Fatalf("transfer: %v, state %s", acts, r.State)
		}
		// A completion of another transfer epoch is dropped and counted.
		if acts := r.OnTransferred(r.Epoch, tr.TransferEpoch+7, t0); len(acts) != 0 || r.StaleTransfers != 1 {
			t.Fatalf("foreign completion: %v", acts)
		}
		if dis, ok := has[Dispatch](r.OnTransferred(r.Epoch, tr.TransferEpoch, t0)); !ok || dis.To != d {
			t.Fatal("no dispatch after the transfer")
		}
		r.OnFrame(frame(r, 1), t0)
		if r.State != Decoding {
			t.Fatalf("state %s after the first token", r.State)
		}
	}
}

// TestPrefillFailureRetriesThenRecomputes: a failed prefill instance is
// replaced once; after MaxPrefillAttempts the decode instance prefills by
// itself. The migration budget is not spent.
func TestPrefillFailureRetriesThenRecomputes(t *testing.T) {
	d, p1, p2 := Endpoint{"d", 3}, Endpoint{"p1", 5}, Endpoint{"p2", 1}
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	rte, _ := has[Route](r.Start(t0))
	r.RoutedPD(rte.Epoch, d, p1, t0)
	// A failure report about an instance that is not the prefill one is stale.
	if acts := r.OnPrefillFailed(r.Epoch, p2, "x"); len(acts) != 0 {
		t.Fatalf("foreign failure: %v", acts)
	}
	rp, ok := has[RoutePrefill](r.OnPrefillFailed(r.Epoch, p1, "killed"))
	if !ok || !rp.Exclude["p1"] {
		t.Fatalf("no second prefill route: %+v", rp)
	}
	if _, ok := has[Prefill](r.PrefillRouted(rp.Epoch, p2, true, t0)); !ok {
		t.Fatal("second prefill not sent")
	}
	dis, ok := has[Dispatch](r.OnPrefillFailed(r.Epoch, p2, "killed"))
	if !ok || dis.To != d || r.PD != "recompute" || r.Migrations != 0 || r.Epoch != 1 {
		t.Fatalf("after two prefill failures: %+v, pd %q, migrations %d", dis, r.PD, r.Migrations)
	}
}

// TestDecodeDiesDuringTransfer: the decode instance fails while its node
// pulls the blocks; the request migrates, and the late transfer answer of
// the old epoch has no effect.
func TestDecodeDiesDuringTransfer(t *testing.T) {
	d, p := Endpoint{"d", 3}, Endpoint{"p", 5}
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	rte, _ := has[Route](r.Start(t0))
	r.RoutedPD(rte.Epoch, d, p, t0)
	tr, _ := has[Transfer](r.OnPrefilled(r.Epoch, KVRef{From: p, Node: "n2", Keys: [][]byte{make([]byte, 32)}}, false, t0))
	old := r.Epoch
	acts := r.OnWorkerFailed(r.Epoch, "decode killed", true, t0)
	if cw, ok := has[CancelWorker](acts); !ok || cw.Epoch != old || r.State != Migrating {
		t.Fatalf("failure during transfer: %v", acts)
	}
	if acts := r.OnTransferred(old, tr.TransferEpoch, t0); len(acts) != 0 || r.StaleTransfers != 1 {
		t.Fatalf("late transfer answer: %v", acts)
	}
	// Cancel during a prefill cancels that epoch's calls.
	r2 := NewRequest("r2", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	rte, _ = has[Route](r2.Start(t0))
	r2.RoutedPD(rte.Epoch, d, p, t0)
	if cw, ok := has[CancelWorker](r2.Cancel()); !ok || cw.Epoch != 1 {
		t.Fatal("cancel during prefill did not cancel the epoch")
	}
	if acts := r2.OnPrefilled(1, KVRef{From: p}, true, t0); len(acts) != 0 {
		t.Fatalf("prefill after cancel: %v", acts)
	}
}

// TestPrefillStallBlamesThePrefillInstance: no hand-off within the stall
// timeout fails the prefill instance, not the decode one, and spends no
// migration budget.
func TestPrefillStallBlamesThePrefillInstance(t *testing.T) {
	d, p := Endpoint{"d", 3}, Endpoint{"p", 5}
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	rte, _ := has[Route](r.Start(t0))
	r.RoutedPD(rte.Epoch, d, p, t0)
	acts := r.Tick(t0.Add(DefaultPolicy.StallTimeout + time.Second))
	if rp, ok := has[RoutePrefill](acts); !ok || !rp.Exclude["p"] || r.FailedInstances["d"] || r.Migrations != 0 || r.Endpoint != d {
		t.Fatalf("stalled prefill: %v, failed %v, migrations %d", acts, r.FailedInstances, r.Migrations)
	}
	// The stall is reported like any other prefill failure (its node is
	// remembered, its call ended, its failure counted).
	if pf, ok := has[PrefillFailed](acts); !ok || pf.At != p {
		t.Fatalf("stalled prefill not reported: %v", acts)
	}
}

// TestDeadlineEndsAnyState: the deadline fails the request wherever it is,
// including between a failure and the migration's route, and ends the
// epoch's worker calls; before the deadline nothing happens.
func TestDeadlineEndsAnyState(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, t0.Add(time.Second), DefaultPolicy, t0)
	start(t, r, "a")
	r.OnFrame(frame(r, 1), t0)
	r.OnWorkerFailed(r.Epoch, "killed", true, t0)
	if r.State != Migrating {
		t.Fatalf("state %s", r.State)
	}
	if acts := r.OnDeadline(t0.Add(500 * time.Millisecond)); len(acts) != 0 {
		t.Fatalf("before the deadline: %v", acts)
	}
	epoch := r.Epoch
	acts := r.OnDeadline(t0.Add(time.Second))
	if cw, ok := has[CancelWorker](acts); !ok || cw.Epoch != epoch || r.State != Failed || r.Err.Type != openai.ErrDeadlineExceeded {
		t.Fatalf("at the deadline: %v, state %s, err %v", acts, r.State, r.Err)
	}
	if acts := r.OnDeadline(t0.Add(2 * time.Second)); len(acts) != 0 {
		t.Fatal("a failed request failed again")
	}
}

// TestPullOutcome: the current transfer's answer sets the hand-off's path
// (and the bytes pulled); a stale one changes nothing and is counted.
func TestPullOutcome(t *testing.T) {
	d, p := Endpoint{"d", 3}, Endpoint{"p", 5}
	transferring := func() (*Request, Transfer) {
		r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
		rte, _ := has[Route](r.Start(t0))
		r.RoutedPD(rte.Epoch, d, p, t0)
		tr, ok := has[Transfer](r.OnPrefilled(r.Epoch, KVRef{From: p, Node: "n2", Keys: [][]byte{make([]byte, 32)}}, false, t0))
		if !ok {
			t.Fatal("no transfer")
		}
		return r, tr
	}
	r, tr := transferring()
	if acts := r.OnPulled(r.Epoch, tr.TransferEpoch+1, 4096, t0); len(acts) != 0 || r.StaleTransfers != 1 || r.PD != "" || r.TransferBytes != 0 {
		t.Fatalf("stale pull: %v, pd %q, bytes %d", acts, r.PD, r.TransferBytes)
	}
	if dis, ok := has[Dispatch](r.OnPulled(r.Epoch, tr.TransferEpoch, 4096, t0)); !ok || dis.To != d || r.PD != "transfer" || r.TransferBytes != 4096 {
		t.Fatalf("pull: %+v, pd %q, bytes %d", dis, r.PD, r.TransferBytes)
	}

	r, tr = transferring()
	if acts := r.OnPullFailed(r.Epoch-1, tr.TransferEpoch, t0); len(acts) != 0 || r.PD != "" {
		t.Fatalf("stale failure: %v, pd %q", acts, r.PD)
	}
	if dis, ok := has[Dispatch](r.OnPullFailed(r.Epoch, tr.TransferEpoch, t0)); !ok || dis.To != d || r.PD != "transfer_failed" || r.TransferBytes != 0 {
		t.Fatalf("failed pull: %+v, pd %q", dis, r.PD)
	}
}

// TestFencedRefusalKeepsTheInstance: a worker that refused the request
// because its agent could not prove its lease is alive and comes back at
// the same generation; the request routes again without excluding it and
// without spending the migration budget, and may be served there.
func TestFencedRefusalKeepsTheInstance(t *testing.T) {
	r := NewRequest("r", []int{1}, 10, time.Time{}, DefaultPolicy, t0)
	start(t, r, "a")
	for range 3 {
		epoch := r.Epoch
		acts := r.OnWorkerFenced(r.Epoch)
		rte, ok := has[Route](acts)
		if _, excluded := rte.Exclusion()["a"]; !ok || excluded {
			t.Fatalf("a fenced refusal excluded the instance for the request: %v", acts)
		}
		if cw, ok := has[CancelWorker](acts); !ok || cw.Epoch != epoch {
			t.Fatalf("the refused epoch's calls are not ended: %v", acts)
		}
		if acts := r.OnWorkerFenced(epoch); len(acts) != 0 {
			t.Fatalf("a stale epoch's refusal acted: %v", acts)
		}
		r.Routed(rte.Epoch, Endpoint{"a", 1}, t0)
	}
	if r.Migrations != 0 {
		t.Fatalf("fenced refusals spent %d migrations", r.Migrations)
	}
	if acts := r.OnFrame(frame(r, 1), t0); len(acts) == 0 {
		t.Fatal("the instance that refused while fenced could not serve the request afterwards")
	}
}
