package rdma

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/internal/pki"
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

// TLS loads the transfer endpoint's mutual-TLS configuration.
func TLS(certDir string) (*tls.Config, error) { return pki.Load(certDir, ALPN) }

// blockWriter frames a fetch's answer on a stream.
type blockWriter struct{ w *bufio.Writer }

func (b *blockWriter) start(available int, errMsg string) error {
	if err := frame.Write(b.w, &transferpb.FetchStart{Available: uint32(available), Error: errMsg}); err != nil {
		return err
	}
	if errMsg != "" || available == 0 {
		return b.w.Flush()
	}
	return nil
}

func (b *blockWriter) block(h *transferpb.BlockHeader, payload []byte) error {
	if err := frame.Write(b.w, h); err != nil {
		return err
	}
	_, err := b.w.Write(payload)
	return err
}

func (b *blockWriter) end(sent int) error {
	if err := frame.Write(b.w, &transferpb.FetchEnd{Sent: uint32(sent)}); err != nil {
		return err
	}
	return b.w.Flush()
}

// ServeStream answers one request on a bidirectional byte stream: a fetch
// (a peer reading this node's blocks) or a pull (a frontend asking this
// node to get blocks). Exported for the TCP baseline of the benchmark.
func (e *Engine) ServeStream(ctx context.Context, rw io.ReadWriter) error {
	br := bufio.NewReaderSize(rw, 64<<10)
	var req transferpb.Request
	if err := frame.Read(br, &req); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(rw, 1<<20)
	switch op := req.Op.(type) {
	case *transferpb.Request_Fetch:
		return e.serveFetch(op.Fetch, &blockWriter{w: bw})
	case *transferpb.Request_Pull:
		reply := e.Pull(ctx, op.Pull)
		if err := frame.Write(bw, reply); err != nil {
			return err
		}
		return bw.Flush()
	case *transferpb.Request_VerbsFetch:
		if e.verbs == nil {
			if err := frame.Write(bw, &transferpb.VerbsOffer{Error: "this node serves no RDMA verbs transfers"}); err != nil {
				return err
			}
			return bw.Flush()
		}
		return e.verbs.serve(e, op.VerbsFetch, br, bw)
	default:
		return fmt.Errorf("%w: unknown operation", ErrBadTransfer)
	}
}

// Serve accepts transfer connections on ln until ctx ends.
func (e *Engine) Serve(ctx context.Context, ln *quic.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.CloseWithError(0, "")
			for {
				st, err := conn.AcceptStream(ctx)
				if err != nil {
					return
				}
				// Tracked: the arena must not be unmapped under a stream
				// still reading or writing it.
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer st.Close()
					sctx, cancel := context.WithCancel(st.Context())
					stop := context.AfterFunc(ctx, cancel)
					defer stop()
					if e.ServeStream(sctx, st) != nil {
						st.CancelRead(1)
						st.CancelWrite(1)
					}
				}()
			}
		}()
	}
}

// QUIC is the default transport, and the client frontends use to ask an
// agent for a pull. A fetch is split over Streams streams of one
// connection, read in parallel straight into the destination slots.
type QUIC struct {
	TLS *tls.Config
	// Streams is how many streams one fetch uses (default 4), spread over
	// Conns connections (default 4): quic-go runs each connection's
	// packets on one goroutine, so connections, not streams, use cores.
	Streams int
	Conns   int
	// Stall is how long a fetch waits for the next block before it gives
	// the source up (default 1.5 s).
	Stall time.Duration

	mu      sync.Mutex
	conns   map[string]*quic.Conn  // by "addr#index"
	dialing map[string]*sync.Mutex // one dial per "addr#index" at a time
}

// NewQUIC returns a QUIC transport that presents tlsConf.
func NewQUIC(tlsConf *tls.Config) *QUIC {
	return &QUIC{TLS: tlsConf, Streams: 4, Conns: 4, Stall: 1500 * time.Millisecond, conns: map[string]*quic.Conn{}, dialing: map[string]*sync.Mutex{}}
}

func (q *QUIC) Name() string { return "quic" }

// Close closes every cached connection.
func (q *QUIC) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for a, c := range q.conns {
		c.CloseWithError(0, "")
		delete(q.conns, a)
	}
	return nil
}

func (q *QUIC) conn(ctx context.Context, addr string, index int) (*quic.Conn, error) {
	key := fmt.Sprintf("%s#%d", addr, index)
	q.mu.Lock()
	c := q.conns[key]
	dial := q.dialing[key]
	if dial == nil {
		dial = &sync.Mutex{}
		q.dialing[key] = dial
	}
	q.mu.Unlock()
	if c != nil && c.Context().Err() == nil {
		return c, nil
	}
	// Streams of one fetch wait for one dial to their connection; other
	// connections and addresses do not wait at all.
	dial.Lock()
	defer dial.Unlock()
	q.mu.Lock()
	c = q.conns[key]
	q.mu.Unlock()
	if c != nil && c.Context().Err() == nil {
		return c, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := quic.DialAddr(dctx, addr, q.TLS, QUICConfig())
	if err != nil {
		return nil, fmt.Errorf("rdma: dial %s: %w", addr, err)
	}
	q.mu.Lock()
	if old := q.conns[key]; old != nil && old != c {
		old.CloseWithError(0, "")
	}
	q.conns[key] = c
	q.mu.Unlock()
	return c, nil
}

// drop forgets a connection that failed.
func (q *QUIC) drop(c *quic.Conn) {
	q.mu.Lock()
	for k, v := range q.conns {
		if v == c {
			delete(q.conns, k)
		}
	}
	q.mu.Unlock()
	c.CloseWithError(0, "")
}

// stream opens a stream whose reads and writes end with ctx.
func (q *QUIC) stream(ctx context.Context, addr string, index int) (*quic.Stream, *quic.Conn, func() bool, error) {
	c, err := q.conn(ctx, addr, index)
	if err != nil {
		return nil, nil, nil, err
	}
	st, err := c.OpenStreamSync(ctx)
	if err != nil {
		q.drop(c)
		return nil, nil, nil, fmt.Errorf("rdma: open stream to %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { st.CancelRead(0); st.CancelWrite(0) })
	return st, c, stop, nil
}

// Fetch implements Transport.
func (q *QUIC) Fetch(ctx context.Context, addr string, f *transferpb.Fetch, into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	var used []*quic.Conn
	var mu sync.Mutex
	next := 0
	n, err := FetchParallel(ctx, f, max(1, q.Streams), func(ctx context.Context) (io.ReadWriteCloser, func(), error) {
		mu.Lock()
		index := next % max(1, q.Conns)
		next++
		mu.Unlock()
		st, c, stop, err := q.stream(ctx, addr, index)
		if err != nil {
			return nil, nil, err
		}
		mu.Lock()
		used = append(used, c)
		mu.Unlock()
		return &stallStream{Stream: st, stall: q.Stall}, func() { stop(); st.CancelRead(0); st.Close() }, nil
	}, into)
	if err != nil && ctx.Err() == nil {
		// A stalled source or a broken connection: the next fetch dials
		// afresh. A protocol answer (the source lacks or refuses the
		// blocks) leaves the shared connections alone.
		var ne net.Error
		stalled := errors.As(err, &ne) && ne.Timeout()
		for _, c := range used {
			if stalled || c.Context().Err() != nil {
				q.drop(c)
			}
		}
	}
	return n, err
}

// stallStream bounds every read by the stall timeout: a source that dies
// mid-transfer sends nothing more, and nothing tells UDP it is gone.
type stallStream struct {
	*quic.Stream
	stall time.Duration
}

func (s *stallStream) Read(p []byte) (int, error) {
	s.Stream.SetReadDeadline(time.Now().Add(s.stall))
	return s.Stream.Read(p)
}

// FetchParallel splits a fetch into contiguous parts, one per stream from
// open, and reads them in parallel. The result is the chain prefix that
// arrived: parts after one the source could not fill completely do not
// count. Exported for the TCP baseline of the benchmark.
func FetchParallel(ctx context.Context, f *transferpb.Fetch, streams int, open func(context.Context) (io.ReadWriteCloser, func(), error),
	into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	count := int(f.Count)
	parts := min(streams, count)
	if parts <= 0 {
		return 0, fmt.Errorf("%w: fetch of %d blocks", ErrBadTransfer, count)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make([]int, parts)
	errs := make([]error, parts)
	var wg sync.WaitGroup
	off := 0
	for p := 0; p < parts; p++ {
		n := count / parts
		if p < count%parts {
			n++
		}
		part := &transferpb.Fetch{Binding: f.Binding, Keys: f.Keys, First: f.First + uint32(off), Count: uint32(n)}
		base := off
		off += n
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[p], errs[p] = fetchOne(ctx, part, open, func(i int, h *transferpb.BlockHeader) ([]byte, error) { return into(base+i, h) })
			if errs[p] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		// The first failure cancelled the other parts: report it, not
		// their cancellation.
		if err != nil && !errors.Is(err, context.Canceled) {
			return 0, err
		}
	}
	total := 0
	for p := 0; p < parts; p++ {
		n := count / parts
		if p < count%parts {
			n++
		}
		if errs[p] != nil {
			return 0, errs[p]
		}
		total += got[p]
		if got[p] < n {
			break
		}
	}
	return total, nil
}

func fetchOne(ctx context.Context, f *transferpb.Fetch, open func(context.Context) (io.ReadWriteCloser, func(), error), into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	rw, closeFn, err := open(ctx)
	if err != nil {
		return 0, err
	}
	defer closeFn()
	if err := frame.Write(rw, &transferpb.Request{Op: &transferpb.Request_Fetch{Fetch: f}}); err != nil {
		return 0, err
	}
	br := bufio.NewReaderSize(rw, 256<<10)
	var start transferpb.FetchStart
	if err := frame.Read(br, &start); err != nil {
		return 0, readErr(err)
	}
	if start.Error != "" {
		return 0, fmt.Errorf("%w: source: %s", ErrBadTransfer, start.Error)
	}
	if start.Available > f.Count {
		return 0, fmt.Errorf("%w: source offers %d of %d blocks", ErrBadTransfer, start.Available, f.Count)
	}
	for i := 0; i < int(start.Available); i++ {
		var h transferpb.BlockHeader
		if err := frame.Read(br, &h); err != nil {
			return 0, readErr(err)
		}
		if h.Index != uint32(i) {
			return 0, fmt.Errorf("%w: block %d arrived as %d", ErrBadTransfer, i, h.Index)
		}
		buf, err := into(i, &h)
		if err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(br, buf); err != nil {
			return 0, readErr(err)
		}
	}
	var end transferpb.FetchEnd
	if err := frame.Read(br, &end); err != nil {
		return 0, readErr(err)
	}
	if end.Sent != start.Available {
		return 0, fmt.Errorf("%w: source ended after %d of %d blocks: %s", ErrBadTransfer, end.Sent, start.Available, end.Error)
	}
	return int(start.Available), nil
}

func readErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("rdma: source stalled: %w", err)
	}
	return fmt.Errorf("rdma: source connection: %w", err)
}

// Pull asks the agent at addr to pull blocks (the frontend's side).
func (q *QUIC) Pull(ctx context.Context, addr string, p *transferpb.Pull) (*transferpb.PullReply, error) {
	st, c, stop, err := q.stream(ctx, addr, 0)
	if err != nil {
		return nil, err
	}
	defer stop()
	defer st.Close()
	if err := frame.Write(st, &transferpb.Request{Op: &transferpb.Request_Pull{Pull: p}}); err != nil {
		if c.Context().Err() != nil {
			q.drop(c)
		}
		return nil, err
	}
	var reply transferpb.PullReply
	if err := frame.Read(bufio.NewReader(st), &reply); err != nil {
		if c.Context().Err() != nil {
			q.drop(c)
		}
		return nil, fmt.Errorf("rdma: pull from %s: %w", addr, err)
	}
	return &reply, nil
}
