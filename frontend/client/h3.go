package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// probeTimeout bounds the validation of a new path by Rebind.
const probeTimeout = 3 * time.Second

// keepAlive is how long a connection that receives nothing waits before
// it sends a PING: to a frontend whose process died, that PING draws an
// ICMP port unreachable, which the connected socket reports and which
// ends the connection (the stream then resumes elsewhere) long before the
// idle timeout would.
const keepAlive = 250 * time.Millisecond

// h3Client is the client's HTTP/3 side: an http3.Transport whose Dial
// gives every QUIC connection a UDP socket of its own and keeps the
// connection, so that Rebind can move it to another socket and
// DropConnections can close it.
type h3Client struct {
	rt *http3.Transport

	mu     sync.Mutex
	conns  map[*quic.Conn]*h3Conn
	latest map[string]*quic.Conn // authority → its newest connection
	dials  map[string]int        // authority → connections dialed
}

// h3Conn is one connection's sockets: the one in use last, and the ones
// it used before (kept, silenced, until the connection ends: quic-go
// destroys a connection whose transport closes, even a path it left).
type h3Conn struct {
	active *socket
	socks  []*socket
	trs    []*quic.Transport
}

func newH3Client(tlsConf *tls.Config, idle time.Duration) *h3Client {
	h := &h3Client{conns: map[*quic.Conn]*h3Conn{}, latest: map[string]*quic.Conn{}, dials: map[string]int{}}
	h.rt = &http3.Transport{TLSClientConfig: tlsConf, Dial: h.dial, QUICConfig: &quic.Config{
		MaxIdleTimeout: idle, KeepAlivePeriod: min(idle/3, keepAlive), HandshakeIdleTimeout: idle,
		// The client accepts no streams: requests are its own.
		MaxIncomingStreams: -1,
	}}
	return h
}

// dial opens a connection to addr on a fresh UDP socket, with 0-RTT when
// the TLS session cache holds a ticket that allows it.
func (h *h3Client) dial(ctx context.Context, addr string, tlsConf *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
	raddr, err := resolveUDP(ctx, addr)
	if err != nil {
		return nil, &dialError{err}
	}
	sock, err := dialSocket(raddr)
	if err != nil {
		return nil, &dialError{err}
	}
	tr := &quic.Transport{Conn: sock}
	conn, err := tr.DialEarly(ctx, raddr, tlsConf, cfg)
	if err != nil {
		tr.Close()
		sock.Close()
		return nil, &dialError{err}
	}
	h.mu.Lock()
	h.conns[conn] = &h3Conn{active: sock, socks: []*socket{sock}, trs: []*quic.Transport{tr}}
	h.latest[addr] = conn
	h.dials[addr]++
	h.mu.Unlock()
	go func() {
		<-conn.Context().Done()
		h.forget(conn, addr)
	}()
	return conn, nil
}

// forget releases a closed connection's sockets.
func (h *h3Client) forget(conn *quic.Conn, addr string) {
	h.mu.Lock()
	e := h.conns[conn]
	delete(h.conns, conn)
	if h.latest[addr] == conn {
		delete(h.latest, addr)
	}
	h.mu.Unlock()
	if e == nil {
		return
	}
	for _, tr := range e.trs {
		tr.Close()
	}
	for _, s := range e.socks {
		s.Close()
	}
}

func (h *h3Client) dialsTo(addr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dials[addr]
}

// used0RTT tells whether the newest connection to addr sent early data
// that the server accepted (known once its handshake is complete).
func (h *h3Client) used0RTT(ctx context.Context, addr string) bool {
	h.mu.Lock()
	conn := h.latest[addr]
	h.mu.Unlock()
	if conn == nil {
		return false
	}
	select {
	case <-conn.HandshakeComplete():
	case <-ctx.Done():
		return false
	}
	return conn.ConnectionState().Used0RTT
}

func (h *h3Client) snapshot() map[*quic.Conn]*h3Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[*quic.Conn]*h3Conn, len(h.conns))
	for c, e := range h.conns {
		m[c] = e
	}
	return m
}

// rebind moves every open connection to a new socket; it returns how
// many moved and the errors of those that did not.
func (h *h3Client) rebind(ctx context.Context) (int, error) {
	var errs []error
	moved := 0
	for conn, e := range h.snapshot() {
		if err := h.migrate(ctx, conn, e); err != nil {
			errs = append(errs, fmt.Errorf("lifeline: move the connection to %s: %w", conn.RemoteAddr(), err))
			continue
		}
		moved++
	}
	return moved, errors.Join(errs...)
}

// migrate probes a path from a fresh socket and switches conn to it; the
// old socket is silenced (the address it had is gone, as far as this
// client is concerned).
func (h *h3Client) migrate(ctx context.Context, conn *quic.Conn, e *h3Conn) error {
	raddr, ok := conn.RemoteAddr().(*net.UDPAddr)
	if !ok {
		return fmt.Errorf("remote address %v is not UDP", conn.RemoteAddr())
	}
	sock, err := dialSocket(raddr)
	if err != nil {
		return err
	}
	tr := &quic.Transport{Conn: sock}
	path, err := conn.AddPath(tr)
	if err != nil {
		tr.Close()
		sock.Close()
		return err
	}
	// From the first probe on the connection is registered with tr:
	// closing tr would destroy it, so tr lives until the connection ends.
	h.mu.Lock()
	e.socks, e.trs = append(e.socks, sock), append(e.trs, tr)
	h.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := path.Probe(pctx); err != nil {
		path.Close()
		sock.retire()
		return fmt.Errorf("probe: %w", err)
	}
	if err := path.Switch(); err != nil {
		path.Close()
		sock.retire()
		return fmt.Errorf("switch: %w", err)
	}
	h.mu.Lock()
	old := e.active
	e.active = sock
	h.mu.Unlock()
	old.retire()
	return nil
}

// dropAll closes every connection, as a network failure would.
func (h *h3Client) dropAll() {
	for conn := range h.snapshot() {
		conn.CloseWithError(quic.ApplicationErrorCode(http3.ErrCodeNoError), "client dropped the connection")
	}
}

func (h *h3Client) close() { h.rt.Close() }

func resolveUDP(ctx context.Context, addr string) (*net.UDPAddr, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", port, err)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("%s: no address", host)
	}
	ip := ips[0]
	for _, cand := range ips {
		if cand.Is4() {
			ip = cand
			break
		}
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip.Unmap(), uint16(p))), nil
}

// socket is a UDP socket connected to one frontend that can be retired:
// a retired socket drops what it would send and what it receives, like
// an address that is gone. Connected, it reports the ICMP errors of its
// peer (ECONNREFUSED: nothing listens there any more, the frontend
// died), which end the connection at once. It hides the *net.UDPConn's
// batch and OOB methods, so quic-go uses it through ReadFrom and WriteTo
// only.
type socket struct {
	c       *net.UDPConn
	peer    *net.UDPAddr
	retired atomic.Bool
}

func dialSocket(peer *net.UDPAddr) (*socket, error) {
	c, err := net.DialUDP("udp", nil, peer)
	if err != nil {
		return nil, err
	}
	return &socket{c: c, peer: peer}, nil
}

func (s *socket) retire() { s.retired.Store(true) }

func (s *socket) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, err := s.c.Read(b)
		if !s.retired.Load() {
			return n, s.peer, err
		}
		// A retired socket reports nothing of its peer, not even an
		// error (ECONNREFUSED from a gone address), which would close
		// the transport and with it the connection that moved away from
		// it. Its own closing is reported: Close, and the read deadline
		// by which quic.Transport.Close stops this read loop and then
		// waits for it — swallowed, the loop would spin on the deadline
		// forever and Close never return.
		if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, s.peer, err
		}
	}
}

func (s *socket) WriteTo(b []byte, addr net.Addr) (int, error) {
	if s.retired.Load() {
		return len(b), nil
	}
	if a, ok := addr.(*net.UDPAddr); !ok || !a.IP.Equal(s.peer.IP) || a.Port != s.peer.Port {
		return 0, fmt.Errorf("lifeline: socket connected to %v cannot send to %v", s.peer, addr)
	}
	return s.c.Write(b)
}

func (s *socket) Close() error                       { return s.c.Close() }
func (s *socket) LocalAddr() net.Addr                { return s.c.LocalAddr() }
func (s *socket) SetDeadline(t time.Time) error      { return s.c.SetDeadline(t) }
func (s *socket) SetReadDeadline(t time.Time) error  { return s.c.SetReadDeadline(t) }
func (s *socket) SetWriteDeadline(t time.Time) error { return s.c.SetWriteDeadline(t) }
func (s *socket) SetReadBuffer(n int) error          { return s.c.SetReadBuffer(n) }
func (s *socket) SetWriteBuffer(n int) error         { return s.c.SetWriteBuffer(n) }
