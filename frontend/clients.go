package frontend

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// clientPool holds one connection per worker endpoint, shared by the
// requests on it. A connection is closed when its endpoint fails; when a
// newer generation of its instance registers (the same worker
// re-registered after a lost lease, or a restart) it is retired: nothing
// new uses it, and it is closed once its last stream ends, so that the
// streams on it go on.
type clientPool struct {
	tls *tls.Config

	mu    sync.Mutex
	conns map[reqfsm.Endpoint]*pooled
	// dials are the dials under way: a failure of their endpoint ends
	// them at once (a dead worker's port never answers a handshake).
	dials map[*dial]bool
	// open counts the connections not closed yet, retired ones included.
	open int
	// failed is, per instance, the newest generation announced dead: a
	// dial to it or an older one fails at once. A request may have picked
	// the endpoint just before the announcement and dial it just after,
	// when there is no dial of it yet to end (it waited out the dial
	// timeout on a dead worker's port).
	failed map[string]uint64
}

// dial is one dial under way.
type dial struct {
	ep     reqfsm.Endpoint
	cancel context.CancelCauseFunc
}

// errEndpointFailed ends a dial to an endpoint announced dead.
var errEndpointFailed = errors.New("frontend: the endpoint failed while being dialled")

// pooled is one connection and the streams open on it.
type pooled struct {
	ep      reqfsm.Endpoint
	addr    string // the worker's address it was dialled at
	c       *workerclient.Client
	streams int
	retired bool
	closed  bool
}

func newClientPool(tlsConf *tls.Config) *clientPool {
	return &clientPool{tls: tlsConf, conns: map[reqfsm.Endpoint]*pooled{}, dials: map[*dial]bool{}, failed: map[string]uint64{}}
}

// get returns the connection to ep at addr, dialled if need be, with a
// stream counted on it: the caller releases it when the stream ends.
func (p *clientPool) get(ctx context.Context, ep reqfsm.Endpoint, addr string) (*pooled, error) {
	p.mu.Lock()
	if c, ok := p.conns[ep]; ok {
		c.streams++
		p.mu.Unlock()
		return c, nil
	}
	if gen, ok := p.failed[ep.InstanceID]; ok && ep.Generation <= gen {
		p.mu.Unlock()
		return nil, errEndpointFailed
	}
	fctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	d := &dial{ep: ep, cancel: fail}
	p.dials[d] = true
	p.mu.Unlock()
	dctx, cancel := context.WithTimeout(fctx, 5*time.Second)
	defer cancel()
	wc, err := workerclient.Dial(dctx, addr, p.tls, ep.InstanceID, ep.Generation)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.dials, d)
	if err != nil {
		if cause := context.Cause(fctx); errors.Is(cause, errEndpointFailed) {
			return nil, cause
		}
		return nil, err
	}
	c, ok := p.conns[ep]
	if ok {
		wc.Close()
	} else {
		c = &pooled{ep: ep, addr: addr, c: wc}
		p.conns[ep] = c
		p.open++
	}
	c.streams++
	return c, nil
}

// release ends a stream counted by get; the last stream of a retired
// connection closes it.
func (p *clientPool) release(c *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.streams--
	if c.retired && c.streams == 0 {
		p.closeLocked(c)
	}
}

// closeLocked closes c once.
func (p *clientPool) closeLocked(c *pooled) {
	if !c.closed {
		c.closed = true
		c.c.Close()
		p.open--
	}
}

// drop closes ep's connection now, and ends its dials (it failed): the
// next request dials afresh.
func (p *clientPool) drop(ep reqfsm.Endpoint) {
	p.closeWhere(func(e reqfsm.Endpoint) bool { return e == ep })
}

// fail closes the connections to instance id at generations up to gen,
// and ends the dials to them (a failure announcement).
func (p *clientPool) fail(id string, gen uint64) {
	p.mu.Lock()
	p.failed[id] = max(p.failed[id], gen)
	p.mu.Unlock()
	p.closeWhere(func(e reqfsm.Endpoint) bool { return e.InstanceID == id && e.Generation <= gen })
}

func (p *clientPool) closeWhere(match func(reqfsm.Endpoint) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for d := range p.dials {
		if match(d.ep) {
			d.cancel(errEndpointFailed)
		}
	}
	for ep, c := range p.conns {
		if match(ep) {
			p.closeLocked(c)
			delete(p.conns, ep)
		}
	}
}

// retire retires the connections to instance id at generations below
// gen: a newer generation registered.
func (p *clientPool) retire(id string, gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ep, c := range p.conns {
		if ep.InstanceID == id && ep.Generation < gen {
			delete(p.conns, ep)
			c.retired = true
			if c.streams == 0 {
				p.closeLocked(c)
			}
		}
	}
}

// openConns counts the connections not closed yet.
func (p *clientPool) openConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}
