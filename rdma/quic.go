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
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// blockWriter frames a fetch's answer on a stream: through w, except
// that payloads of directWrite bytes or more go from the arena straight
// to raw (w's destination), saving a copy of every byte.
type blockWriter struct {
	w   *bufio.Writer
	raw io.Writer
	// flush (when not nil) pushes out what raw holds back.
	flush func() error
}

func (b *blockWriter) flushAll() error {
	if err := b.w.Flush(); err != nil || b.flush == nil {
		return err
	}
	return b.flush()
}

const directWrite = 128 << 10

func (b *blockWriter) start(available int, errMsg string) error {
	if err := frame.Write(b.w, &transferpb.FetchStart{Available: uint32(available), Error: errMsg}); err != nil {
		return err
	}
	if errMsg != "" || available == 0 {
		return b.flushAll()
	}
	return nil
}

func (b *blockWriter) block(h *transferpb.BlockHeader, payload []byte) error {
	if err := frame.Write(b.w, h); err != nil {
		return err
	}
	if b.raw == nil || len(payload) < directWrite {
		_, err := b.w.Write(payload)
		return err
	}
	if err := b.w.Flush(); err != nil {
		return err
	}
	_, err := b.raw.Write(payload)
	return err
}

func (b *blockWriter) end(sent int) error {
	if err := frame.Write(b.w, &transferpb.FetchEnd{Sent: uint32(sent)}); err != nil {
		return err
	}
	return b.flushAll()
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
		return e.serveFetch(op.Fetch, &blockWriter{w: bw, raw: rw})
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
	case *transferpb.Request_DataPath:
		if err := frame.Write(bw, &transferpb.DataPathOffer{TcpPort: e.dataPort.Load()}); err != nil {
			return err
		}
		return bw.Flush()
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

// QUIC is the default transport. A fetch is split over Streams streams,
// read in parallel straight into the destination slots. Its Dialer also
// sends Pull requests (a worker asking its own agent for blocks). Where
// the source offers a TLS-over-TCP data path (asked once per QUIC
// connection, on a QUIC stream), fetches take it instead: see tcpdata.go.
type QUIC struct {
	*transferclient.Dialer
	// Streams is how many streams one fetch uses (default 4), spread over
	// Conns connections (default 4): quic-go runs each connection's
	// packets on one goroutine, so connections, not streams, use cores.
	Streams int
	Conns   int
	// Stall is how long a fetch waits for the next block before it gives
	// the source up (default 1.5 s).
	Stall time.Duration
	// TCP: fetch over the source's TLS-over-TCP data path when it offers
	// one (default true), on TCPStreams connections (default 1); over
	// QUIC where it offers none or its data path cannot be dialed.
	TCP        bool
	TCPStreams int

	pathsMu sync.Mutex
	paths   map[string]dataPath // by source address
}

// NewQUIC returns a QUIC transport that presents tlsConf.
func NewQUIC(tlsConf *tls.Config) *QUIC {
	return &QUIC{Dialer: transferclient.NewDialer(tlsConf), Streams: 4, Conns: 4, Stall: 1500 * time.Millisecond, TCP: true, TCPStreams: 1}
}

func (q *QUIC) Name() string { return "quic" }

// Fetch implements Transport.
func (q *QUIC) Fetch(ctx context.Context, addr string, f *transferpb.Fetch, into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	if q.TCP {
		p, ok, err := q.dataPath(ctx, addr)
		if err != nil {
			return 0, err
		}
		if ok {
			n, err := q.fetchTCP(ctx, addr, p, f, into)
			if !errors.Is(err, errDataDial) || ctx.Err() != nil {
				return n, err
			}
			// Nothing was asked on it: QUIC, and the data path again
			// only after a while.
			q.shelve(addr, p)
		}
	}
	return q.fetchQUIC(ctx, addr, f, into)
}

func (q *QUIC) fetchQUIC(ctx context.Context, addr string, f *transferpb.Fetch, into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	var used []*quic.Conn
	var mu sync.Mutex
	next := 0
	n, err := FetchParallel(ctx, f, max(1, q.Streams), func(ctx context.Context) (io.ReadWriteCloser, func(), error) {
		mu.Lock()
		index := next % max(1, q.Conns)
		next++
		mu.Unlock()
		st, c, stop, err := q.Stream(ctx, addr, index)
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
				q.Drop(c)
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
