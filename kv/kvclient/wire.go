package kvclient

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"time"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// defaultTTL is the lease TTL a client assumes before the owner's hello
// tells it the real one.
const defaultTTL = 3 * time.Second

// rttFor bounds one round trip to the owner for a lease of ttl: well
// inside the lease, so that a stuck owner is noticed while renewals can
// still land.
func rttFor(ttl time.Duration) time.Duration { return min(5*time.Second, ttl/2) }

// wire is one connection to the owner carrying one request at a time:
// each request is written, then its answer read, before the next goes.
// Its user serializes round trips; a wire has no lock of its own.
type wire struct {
	conn   net.Conn
	r      *bufio.Reader
	w      *bufio.Writer
	nextID uint64
	closed bool
}

func newWire(conn net.Conn) *wire {
	return &wire{conn: conn, r: bufio.NewReader(conn), w: bufio.NewWriter(conn)}
}

// dialWire connects to the owner's socket.
func dialWire(ctx context.Context, socket string, timeout time.Duration) (*wire, error) {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOwnerUnavailable, err)
	}
	return newWire(conn), nil
}

func (w *wire) close() {
	if !w.closed {
		w.closed = true
		w.conn.Close()
	}
}

// longAgo is a deadline in the past: setting it interrupts blocked I/O.
var longAgo = time.Unix(1, 0)

// roundTrip sends req and reads its answer within timeout, or until ctx
// ends. A failure of the connection closes the wire and is an
// ErrOwnerUnavailable (or ctx's error, if ctx ended); an answer other than
// OK is a *RemoteError and leaves the wire usable.
func (w *wire) roundTrip(ctx context.Context, req *kvpb.Request, timeout time.Duration) (*kvpb.Response, error) {
	if w.closed {
		return nil, ErrOwnerUnavailable
	}
	w.nextID++
	req.Id = w.nextID
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	w.conn.SetDeadline(deadline)
	// Cancelling ctx interrupts the I/O in flight; once stop says the cut
	// is under way, wait for it, so that it cannot land on the next
	// round trip's deadline.
	cut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { w.conn.SetDeadline(longAgo); close(cut) })
	defer func() {
		if !stop() {
			<-cut
		}
	}()
	if err := frame.Write(w.w, req); err != nil {
		return nil, w.broken(ctx, err)
	}
	if err := w.w.Flush(); err != nil {
		return nil, w.broken(ctx, err)
	}
	var resp kvpb.Response
	if err := frame.Read(w.r, &resp); err != nil {
		return nil, w.broken(ctx, err)
	}
	if resp.Id != req.Id {
		return nil, w.broken(ctx, fmt.Errorf("response %d to request %d", resp.Id, req.Id))
	}
	if resp.Code != kvpb.Code_OK {
		return nil, &RemoteError{Code: resp.Code, Message: resp.Message}
	}
	return &resp, nil
}

// broken closes the wire after err: a request may be half written or its
// answer half read, so nothing more can go on it.
func (w *wire) broken(ctx context.Context, err error) error {
	w.close()
	if ctx.Err() != nil {
		return fmt.Errorf("kv: owner round trip: %w", ctx.Err())
	}
	return fmt.Errorf("%w: %v", ErrOwnerUnavailable, err)
}
