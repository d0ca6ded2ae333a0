package rdma

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// The TLS-over-TCP data path. quic-go moves a fetch's bytes in 1,452-byte
// packets, each packed, sealed, sent, received, opened and parsed in user
// space: on loopback that costs about four times one kernel TCP stream's
// CPU per byte (see BenchmarkFetchQUIC and BenchmarkFetchTCP). A source
// that serves ServeTCP offers its port to a peer that asks on a QUIC
// stream; the peer dials the same host with the same certificates, checks
// that the data path presents the very certificate of the QUIC endpoint,
// and sends the same Fetch there. The fetch carries its binding, and the
// destination checks every block's key, length and checksum and the
// binding before it publishes, whatever transport the bytes came over.

// errDataDial: the data path could not be reached or was not the QUIC
// endpoint's; nothing was asked on it.
var errDataDial = errors.New("rdma: TCP data path")

// dataRetry is how long a source whose data path failed to dial is
// fetched from over QUIC only.
const dataRetry = 30 * time.Second

// dataWriteStall bounds each write of a source on the data path: a peer
// that stops reading (or is gone) releases its leases.
const dataWriteStall = 5 * time.Second

// ServeTCP serves fetches on ln, a TCP listener, with mutual TLS (tlsConf:
// the QUIC endpoint's own configuration), and offers ln's port to peers
// that ask over QUIC. One fetch per connection; nothing else is served
// there. It returns when ln is closed or ctx ends.
func (e *Engine) ServeTCP(ctx context.Context, ln net.Listener, tlsConf *tls.Config) error {
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("%w: %s is not a TCP listener", ErrBadTransfer, ln.Addr())
	}
	e.dataPort.Store(uint32(addr.Port))
	defer e.dataPort.Store(0)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait() // the arena must not be unmapped under a fetch
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: wait, do not end the
			// data path (its peers would stay on QUIC for good).
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			cut := context.AfterFunc(ctx, func() { c.Close() })
			defer cut()
			bc := &batchConn{Conn: c}
			e.serveData(tls.Server(bc, tlsConf), bc)
		}()
	}
}

// serveData answers the one fetch of a data path connection.
func (e *Engine) serveData(c *tls.Conn, bc *batchConn) error {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if err := c.Handshake(); err != nil {
		return err
	}
	br := bufio.NewReaderSize(c, 4<<10)
	var req transferpb.Request
	if err := frame.Read(br, &req); err != nil {
		return err
	}
	c.SetDeadline(time.Time{})
	sw := &stallWriter{c: c, stall: dataWriteStall}
	bc.batch = make([]byte, 0, dataBatch)
	w := &blockWriter{w: bufio.NewWriterSize(sw, 1<<20), raw: sw, flush: bc.flush}
	f := req.GetFetch()
	if f == nil {
		return w.start(0, "the TCP data path serves fetches only")
	}
	return e.serveFetch(f, w)
}

// dataBatch is how many bytes of TLS records a data path connection
// hands the kernel per system call (crypto/tls writes and reads one
// 16 KiB record at a time: a system call each).
const dataBatch = 256 << 10

// batchConn gathers the TLS records written on it once batch is set (after
// the handshake) and writes them dataBatch bytes at a time, and the rest
// on flush.
type batchConn struct {
	net.Conn
	batch []byte
}

func (b *batchConn) Write(p []byte) (int, error) {
	if b.batch == nil {
		return b.Conn.Write(p)
	}
	if len(b.batch)+len(p) > cap(b.batch) {
		if err := b.flush(); err != nil {
			return 0, err
		}
		if len(p) >= cap(b.batch) {
			return b.Conn.Write(p)
		}
	}
	b.batch = append(b.batch, p...)
	return len(p), nil
}

func (b *batchConn) flush() error {
	if len(b.batch) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.batch)
	b.batch = b.batch[:0]
	return err
}

// readBatchConn reads from the kernel dataBatch bytes at a time, for
// crypto/tls's record-sized reads.
type readBatchConn struct {
	net.Conn
	r *bufio.Reader
}

func (r *readBatchConn) Read(p []byte) (int, error) { return r.r.Read(p) }

// stallWriter bounds every write by the stall timeout.
type stallWriter struct {
	c     net.Conn
	stall time.Duration
}

func (s *stallWriter) Write(p []byte) (int, error) {
	s.c.SetWriteDeadline(time.Now().Add(s.stall))
	return s.c.Write(p)
}

// stallConn bounds every read by the stall timeout, as stallStream does.
type stallConn struct {
	net.Conn
	stall time.Duration
}

func (s *stallConn) Read(p []byte) (int, error) {
	s.Conn.SetReadDeadline(time.Now().Add(s.stall))
	return s.Conn.Read(p)
}

// dataPath is a source's data path as its QUIC endpoint offered it.
type dataPath struct {
	conn  *quic.Conn // the QUIC connection the offer came on: a new one asks again
	port  int        // 0: none
	peer  []byte     // the QUIC endpoint's certificate
	retry time.Time
}

// dataPath returns the data path of the source at addr, asking its QUIC
// endpoint once per connection; ok is false where there is none to use.
// err is the QUIC dial's failure: the source is not there on either
// path, and dialing it again would only wait out a second timeout.
func (q *QUIC) dataPath(ctx context.Context, addr string) (_ dataPath, ok bool, err error) {
	c, err := q.Conn(ctx, addr, 0)
	if err != nil {
		return dataPath{}, false, err
	}
	q.pathsMu.Lock()
	p, known := q.paths[addr]
	q.pathsMu.Unlock()
	if !known || p.conn != c {
		p = dataPath{conn: c}
		if certs := c.ConnectionState().TLS.PeerCertificates; len(certs) > 0 {
			p.peer = certs[0].Raw
			p.port = q.askDataPath(ctx, addr)
		}
		q.pathsMu.Lock()
		if q.paths == nil {
			q.paths = map[string]dataPath{}
		}
		q.paths[addr] = p
		q.pathsMu.Unlock()
	}
	return p, p.port != 0 && time.Now().After(p.retry), nil
}

// askDataPath asks the QUIC endpoint at addr for its data path's port (0
// where it offers none, or cannot answer: an endpoint that predates the
// data path refuses the question).
func (q *QUIC) askDataPath(ctx context.Context, addr string) int {
	st, _, stop, err := q.Stream(ctx, addr, 0)
	if err != nil {
		return 0
	}
	defer stop()
	defer st.Close()
	if frame.Write(st, &transferpb.Request{Op: &transferpb.Request_DataPath{DataPath: &transferpb.DataPathQuery{}}}) != nil {
		return 0
	}
	var offer transferpb.DataPathOffer
	if frame.Read(bufio.NewReader(&stallStream{Stream: st, stall: q.Stall}), &offer) != nil || offer.Error != "" || offer.TcpPort > 65535 {
		return 0
	}
	return int(offer.TcpPort)
}

// shelve stops using addr's data path for a while.
func (q *QUIC) shelve(addr string, p dataPath) {
	q.pathsMu.Lock()
	defer q.pathsMu.Unlock()
	if cur, ok := q.paths[addr]; ok && cur.conn == p.conn {
		cur.retry = time.Now().Add(dataRetry)
		q.paths[addr] = cur
	}
}

// fetchTCP fetches over addr's data path, on TCPStreams connections.
func (q *QUIC) fetchTCP(ctx context.Context, addr string, p dataPath, f *transferpb.Fetch, into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", errDataDial, addr, err)
	}
	target := net.JoinHostPort(host, strconv.Itoa(p.port))
	return FetchParallel(ctx, f, max(1, q.TCPStreams), func(ctx context.Context) (io.ReadWriteCloser, func(), error) {
		c, err := q.dialData(ctx, target, p.peer)
		if err != nil {
			return nil, nil, err
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		return &stallConn{Conn: c, stall: q.Stall}, func() { stop(); c.Close() }, nil
	}, into)
}

// dialData dials a data path connection from the transfer interface and
// accepts it only if it presents peer, the QUIC endpoint's certificate.
func (q *QUIC) dialData(ctx context.Context, target string, peer []byte) (*tls.Conn, error) {
	nd := &net.Dialer{Timeout: 3 * time.Second}
	if q.Local != nil && !q.Local.IsUnspecified() {
		nd.LocalAddr = &net.TCPAddr{IP: q.Local}
	}
	raw, err := nd.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errDataDial, target, err)
	}
	conf := q.TLS.Clone()
	if conf.ServerName == "" {
		conf.ServerName, _, _ = net.SplitHostPort(target)
	}
	tc := tls.Client(&readBatchConn{Conn: raw, r: bufio.NewReaderSize(raw, dataBatch)}, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("%w: %s: %w", errDataDial, target, err)
	}
	if certs := tc.ConnectionState().PeerCertificates; len(certs) == 0 || !bytes.Equal(certs[0].Raw, peer) {
		tc.Close()
		return nil, fmt.Errorf("%w: %s presents another certificate than the QUIC endpoint", errDataDial, target)
	}
	return tc, nil
}
