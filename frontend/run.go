package frontend

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// event is what a request's run loop waits on.
type event struct {
	epoch    uint64
	frame    *wire.Frame
	more     []*wire.Frame   // received with frame, after it, in order
	from     reqfsm.Endpoint // the instance and generation the frame's stream was opened to
	err      error           // the worker stream broke
	failed   bool            // the instance was announced dead
	gone     bool            // the instance's registration vanished
	instance string
	gen      uint64 // the generation that died
	reason   string
	// P/D: a prefill's hand-off or failure, a transfer's answer.
	prefill  *prefillResult
	transfer *transferResult
}

type prefillResult struct {
	at  reqfsm.Endpoint
	kv  reqfsm.KVRef
	err error
}

type transferResult struct {
	transferEpoch uint64
	reply         *transferpb.PullReply
	err           error
}

// run interprets one request's state machine: it carries out the actions
// the machine returns and feeds the machine what comes back (frames,
// failures, hand-offs, timers). It decides nothing itself.
type run struct {
	s    *Server
	r    *reqfsm.Request
	body CompletionRequest
	st   *stream
	// events carries the worker streams' frames and the prefill and
	// transfer answers, in order (a sender waits while it is full);
	// notes the registry's announcements (dropped when full: a lost one
	// is caught by the stall timeout). Both are short: a request's run
	// holds them for its whole life, and a thousand open requests each
	// holding a thousand-event buffer was most of the frontend's memory
	// per stream (event is about 120 bytes).
	events chan event
	notes  chan event
	obs    observer
	// served are the numerics and guarantees of the decode instances
	// the request was routed to (the end says which guarantee held).
	served []servedBy
	// dispatched: a decode worker attempt was made (the next counts as a
	// retry in the amplification figure).
	dispatched bool
	// fullAt is the fewest open streams of this frontend an instance that
	// refused the request as overloaded held: re-routes go below it.
	fullAt int
	// hold counts the picked decode instance's stream until dispatch.
	hold   func()
	holdID string
	tl     timeline
	// cancelled is set once the request's context ended (the client
	// cancelled it, or the server stops).
	cancelled bool
	// wake is the capacity signal taken by the last route; waiting the
	// wait for capacity under way (nil when none).
	wake      <-chan struct{}
	waiting   *capacityWait
	waitUntil time.Time
	// rerouting is set while the route after a wait for capacity runs: it
	// is the same migration, not another.
	rerouting bool
	// overloaded is set once a worker refused the request as overloaded.
	overloaded  bool
	lastFailure string
	// drainFailure is the last DRAINING worker error's failure: the
	// migration is the drain's while it is still lastFailure.
	drainFailure string
	// streams cancels every worker call of each epoch (prefill, transfer,
	// decode); taken records the epochs whose decode stream opened.
	streams map[uint64]context.CancelFunc
	taken   map[uint64]bool
	on      string // instance currently serving
	// lastPrefill is the prefill instance that handed off last;
	// prefillNodes the nodes of prefill instances that failed this
	// request (they may have published blocks before dying).
	lastPrefill  string
	prefillNodes []string
	nodes        map[string]string // instance id → node, of instances used
	prefills     map[reqfsm.Endpoint]context.CancelFunc
	// promptTokens is the prompt under the built-in tokenizer (BOS
	// first; empty if it cannot be encoded); keys memoises prefixKeys per
	// KV identity, for keysAt received tokens.
	promptTokens []int
	keys         map[blockid.Identity][]blockid.BlockKey
	keysAt       int
	// takeover: the request was taken over from another frontend.
	takeover bool
	// unpublished: tokens were delivered that the stream's writers were
	// not shown yet (publish).
	unpublished bool
	// prefix is a taken-over request's output before its last migration,
	// from its record (takeoverStart puts it in the log).
	prefix []schema.RecordToken
}

func newRun(s *Server, r *reqfsm.Request, body CompletionRequest, st *stream) *run {
	return &run{s: s, r: r, body: body, st: st, events: make(chan event, runEvents), notes: make(chan event, runNotes), obs: observer{log: s.log, m: s.metrics, r: r, tr: s.startTrace(r, body), revision: s.revisionOf},
		streams: map[uint64]context.CancelFunc{}, taken: map[uint64]bool{}, nodes: map[string]string{},
		keys: map[blockid.Identity][]blockid.BlockKey{}, prefills: map[reqfsm.Endpoint]context.CancelFunc{}}
}

// The capacity of a run's channels: frames in flight to the run loop (a
// frame reader waits while they are full: each slot is 120 bytes of every
// relayed request, and a worker's frames queue in its QUIC stream
// meanwhile), and announcements not yet taken (a request is on one or two
// instances). A frame a waiting reader holds, like one still in the QUIC
// stream, can be overtaken by its worker's death announcement
// (drainEvents handles only the queued ones): the request then moves, and
// the next worker generates that token again, the same bits.
const (
	runEvents = 4
	runNotes  = 8
)

// capacityWait is a request's wait for an instance of its model: the
// registry's signal, and the wait's bound.
type capacityWait struct {
	epoch uint64
	wake  <-chan struct{}
	bound *time.Timer
}

// awaitCapacity starts waiting, on the signal the route that found
// nothing took.
func (x *run) awaitCapacity(a reqfsm.AwaitCapacity) {
	if !a.Until.Equal(x.waitUntil) { // a new wait, not a re-wait after a wake
		x.waitUntil = a.Until
		x.obs.awaitingCapacity(a.Until)
	}
	x.stopWait()
	// An instance avoided for a while (it failed or refused a request)
	// comes back without a registration: look again when it does.
	at := a.Until
	if lift := x.s.router.NextLift(time.Now()); !lift.IsZero() && lift.Before(at) {
		at = lift
	}
	x.waiting = &capacityWait{epoch: a.Epoch, wake: x.wake, bound: time.NewTimer(time.Until(at))}
}

// capacityChanged ends the wait: an instance registered, or the bound
// passed; the machine routes again.
func (x *run) capacityChanged() []reqfsm.Action {
	epoch := x.waiting.epoch
	x.stopWait()
	acts := x.r.CapacityChanged(epoch)
	x.rerouting = len(acts) > 0
	return acts
}

func (x *run) stopWait() {
	if x.waiting != nil {
		x.waiting.bound.Stop()
		x.waiting = nil
	}
}

// waitChans are the channels of the wait under way (nil when none).
func (x *run) waitChans() (<-chan struct{}, <-chan time.Time) {
	if x.waiting == nil {
		return nil, nil
	}
	return x.waiting.wake, x.waiting.bound.C
}

// notify hands an announcement to the run loop without blocking the
// registry watcher; a lost announcement is caught by the stall timeout.
func (x *run) notify(e event) {
	select {
	case x.notes <- e:
	default:
	}
}

// deliver hands a worker frame to the run loop, waiting while it is busy:
// a frame is never dropped. ctx is the worker stream's.
func (x *run) deliver(ctx context.Context, e event) {
	select {
	case x.events <- e:
	case <-ctx.Done():
	}
}

// loop drives the request's state machine until it ends.
func (x *run) loop(ctx context.Context) {
	defer x.cancelAll()
	acts := x.begin(ctx, time.Now())
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var deadline <-chan time.Time
	if !x.r.Deadline.IsZero() {
		t := time.NewTimer(time.Until(x.r.Deadline))
		defer t.Stop()
		deadline = t.C
	}
	for !x.execAll(ctx, acts) {
		x.publish()
		wake, bound := x.waitChans()
		select {
		case <-ctx.Done():
			acts = x.onCancel(ctx)
		case <-wake:
			acts = x.capacityChanged()
		case <-bound:
			acts = x.capacityChanged()
		case e := <-x.events:
			var finished bool
			if e, finished = x.handleAllButLast(ctx, e); finished {
				return
			}
			acts = x.handle(e, time.Now())
		case e := <-x.notes:
			if x.drainEvents(ctx) {
				return
			}
			acts = x.handle(e, time.Now())
		case <-deadline:
			acts = x.r.OnDeadline(time.Now())
		case <-tick.C:
			acts = x.machineFound(x.r.Epoch, x.r.Tick(time.Now()))
			x.s.reapIdle(x.st)
			if x.st.rec != nil {
				x.s.recs.refresh(ctx, x.st.rec)
			}
		}
	}
}

// drainEvents handles the events already waiting, before an announcement:
// an announcement does not overtake the frames its worker sent before
// (the two travel on separate channels). True once the request has
// finished.
func (x *run) drainEvents(ctx context.Context) bool {
	for len(x.events) > 0 {
		e, finished := x.handleAllButLast(ctx, <-x.events)
		if finished || x.execAll(ctx, x.handle(e, time.Now())) {
			return true
		}
	}
	return false
}

// execAll carries out acts, and the actions they lead to, in order; true
// once the request has finished.
func (x *run) execAll(ctx context.Context, acts []reqfsm.Action) bool {
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		if _, ok := a.(reqfsm.Finish); ok {
			x.finish()
			return true
		}
		acts = append(acts, x.exec(ctx, a)...)
	}
	return false
}

// exec carries out one action; what it returns comes from the machine.
func (x *run) exec(ctx context.Context, a reqfsm.Action) []reqfsm.Action {
	if _, ok := a.(reqfsm.Deliver); !ok {
		// What was delivered reaches the client before anything that
		// may wait (a route, a dial, a prefill of a migration).
		x.publish()
	}
	switch a := a.(type) {
	case reqfsm.Route:
		return x.execRoute(a)
	case reqfsm.Dispatch:
		return x.execDispatch(ctx, a)
	case reqfsm.Deliver:
		x.execDeliver(a)
	case reqfsm.Prefill:
		x.tl.markPrefillSent(time.Now())
		x.obs.prefill(a)
		return x.prefill(ctx, a)
	case reqfsm.PrefillFailed:
		x.execPrefillFailed(a)
	case reqfsm.RoutePrefill:
		return x.routePrefill(a)
	case reqfsm.Transfer:
		x.tl.markTransferSent(time.Now())
		x.obs.transfer(a)
		x.transfer(ctx, a)
	case reqfsm.AwaitCapacity:
		x.awaitCapacity(a)
	case reqfsm.CancelWorker:
		if c, ok := x.streams[a.Epoch]; ok {
			c()
			delete(x.streams, a.Epoch)
		}
	}
	return nil
}

func (x *run) execRoute(a reqfsm.Route) []reqfsm.Action {
	if x.r.State == reqfsm.Migrating && !x.rerouting {
		x.obs.migrating(x.lastFailure)
		if x.drainFailure != "" && x.drainFailure == x.lastFailure {
			x.obs.drainMigration()
		}
		x.tl.migrating(time.Now())
	}
	x.rerouting = false
	acts := x.route(a)
	if x.r.State == reqfsm.Prefilling {
		x.tl.markRouted(time.Now())
	}
	return acts
}

func (x *run) execDispatch(ctx context.Context, d reqfsm.Dispatch) []reqfsm.Action {
	x.obs.dispatch(d)
	x.tl.markDecodeSent(time.Now())
	acts := x.dispatch(ctx, d)
	if x.taken[d.Epoch] {
		x.st.taken()
	}
	x.tl.markDispatched(time.Now())
	return acts
}

func (x *run) execDeliver(d reqfsm.Deliver) {
	x.overloaded = false
	now := time.Now()
	if x.r.PD != "" && x.r.Output.Len() == d.Tokens {
		x.tl.markFirstToken(now)
	}
	if took, ok := x.tl.markRecovered(now); ok {
		x.obs.recovered(took)
	}
	x.unpublished = true // published once the event is handled, or before an action that may wait
	x.s.metrics.tokens.Add(float64(d.Tokens))
}

// execPrefillFailed ends a failed prefill instance's part. Every way one
// fails (stream error, death announcement, stall) ends up here once.
func (x *run) execPrefillFailed(a reqfsm.PrefillFailed) {
	x.obs.prefillFailed()
	x.prefillNodes = append(x.prefillNodes, x.nodeOf(a.At.InstanceID))
	x.endPrefill(a.At)
	x.s.dropClient(a.At)
}

func (x *run) finish() {
	x.publish() // the last tokens before the end
	x.obs.finished()
	end := x.summary()
	x.st.finish(x.r, end)
	if x.st.rec != nil {
		x.s.goes.Go(func() { x.s.recs.complete(context.WithoutCancel(x.s.ctx), x.st, x.r, end) })
	}
	x.s.forgetLater(x.st)
}

// summary is the lifeline object of the request's end.
func (x *run) summary() sse.Lifeline {
	r := x.r
	l := sse.Lifeline{RequestID: r.ID, Migrations: r.Migrations, KVReusedPositions: r.ReusedPositions, LastMigration: x.tl.lastMigration(),
		ToolCalls: callIDs(r.ID, x.body.ToolCalls, r.Output.Tokens())}
	if r.PD != "" {
		l.PD, l.KVTransferBytes, l.PDTimelineMs = r.PD, r.TransferBytes, x.tl.pdMs()
	}
	if r.Migrations > 0 {
		l.Continuation = continuation(x.served)
	}
	return l
}

// servedBy is what a request knows of an instance it was routed to.
type servedBy struct{ numerics, guarantee string }

// continuation is the guarantee a migrated request's output kept, from
// the instances it was routed to: the weakest they claim when they
// share their numerics; "prefix" when they do not (the committed
// tokens are kept, the rest is what the other numerics compute); ""
// when one did not say.
func continuation(served []servedBy) string {
	order := []string{"bit-exact", "token-exact", "inexact"}
	worst := 0
	for _, s := range served {
		if s.numerics != served[0].numerics {
			return "prefix"
		}
		i := slices.Index(order, s.guarantee)
		if i < 0 {
			return ""
		}
		worst = max(worst, i)
	}
	if len(served) == 0 {
		return ""
	}
	return order[worst]
}

// onCancel: the request's context ended. Its cause tells a client's
// cancel (DELETE, or its disconnect) from this frontend stopping: only
// the first is reported as cancelled by the client.
func (x *run) onCancel(ctx context.Context) []reqfsm.Action {
	if x.cancelled {
		return x.r.CancelDone()
	}
	x.cancelled = true
	x.stopWait()
	if to, ok := context.Cause(ctx).(*takenOver); ok {
		return x.r.TakenOver(to.url)
	}
	if !isClientCancel(context.Cause(ctx)) {
		return x.r.Stop()
	}
	return append(x.r.Cancel(), x.r.CancelDone()...)
}

// handle feeds an event to the machine.
func (x *run) handle(e event, now time.Time) []reqfsm.Action {
	switch {
	case e.failed:
		return x.onAnnouncedFailure(e, now)
	case e.gone:
		return x.machineFound(x.r.Epoch, x.r.OnDeregistered(e.instance, now))
	case e.prefill != nil:
		return x.onPrefillResult(e.epoch, e.prefill, now)
	case e.transfer != nil:
		return x.onTransferResult(e.epoch, e.transfer, now)
	case e.err != nil:
		x.lastFailure = e.err.Error()
		return x.r.OnWorkerFailed(e.epoch, e.err.Error(), true, now)
	case e.frame.Error != nil:
		return x.onWorkerError(e.epoch, e.frame.Error, now)
	}
	f := e.frame
	if f.FinishReason != "" && f.RequestEpoch == x.r.Epoch {
		x.st.setWorkerPromptLen(int(f.PromptTokens))
	}
	return x.r.OnFrame(reqfsm.Frame{From: e.from, Epoch: f.RequestEpoch, SequenceNo: int(f.SequenceNo),
		TokenID: int(f.TokenId), Text: f.Text, FinishReason: f.FinishReason, ReusedPositions: int(f.ReusedPositions),
		Logprobs: x.frameLogprobs(f)}, now)
}

// machineFound keeps the machine's reason as the last failure when acts,
// from an event that is not a failure (a tick, a deregistration), moved
// the request past epoch: a worker silent too long.
func (x *run) machineFound(epoch uint64, acts []reqfsm.Action) []reqfsm.Action {
	if x.r.Epoch != epoch && x.r.LastFailure != "" {
		x.lastFailure = x.r.LastFailure
	}
	return acts
}

// onAnnouncedFailure: the registry announced an instance's death; it
// fails this request's prefill or decode instance if it is that endpoint
// (at that generation or an older one).
func (x *run) onAnnouncedFailure(e event, now time.Time) []reqfsm.Action {
	r := x.r
	var acts []reqfsm.Action
	if e.instance == r.PrefillAt.InstanceID && (e.gen == 0 || r.PrefillAt.Generation <= e.gen) {
		x.lastFailure = e.reason
		acts = r.OnPrefillFailed(r.Epoch, r.PrefillAt, e.reason)
	}
	if e.instance == r.Endpoint.InstanceID && (e.gen == 0 || r.Endpoint.Generation <= e.gen) {
		x.lastFailure = e.reason
		acts = append(acts, r.OnWorkerFailed(r.Epoch, e.reason, true, now)...)
	}
	return acts
}

func (x *run) onPrefillResult(epoch uint64, res *prefillResult, now time.Time) []reqfsm.Action {
	if res.err != nil {
		x.lastFailure = res.err.Error()
		x.endPrefill(res.at) // a stale one too
		return x.r.OnPrefillFailed(epoch, res.at, res.err.Error())
	}
	acts := x.r.OnPrefilled(epoch, res.kv, res.kv.Node == x.nodeOf(x.r.Endpoint.InstanceID), now)
	if len(acts) > 0 { // accepted: the hand-off of the current prefill
		x.endPrefill(res.at)
		x.lastPrefill = res.at.InstanceID
		x.tl.markPrefilled(time.Now())
		x.obs.prefilled()
		if _, ok := acts[0].(reqfsm.Dispatch); ok {
			x.obs.handOff(x.r.PD)
		}
	}
	return acts
}

// onTransferResult: the decode node answered a pull. The current one's
// answer is timed and counted, a stale one only counted by the machine.
func (x *run) onTransferResult(epoch uint64, tr *transferResult, now time.Time) []reqfsm.Action {
	if tr.err != nil || tr.reply.Error != "" {
		why := fmt.Sprint(tr.err)
		if tr.err == nil {
			why = tr.reply.Error
		}
		acts := x.r.OnPullFailed(epoch, tr.transferEpoch, now)
		if len(acts) > 0 {
			x.tl.markTransferred(time.Now())
			x.obs.transferFailed(why)
		}
		return acts
	}
	acts := x.r.OnPulled(epoch, tr.transferEpoch, tr.reply.Bytes, now)
	if len(acts) > 0 {
		x.tl.markTransferred(time.Now())
		x.obs.transferred(tr.reply.Bytes)
	}
	return acts
}

// onWorkerError: the worker answered with a typed error.
func (x *run) onWorkerError(epoch uint64, e *wire.Error, now time.Time) []reqfsm.Action {
	switch {
	case e.Code == wire.Code_OVERLOADED && x.r.Received() == 0:
		// Busy, not broken: try elsewhere without spending the migration
		// budget, and answer 429 if every instance is.
		x.overloaded = true
		x.lastFailure = "overloaded: " + e.Message
		if epoch == x.r.Epoch {
			if n := x.s.router.Full(x.r.Endpoint.InstanceID, x.body.Priority, now); x.fullAt == 0 || n < x.fullAt {
				x.fullAt = n
			}
		}
		return x.r.OnOverloaded(epoch)
	case e.Code == wire.Code_FENCED:
		// Alive, its agent between leases: nothing was done. Avoided
		// until it registers again, never excluded for good: it may be
		// the only instance of the model.
		x.lastFailure = "worker refused (fenced): " + e.Message
		if epoch == x.r.Epoch {
			x.s.router.Fenced(x.r.Endpoint.InstanceID, x.r.Endpoint.Generation, now)
		}
		return x.r.OnWorkerFenced(epoch)
	case e.Code == wire.Code_TAKEN_OVER:
		// Another frontend attached to the sequence: it drives the
		// request now, and this one's client resumes there.
		if epoch == x.r.Epoch {
			x.s.goes.Go(func() { x.s.lostTo(x.st, x.takenOverBy(context.Background())) })
		}
		return nil
	case e.Code == wire.Code_CANCELLED:
		// This frontend cancels a worker call by resetting its stream and
		// reads nothing after: a cancel that arrives is the worker's own
		// (it is stopping), not the client's. Another worker continues.
		x.lastFailure = "the worker ended the stream: " + e.Message
		return x.r.OnWorkerFailed(epoch, x.lastFailure, true, now)
	}
	x.lastFailure = fmt.Sprintf("worker error %s: %s", e.Code, e.Message)
	if e.Code == wire.Code_DRAINING {
		x.drainFailure = x.lastFailure
		return x.r.OnWorkerDraining(epoch, e.Message, now)
	}
	return x.r.OnWorkerFailed(epoch, e.Message, e.Retryable, now)
}

func (x *run) cancelAll() {
	x.stopWait()
	x.releaseHold()
	for _, c := range x.streams {
		c()
	}
	x.s.untrack(x)
}
