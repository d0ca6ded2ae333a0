package frontend

import (
	"context"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
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
const attachTimeout = 2 * time.Second

// detachGrace is the grace a worker gives this request when its stream
// ends without a cancel: 0 (the stream's end cancels it) without a record.
func (x *run) detachGrace() uint32 {
	if x.st.rec == nil {
		return 0
	}
	return uint32(min(x.s.resumeWindow(), maxDetachGrace).Milliseconds())
}

// attached is a worker stream an Attach opened and the worker accepted,
// with its first frame.
type attached struct {
	at    Endpoint
	c     *pooled
	st    *workerclient.Stream
	first *wire.Frame
}

// attach looks for the worker that holds the request: an Attach at the
// run's epoch from sequence 1 to every known instance of the model. At
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
			if a, ok := x.tryAttach(actx, ctx, Endpoint{in.ID, in.Generation}); ok {
				won <- a
			}
		})
	}
	go func() { wg.Wait(); close(won) }()
	var got attached
	var ok bool
	for a := range won {
		if ok { // a second holder cannot be: keep the first
			a.st.Cancel()
			x.s.pool.release(a.c)
			continue
		}
		got, ok = a, true
	}
	return got, ok
}

// tryAttach asks one instance for the request. The Attach's stream lives
// under ctx (the epoch's); actx bounds the wait for its first answer.
func (x *run) tryAttach(actx, ctx context.Context, ep Endpoint) (attached, bool) {
	c, err := x.s.client(actx, ep)
	if err != nil {
		return attached{}, false
	}
	st, err := c.c.Attach(ctx, &wire.Attach{RequestId: x.r.ID, RequestEpoch: x.r.Epoch, FromSequenceNo: 1})
	if err != nil {
		x.s.pool.release(c)
		return attached{}, false
	}
	type answer struct {
		f   *wire.Frame
		err error
	}
	ch := make(chan answer, 1)
	go func() { f, err := st.Next(); ch <- answer{f, err} }()
	select {
	case a := <-ch:
		if a.err == nil && a.f.Error == nil {
			return attached{at: ep, c: c, st: st, first: a.f}, true
		}
	case <-actx.Done():
		st.Cancel()
		<-ch
	}
	x.s.pool.release(c)
	return attached{}, false
}

// takeoverStart starts a request taken over from another frontend:
// attached to the sequence still running (or just finished) on its
// worker, or, when no worker holds it, regenerated from the record with
// the same prompt, parameters and seed (by the determinism contract the
// log refills bit-identically from sequence 1). Either way the resuming
// client is served after its Last-Event-ID.
func (x *run) takeoverStart(ctx context.Context, now time.Time) []Action {
	// Not under the request's context: a request taken over only to be
	// cancelled (a DELETE at this frontend) attaches first, so that the
	// cancel reaches its worker's sequence. CancelWorker and the run's
	// end close the stream.
	sctx := x.epochCtx(context.WithoutCancel(ctx), x.r.Epoch)
	a, ok := x.attach(sctx)
	if !ok {
		x.obs.takeover("regenerated")
		return x.r.Start(now)
	}
	x.obs.takeover("attached")
	acts := x.r.Attached(a.at, time.Now())
	x.taken[x.r.Epoch] = true
	x.on = a.at.InstanceID
	x.nodeOf(x.on)
	x.s.track(x, x.on)
	x.st.taken()
	x.s.detachable(a.st, true)
	go x.readFrames(sctx, a.c, a.st, x.r.Epoch, a.at, a.first)
	return acts
}

// detachable lists (or, with add false, forgets) a worker stream the
// frontend detaches rather than cancels when it stops.
func (s *Server) detachable(st *workerclient.Stream, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		s.detach[st] = struct{}{}
	} else {
		delete(s.detach, st)
	}
}

// detachAll hands every detachable stream over to whoever takes its
// request next: the workers keep generating for their grace instead of
// cancelling when this frontend's calls end.
func (s *Server) detachAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for st := range s.detach {
		st.Detach()
	}
	return len(s.detach)
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
