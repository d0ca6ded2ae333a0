package reqfsm

import (
	"fmt"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// Action is what the state machine asks the I/O layer to do.
type Action interface{ isAction() }

// Dispatch asks for the request to be sent to To at Epoch, continuing
// after Prefix (prompt ‖ prefix is re-prefilled; tokens continue at
// len(Prefix)+1).
type Dispatch struct {
	To     Endpoint
	Epoch  uint64
	Prefix []int
}

// Deliver asks for the log's Tokens newest committed tokens to be written
// to the client.
type Deliver struct{ Tokens int }

// Finish ends the request (FinishReason or Err set on the request).
type Finish struct{}

// CancelWorker asks for the worker stream of Epoch to be cancelled.
type CancelWorker struct {
	At    Endpoint
	Epoch uint64
}

// Route asks the router for an instance, excluding Exclude up to the
// generations in Generations (a restart is a new endpoint); the I/O layer
// answers with Routed or NoRoute.
type Route struct {
	Epoch       uint64
	Exclude     map[string]bool
	Generations map[string]uint64
}

// Prefill asks the prefill instance At to compute and publish the
// prompt's KV (the first half of a P/D split) at Epoch.
type Prefill struct {
	At    Endpoint
	Epoch uint64
}

// RoutePrefill asks the router for another prefill instance, excluding
// like Route; the I/O layer answers with PrefillRouted.
type RoutePrefill struct {
	Epoch       uint64
	Exclude     map[string]bool
	Generations map[string]uint64
}

// Transfer asks the decode instance's node to pull the prompt's published
// blocks from the prefill node, under (Epoch, TransferEpoch).
type Transfer struct {
	To            Endpoint
	Epoch         uint64
	TransferEpoch uint64
	KV            KVRef
}

// KVRef is a prefill's hand-off: the keys of the prompt's published full
// blocks, the instance that wrote them and the node that holds them.
type KVRef struct {
	From   Endpoint
	Node   string
	KVAddr string
	Keys   [][]byte
}

// PrefillFailed reports that the prefill instance At failed the request:
// its call ends, and its node may hold blocks it published.
type PrefillFailed struct{ At Endpoint }

func (PrefillFailed) isAction() {}
func (Prefill) isAction()       {}
func (RoutePrefill) isAction()  {}
func (Transfer) isAction()      {}
func (Dispatch) isAction()      {}
func (Deliver) isAction()       {}
func (Finish) isAction()        {}
func (CancelWorker) isAction()  {}
func (Route) isAction()         {}

// Start begins the first attempt: ask for a route.
func (r *Request) Start(now time.Time) []Action {
	if r.State != Admitted {
		return nil
	}
	r.lastFrame = now
	return []Action{r.route()}
}

// Routed is the router's answer for epoch.
func (r *Request) Routed(epoch uint64, to Endpoint, now time.Time) []Action {
	if epoch != r.Epoch || r.State.Terminal() || r.State == Cancelling {
		return nil
	}
	if acts, ok := r.spendRetry(); !ok {
		return acts
	}
	r.Endpoint = to
	r.State = Prefilling
	r.lastFrame = now
	r.endWait(now)
	return r.dispatchDecode()
}

// spendRetry takes a retry budget token for a re-route after an overload
// refusal that found an instance; without one the request fails typed.
func (r *Request) spendRetry() ([]Action, bool) {
	if !r.retryPending {
		return nil, true
	}
	r.retryPending = false
	if !r.Policy.Retries.Spend() {
		return r.fail(openai.ErrRetryBudget, "the frontend's retry budget refused a retry; the cluster is overloaded"), false
	}
	return nil, true
}

// RoutedPD is the router's answer for epoch when the request is split:
// decode on d after prefill on p. The prefill runs first.
func (r *Request) RoutedPD(epoch uint64, d, p Endpoint, now time.Time) []Action {
	if epoch != r.Epoch || r.State.Terminal() || r.State == Cancelling {
		return nil
	}
	if acts, ok := r.spendRetry(); !ok {
		return acts
	}
	r.Endpoint, r.PrefillAt = d, p
	r.State = Prefilling
	r.lastFrame = now
	r.endWait(now)
	return []Action{Prefill{At: p, Epoch: r.Epoch}}
}

// OnPrefilled: the prefill instance published the prompt's blocks. On the
// decode instance's node they are read in place; elsewhere they are
// pulled first (TRANSFERRING).
func (r *Request) OnPrefilled(epoch uint64, kv KVRef, sameNode bool, now time.Time) []Action {
	if epoch != r.Epoch || r.State != Prefilling || kv.From != r.PrefillAt {
		r.StaleEpochFrames++
		return nil
	}
	r.PrefillAt = Endpoint{}
	r.lastFrame = now
	if sameNode || len(kv.Keys) == 0 {
		r.PD = "same_node"
		if len(kv.Keys) == 0 {
			r.PD = "no_full_block"
		}
		return r.dispatchDecode()
	}
	r.State = Transferring
	r.TransferEpoch++
	return []Action{Transfer{To: r.Endpoint, Epoch: r.Epoch, TransferEpoch: r.TransferEpoch, KV: kv}}
}

// OnPrefillFailed: the prefill instance died or refused before handing
// off. Nothing it wrote is readable unless published; prefill again
// elsewhere, and after MaxPrefillAttempts let the decode instance compute
// the prompt itself. The client sees no error either way.
func (r *Request) OnPrefillFailed(epoch uint64, at Endpoint, reason string) []Action {
	if epoch != r.Epoch || r.State != Prefilling || at != r.PrefillAt {
		r.StaleEpochFrames++
		return nil
	}
	r.excludeEndpoint(at)
	r.PrefillFailures++
	r.PrefillAt = Endpoint{}
	failed := PrefillFailed{At: at}
	if r.PrefillFailures >= MaxPrefillAttempts {
		r.PD = "recompute"
		return append([]Action{failed}, r.dispatchDecode()...)
	}
	return []Action{failed, RoutePrefill{Epoch: r.Epoch, Exclude: r.FailedInstances, Generations: r.FailedGenerations}}
}

// MaxPrefillAttempts bounds the prefill instances one request tries
// before its decode instance prefills by itself.
const MaxPrefillAttempts = 2

// PrefillRouted answers RoutePrefill; ok is false when no prefill instance
// is left, and the decode instance prefills by itself.
func (r *Request) PrefillRouted(epoch uint64, p Endpoint, ok bool, now time.Time) []Action {
	if epoch != r.Epoch || r.State != Prefilling {
		return nil
	}
	if !ok {
		r.PD = "recompute"
		return r.dispatchDecode()
	}
	r.PrefillAt = p
	r.lastFrame = now
	return []Action{Prefill{At: p, Epoch: r.Epoch}}
}

// OnTransferred: the decode node answered the pull of (epoch,
// transferEpoch). Only the current transfer counts; a late answer of an
// older one is dropped and counted. Whether the pull succeeded or not the
// decode instance starts: it reuses what was published and computes the
// rest.
func (r *Request) OnTransferred(epoch, transferEpoch uint64, now time.Time) []Action {
	if epoch != r.Epoch || transferEpoch != r.TransferEpoch || r.State != Transferring {
		r.StaleTransfers++
		return nil
	}
	r.lastFrame = now
	return r.dispatchDecode()
}

// OnPulled: the decode node pulled the prompt's blocks, bytes of them,
// for (epoch, transferEpoch). Like OnTransferred; when it counts, the
// hand-off's path is "transfer".
func (r *Request) OnPulled(epoch, transferEpoch, bytes uint64, now time.Time) []Action {
	acts := r.OnTransferred(epoch, transferEpoch, now)
	if len(acts) > 0 {
		r.PD, r.TransferBytes = "transfer", bytes
	}
	return acts
}

// OnPullFailed: the decode node could not pull the blocks for (epoch,
// transferEpoch). Like OnTransferred; when it counts, the hand-off's path
// is "transfer_failed" and the decode instance computes what it lacks.
func (r *Request) OnPullFailed(epoch, transferEpoch uint64, now time.Time) []Action {
	acts := r.OnTransferred(epoch, transferEpoch, now)
	if len(acts) > 0 {
		r.PD = "transfer_failed"
	}
	return acts
}

func (r *Request) dispatchDecode() []Action {
	return []Action{Dispatch{To: r.Endpoint, Epoch: r.Epoch, Prefix: r.Output.IDs()}}
}

func (r *Request) fail(typ openai.ErrorType, msg string) []Action {
	r.Err = &RequestError{Type: typ, Message: msg}
	return []Action{r.bump(Failed), Finish{}}
}

// bump is the compare-and-swap point of every change of who may produce
// tokens (migrate, re-route, cancel, fail): the request moves to next at a
// new epoch with nobody attached, the old epoch's frames, prefill and
// transfer answers are stale from here, and its worker calls are ended.
func (r *Request) bump(next State) CancelWorker {
	at := r.Endpoint
	r.State = next
	r.Epoch++
	r.Endpoint, r.PrefillAt = Endpoint{}, Endpoint{}
	return CancelWorker{At: at, Epoch: r.Epoch - 1}
}

// Frame is one token frame from a worker.
type Frame struct {
	From       Endpoint
	Epoch      uint64
	SequenceNo int
	TokenID    int
	Text       string
	// FinishReason is set on the frame that ends the worker's stream.
	FinishReason string
	// ReusedPositions (finish frame) counts prompt positions whose K/V the
	// worker read from the arena instead of computing.
	ReusedPositions int
	// Logprobs of the token, when the request asked for them.
	Logprobs *TokenLogprobs
}

// deliverOne is OnFrame's answer to a token's frame. It is shared:
// callers read the actions a machine returns and never write them (the
// slice has no room, so an append copies it).
var deliverOne = []Action{Deliver{Tokens: 1}}[:1:1]

// OnFrame commits a worker's token if it is the next one of the current
// epoch. Older epochs are dropped, repeats are dropped, a gap is a failure
// of that worker (it lost tokens) and migrates.
func (r *Request) OnFrame(f Frame, now time.Time) []Action {
	if f.Epoch != r.Epoch || f.From != r.Endpoint || r.State.Terminal() || r.State == Cancelling {
		r.StaleEpochFrames++
		return nil
	}
	r.lastFrame = now
	if r.State == Prefilling || r.State == Transferring {
		r.State = Decoding
	}
	var acts []Action
	if f.SequenceNo != 0 {
		switch next := r.Received() + 1; {
		case f.SequenceNo < next:
			r.DuplicateFrames++
			return nil
		case f.SequenceNo > next:
			r.Gaps++
			return r.OnWorkerFailed(f.Epoch, fmt.Sprintf("sequence gap: got %d, expected %d", f.SequenceNo, next), true, now)
		}
		r.Output.Add(Token{SequenceNo: f.SequenceNo, ID: f.TokenID, Text: f.Text, Logprobs: f.Logprobs, Instance: f.From.InstanceID})
		if f.FinishReason == "" {
			return deliverOne // a token's frame, the common case: no allocation
		}
		acts = append(acts, Deliver{Tokens: 1})
	}
	if f.FinishReason != "" {
		r.Policy.Retries.Succeeded()
		r.State = Completed
		r.FinishReason = f.FinishReason
		r.ReusedPositions = f.ReusedPositions
		acts = append(acts, Finish{})
	}
	return acts
}

// OnWorkerFailed: the worker of epoch broke (stream reset, connection
// lost, typed retryable error, stall, drain notice). Migrate if the
// request is migratable, or fail fast with a typed error. Never loops: the
// failed instance is excluded, and the budget bounds attempts.
func (r *Request) OnWorkerFailed(epoch uint64, reason string, retryable bool, now time.Time) []Action {
	return r.workerFailed(epoch, reason, retryable, false, now)
}

// OnWorkerDraining: the worker of epoch ended the request because its
// node drains (a retryable DRAINING error). It migrates like any
// retryable failure, but a migration that finds no routable instance
// ends at once with draining: the node is going away and nothing else
// serves the model, so waiting for capacity would only hold the client.
func (r *Request) OnWorkerDraining(epoch uint64, reason string, now time.Time) []Action {
	return r.workerFailed(epoch, reason, true, true, now)
}

// workerFailed is OnWorkerFailed; drain says the worker's node drains.
func (r *Request) workerFailed(epoch uint64, reason string, retryable, drain bool, now time.Time) []Action {
	if epoch != r.Epoch || !r.State.running() {
		r.StaleEpochFrames++
		return nil
	}
	if r.Received() >= r.MaxTokens && r.State == Decoding {
		// Every token is in, only the finish frame was lost (a worker
		// exiting right after its last write): nothing is left to
		// migrate, and the request ended by its length.
		r.State, r.FinishReason = Completed, "length"
		return []Action{CancelWorker{At: r.Endpoint, Epoch: r.Epoch}, Finish{}}
	}
	r.excludeEndpoint(r.Endpoint)
	r.LastFailure = reason
	switch {
	case !retryable:
		return r.fail(openai.ErrInvalidRequest, reason)
	case r.Migrations >= r.Policy.MigrationBudget:
		return r.fail(openai.ErrMigrationExhausted, fmt.Sprintf("%d migrations used; last failure: %s", r.Migrations, reason))
	case !r.Deadline.IsZero() && now.Add(time.Duration(len(r.Prompt)+r.Received())*r.Policy.PrefillPerToken).After(r.Deadline):
		return r.fail(openai.ErrDeadlineExceeded, "the deadline does not cover a re-prefill of "+fmt.Sprint(len(r.Prompt)+r.Received())+" tokens")
	}
	// A failure's migration is charged to the retry budget, never refused
	// by it: no single worker's death may end the streams it served.
	r.Policy.Retries.Charge()
	r.Migrations++
	r.drainMigration = drain
	cw := r.bump(Migrating)
	return []Action{cw, r.route()}
}

// OnOverloaded: the worker of epoch refused the request as overloaded
// before producing anything. Route elsewhere without spending the
// migration budget; the busy instance is excluded for this request.
func (r *Request) OnOverloaded(epoch uint64) []Action {
	if epoch != r.Epoch || !r.State.running() || r.Received() > 0 {
		return nil
	}
	r.excludeEndpoint(r.Endpoint)
	// The retry budget pays when the re-route finds an instance
	// (spendRetry): finding none costs no worker an attempt.
	r.retryPending = true
	cw := r.bump(Migrating)
	return []Action{cw, r.route()}
}

// OnWorkerFenced: the worker of epoch refused the request before doing
// anything because its agent cannot prove its lease (an etcd election or
// partition). The instance is alive and comes back at the same
// generation once the lease is renewed, so it is not excluded for this
// request (the router avoids it meanwhile) and no migration is spent:
// route again, and wait for capacity if nothing else serves the model.
func (r *Request) OnWorkerFenced(epoch uint64) []Action {
	if epoch != r.Epoch || !r.State.running() {
		return nil
	}
	r.retryPending = true
	cw := r.bump(Migrating)
	return []Action{cw, r.route()}
}

// OnDeadline ends the request with a typed error once its deadline has
// passed, whatever it is doing (routing, prefilling, migrating, decoding).
func (r *Request) OnDeadline(now time.Time) []Action {
	if r.Deadline.IsZero() || now.Before(r.Deadline) || r.State.Terminal() || r.State == Cancelling {
		return nil
	}
	return r.fail(openai.ErrDeadlineExceeded, fmt.Sprintf("deadline passed after %d tokens", r.Received()))
}

// OnDeregistered: instance's registration is gone (its lease expired or
// its agent removed it). A stream still coming from it goes on (the data
// plane does not need etcd); from now on, silence from it is given up on
// after GoneSilence rather than StallTimeout — nothing renews it.
func (r *Request) OnDeregistered(instance string, now time.Time) []Action {
	for _, ep := range []Endpoint{r.Endpoint, r.PrefillAt} {
		if ep.InstanceID == instance && !slices.Contains(r.gone, ep) {
			r.gone = append(r.gone, ep)
		}
	}
	return r.Tick(now)
}

// stallTimeout is how much silence Tick allows from ep: GoneSilence once
// it is gone and was streaming tokens (a long prefill sends nothing for
// a while, and is waited for as long as ever).
func (r *Request) stallTimeout(ep Endpoint) time.Duration {
	if r.Policy.GoneSilence > 0 && r.State == Decoding && slices.Contains(r.gone, ep) {
		return min(r.Policy.StallTimeout, r.Policy.GoneSilence)
	}
	return r.Policy.StallTimeout
}

// Tick checks the inactivity timeout.
func (r *Request) Tick(now time.Time) []Action {
	if !r.State.running() || r.State == Migrating || r.State == Admitted {
		return nil
	}
	waiting := r.Endpoint
	if r.State == Prefilling && r.PrefillAt != (Endpoint{}) {
		waiting = r.PrefillAt
	}
	if now.Sub(r.lastFrame) > r.stallTimeout(waiting) {
		if r.State == Prefilling && r.PrefillAt != (Endpoint{}) {
			// The prefill instance is what stalls, not the decode one.
			r.lastFrame = now
			return r.OnPrefillFailed(r.Epoch, r.PrefillAt, fmt.Sprintf("no hand-off for %v", now.Sub(r.lastFrame)))
		}
		return r.OnWorkerFailed(r.Epoch, fmt.Sprintf("no frame for %v", now.Sub(r.lastFrame)), true, now)
	}
	if !r.Deadline.IsZero() && now.After(r.Deadline) {
		return r.fail(openai.ErrDeadlineExceeded, "deadline passed")
	}
	return nil
}

// Cancel is a client cancel. It bumps the epoch, so that a migration
// completing later produces nothing; terminal states stay as they are.
func (r *Request) Cancel() []Action {
	if r.State.Terminal() || r.State == Cancelling {
		return nil
	}
	return []Action{r.bump(Cancelling)}
}

// Stop ends the request because this frontend stops: a typed, retryable
// frontend_stopping error, never a client cancel. A client's cancel that
// came first stays a cancel.
func (r *Request) Stop() []Action {
	switch {
	case r.State.Terminal():
		return nil
	case r.State == Cancelling:
		return r.CancelDone()
	}
	return r.fail(openai.ErrFrontendStopping, fmt.Sprintf("the frontend stopped after %d tokens", r.Received()))
}

// CancelDone: the worker confirmed (or could not be reached).
func (r *Request) CancelDone() []Action {
	if r.State != Cancelling {
		return nil
	}
	r.State = Cancelled
	r.Err = &RequestError{Type: openai.ErrCancelledType, Message: "cancelled by the client"}
	return []Action{Finish{}}
}
