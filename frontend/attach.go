package frontend

import (
	"context"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// A request with a record is detachable on its worker: when its frontend
// vanishes (killed, or stopping and handing its streams over) the worker
// keeps generating into a bounded log for a grace period. The frontend
// that takes the request over attaches to that sequence at its own (higher)
// epoch and receives every frame from sequence 1 on, buffered then live:
// no recomputation, and the same frames the first owner got. Only when no
// worker holds the request any more does it regenerate from the record.

// maxDetachGrace bounds how long a worker keeps a request whose frontend
// vanished (the resume window when shorter).
const maxDetachGrace = 30 * time.Second

// attachTimeout bounds a takeover's search for the worker that holds the
// request: every instance of the model is asked at once.
const attachTimeout = 3 * time.Second

// detachGrace is the grace a worker gives this request when its stream
// ends without a cancel: 0 (the stream's end cancels it) without a record.
func (x *run) detachGrace() uint32 {
	if x.st.rec == nil {
		return 0
	}
	return uint32(min(x.s.resumeWindow(), maxDetachGrace).Milliseconds())
}

// attached is a worker stream an Attach opened and the worker accepted.
type attached struct {
	at reqfsm.Endpoint
	c  *pooled
	st *workerclient.Stream
}

// attach looks for the worker that holds the request: an Attach at the
// run's epoch, from the sequence after what the run holds (the record's
// prefix, after a migration), to every known instance of the model. At
// most one holds it; the first to answer with a frame of the request
// wins. ctx is the epoch's: CancelWorker ends the winner's stream.
func (x *run) attach(ctx context.Context) (attached, bool) {
	ins := x.s.router.InstancesOf(x.body.Model)
	actx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	won := make(chan attached, len(ins))
	var wg sync.WaitGroup
	for _, in := range ins {
		wg.Go(func() {
			if a, ok := x.tryAttach(actx, ctx, reqfsm.Endpoint{InstanceID: in.ID, Generation: in.Generation}); ok {
				won <- a
			}
		})
	}
	all := make(chan struct{})
	x.s.goes.Go(func() { wg.Wait(); close(won); close(all) })
	select {
	case a, ok := <-won:
		if !ok { // closed: every instance answered, none holds it
			return attached{}, false
		}
		// The holder answered: the others are not waited for (a second
		// holder cannot be; if one answers, it is let go).
		cancel()
		x.s.goes.Go(func() {
			<-all
			for extra := range won {
				extra.st.Cancel()
				x.s.pool.release(extra.c)
			}
		})
		return a, true
	case <-all:
		a, ok := <-won
		return a, ok
	}
}

// tryAttach asks one instance for the request. The Attach's stream lives
// under ctx (the epoch's); actx bounds the wait for its first answer.
func (x *run) tryAttach(actx, ctx context.Context, ep reqfsm.Endpoint) (attached, bool) {
	c, err := x.s.client(actx, ep)
	if err != nil {
		return attached{}, false
	}
	st, err := c.c.Attach(ctx, &wire.Attach{RequestId: x.r.ID, RequestEpoch: x.r.Epoch, FromSequenceNo: int32(x.r.Received() + 1)})
	if err != nil {
		x.s.pool.release(c)
		return attached{}, false
	}
	type answer struct {
		f   *wire.Frame
		err error
	}
	ch := make(chan answer, 1)
	x.s.goes.Go(func() { f, err := st.Next(); ch <- answer{f, err} })
	select {
	case a := <-ch:
		// The worker accepts with a frame of sequence 0 (no token, no
		// error); a refusal is one error frame.
		if a.err == nil && a.f.Error == nil && a.f.SequenceNo == 0 && a.f.FinishReason == "" {
			return attached{at: ep, c: c, st: st}, true
		}
	case <-actx.Done():
		st.Cancel()
		<-ch
	}
	st.Cancel()
	x.s.pool.release(c)
	return attached{}, false
}

// takeoverStart starts a request taken over from another frontend:
// attached to the sequence still running (or just finished) on its
// worker, or, when no worker holds it, regenerated from the record with
// the same prompt, parameters and seed (by the determinism contract the
// log refills bit-identically from sequence 1). Either way the resuming
// client is served after its Last-Event-ID.
func (x *run) takeoverStart(ctx context.Context, now time.Time) []reqfsm.Action {
	// Not under the request's context: a request taken over only to be
	// cancelled (a DELETE at this frontend) attaches first, so that the
	// cancel reaches its worker's sequence. CancelWorker and the run's
	// end close the stream.
	sctx := x.epochCtx(context.WithoutCancel(ctx), x.r.Epoch)
	// The output delivered before the request's last migration comes
	// from its record: the continuation's worker holds what follows
	// (it starts after the prefix), and a regeneration continues after
	// it too.
	if len(x.prefix) > 0 {
		addRecordTokens(&x.r.Output, x.prefix)
		x.st.publish(x.r.Output.View())
		x.prefix = nil
	}
	a, ok := x.attach(sctx)
	if !ok {
		if ctx.Err() != nil {
			return nil // cancelled meanwhile: the loop ends it
		}
		// Regenerate at the next epoch: a holder that answered too late
		// (and was cancelled) may still hold the request at this one.
		x.streams[x.r.Epoch]()
		delete(x.streams, x.r.Epoch)
		x.r.Epoch++
		x.obs.takeover("regenerated")
		return x.r.Start(now)
	}
	x.obs.takeover("attached")
	x.tokenize() // not routed: the usage still counts the prompt
	acts := x.r.Attached(a.at, time.Now())
	x.taken[x.r.Epoch] = true
	x.on = a.at.InstanceID
	x.nodeOf(x.on)
	x.s.track(x, x.on)
	x.st.taken()
	x.s.detachable(a.st, x.st, true)
	epoch := x.r.Epoch
	x.s.goes.Go(func() { x.readFrames(sctx, a.c, a.st, epoch, a.at, nil) })
	return acts
}

// detachable lists (or, with add false, forgets) a worker stream the
// frontend detaches rather than cancels when it stops.
func (s *Server) detachable(ws *workerclient.Stream, st *stream, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		s.detach[ws] = st
	} else {
		delete(s.detach, ws)
	}
}

// detachAll hands every detachable stream over to whoever takes its
// request next: the workers keep generating for their grace instead of
// cancelling when this frontend's calls end.
func (s *Server) detachAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for ws, st := range s.detach {
		// Only a request whose record is stored can be taken over: the
		// others end with this frontend (their workers cancel them).
		st.rec.mu.Lock()
		stored := st.rec.rev != 0
		st.rec.mu.Unlock()
		if stored {
			ws.Detach()
			n++
		}
	}
	return n
}

// takenOverBy is the URL of the frontend that owns request id now ("" if
// the record cannot be read): a worker told this one its stream was taken
// over.
func (x *run) takenOverBy(ctx context.Context) string {
	if x.s.recs == nil {
		return ""
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rec, _, err := x.s.recs.read(rctx, x.r.ID)
	if err != nil || rec.Owner == x.s.opts.ID {
		return ""
	}
	return rec.OwnerURL
}
