// Package transferclient dials node agents' KV transfer endpoints: the
// protocol's ALPN, TLS and QUIC settings, a cache of connections, and the
// Pull request with which a frontend (or a worker) asks an agent to pull
// blocks into its node. It imports neither the arena nor the transfer
// engine, so a frontend that asks for pulls holds no KV machinery.
package transferclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/quicdial"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// ALPN is the protocol name of an agent's transfer endpoint.
const ALPN = "lifeline-kv/1"

// QUICConfig is the transfer endpoint's QUIC configuration: flow-control
// windows far above a stock connection's (a KV transfer is a bulk copy),
// and a short idle timeout so a dead peer is noticed quickly.
func QUICConfig() *quic.Config {
	return &quic.Config{
		MaxIdleTimeout: 5 * time.Second, KeepAlivePeriod: time.Second, MaxIncomingStreams: 1024,
		InitialStreamReceiveWindow: 16 << 20, MaxStreamReceiveWindow: 64 << 20,
		InitialConnectionReceiveWindow: 64 << 20, MaxConnectionReceiveWindow: 512 << 20,
	}
}

// TLS loads the mutual-TLS configuration a client of transfer endpoints
// presents: the server must be an agent.
func TLS(certDir string) (*tls.Config, error) {
	conf, err := pki.Load(certDir, ALPN)
	if err != nil {
		return nil, err
	}
	return pki.Accept(conf, nil, pki.Peer{Role: pki.RoleAgent}), nil
}

// ServerTLS loads an agent's transfer endpoint configuration: its
// certificate must be an agent's, and it accepts agents (peers fetching
// blocks), frontends (asking for pulls) and its own node's workers
// (pulling a migrated request's blocks) only; onRefuse (when not nil)
// hears each refused peer.
func ServerTLS(certDir string, onRefuse func(error)) (*tls.Config, error) {
	conf, err := pki.Load(certDir, ALPN)
	if err != nil {
		return nil, err
	}
	self, err := pki.Self(conf)
	if err != nil {
		return nil, err
	}
	if self.Role != pki.RoleAgent {
		return nil, fmt.Errorf("transferclient: %s holds %s, not an agent certificate", certDir, self)
	}
	return pki.Accept(conf, onRefuse, EndpointPeers(self.Node())...), nil
}

// EndpointPeers are the peers the transfer endpoint of node's agent
// accepts.
func EndpointPeers(node string) []pki.Peer {
	return []pki.Peer{{Role: pki.RoleAgent}, {Role: pki.RoleFrontend}, {Role: pki.RoleWorker, Node: node}}
}

// Dialer keeps connections to transfer endpoints, several per address
// (by index) so that bulk fetches can spread over cores.
type Dialer struct {
	TLS *tls.Config
	// Local is the address every connection's socket is bound to (the
	// agent's transfer interface); nil: the address that routes to the
	// peer. Never every interface.
	Local net.IP

	mu      sync.Mutex
	conns   map[string]*quic.Conn  // by "addr#index"
	dialing map[string]*sync.Mutex // one dial per "addr#index" at a time
}

// NewDialer returns a Dialer that presents tlsConf.
func NewDialer(tlsConf *tls.Config) *Dialer {
	return &Dialer{TLS: tlsConf, conns: map[string]*quic.Conn{}, dialing: map[string]*sync.Mutex{}}
}

// Close closes every cached connection.
func (d *Dialer) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for a, c := range d.conns {
		c.CloseWithError(0, "")
		delete(d.conns, a)
	}
	return nil
}

// Conn returns the cached connection number index to addr, dialing it
// when there is none or it is closed.
func (d *Dialer) Conn(ctx context.Context, addr string, index int) (*quic.Conn, error) {
	key := fmt.Sprintf("%s#%d", addr, index)
	d.mu.Lock()
	c := d.conns[key]
	dial := d.dialing[key]
	if dial == nil {
		dial = &sync.Mutex{}
		d.dialing[key] = dial
	}
	d.mu.Unlock()
	if c != nil && c.Context().Err() == nil {
		return c, nil
	}
	// Streams of one fetch wait for one dial to their connection; other
	// connections and addresses do not wait at all.
	dial.Lock()
	defer dial.Unlock()
	d.mu.Lock()
	c = d.conns[key]
	d.mu.Unlock()
	if c != nil && c.Context().Err() == nil {
		return c, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := quicdial.Dial(dctx, d.Local, addr, d.TLS, QUICConfig())
	if err != nil {
		return nil, fmt.Errorf("rdma: dial %s: %w", addr, d.explain(err))
	}
	d.mu.Lock()
	if old := d.conns[key]; old != nil && old != c {
		old.CloseWithError(0, "")
	}
	d.conns[key] = c
	d.mu.Unlock()
	return c, nil
}

// Cached reports whether connection index to addr is open, without
// dialing it.
func (d *Dialer) Cached(addr string, index int) bool {
	d.mu.Lock()
	c := d.conns[fmt.Sprintf("%s#%d", addr, index)]
	d.mu.Unlock()
	return c != nil && c.Context().Err() == nil
}

// explain names the certificate an endpoint refused: with QUIC the
// refusal arrives after the client's side of the handshake, on the first
// stream. Which node's workers the endpoint accepts is not known here.
func (d *Dialer) explain(err error) error {
	return pki.Explain(err, d.TLS, pki.Peer{Role: pki.RoleAgent}, pki.Peer{Role: pki.RoleFrontend}, pki.Peer{Role: pki.RoleWorker, Node: "its own"})
}

// Drop forgets a connection that failed.
func (d *Dialer) Drop(c *quic.Conn) {
	d.mu.Lock()
	for k, v := range d.conns {
		if v == c {
			delete(d.conns, k)
		}
	}
	d.mu.Unlock()
	c.CloseWithError(0, "")
}

// Stream opens a stream on connection index to addr whose reads and
// writes end with ctx; stop releases that tie.
func (d *Dialer) Stream(ctx context.Context, addr string, index int) (st *quic.Stream, c *quic.Conn, stop func() bool, err error) {
	c, err = d.Conn(ctx, addr, index)
	if err != nil {
		return nil, nil, nil, err
	}
	st, err = c.OpenStreamSync(ctx)
	if err != nil {
		d.Drop(c)
		return nil, nil, nil, fmt.Errorf("rdma: open stream to %s: %w", addr, d.explain(err))
	}
	stop = context.AfterFunc(ctx, func() { st.CancelRead(0); st.CancelWrite(0) })
	return st, c, stop, nil
}

// Pull asks the agent at addr to pull blocks into its node.
func (d *Dialer) Pull(ctx context.Context, addr string, p *transferpb.Pull) (*transferpb.PullReply, error) {
	st, c, stop, err := d.Stream(ctx, addr, 0)
	if err != nil {
		return nil, err
	}
	defer stop()
	defer st.Close()
	if err := frame.Write(st, &transferpb.Request{Op: &transferpb.Request_Pull{Pull: p}}); err != nil {
		if c.Context().Err() != nil {
			d.Drop(c)
		}
		return nil, d.explain(err)
	}
	var reply transferpb.PullReply
	if err := frame.Read(bufio.NewReader(st), &reply); err != nil {
		if c.Context().Err() != nil {
			d.Drop(c)
		}
		return nil, fmt.Errorf("rdma: pull from %s: %w", addr, d.explain(err))
	}
	return &reply, nil
}
