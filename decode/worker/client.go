package worker

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/internal/frame"
)

// ErrStaleGeneration is returned when a frame comes from an older
// generation than the client expects of that instance.
var ErrStaleGeneration = errors.New("worker: frame from a stale generation")

// Client is a connection to one worker instance at one generation.
type Client struct {
	conn       *quic.Conn
	instanceID string
	generation uint64

	mu          sync.Mutex
	staleFrames uint64
}

// Dial connects to a worker that must be instanceID at generation.
func Dial(ctx context.Context, addr string, tlsConf *tls.Config, instanceID string, generation uint64) (*Client, error) {
	conn, err := quic.DialAddr(ctx, addr, tlsConf, quicConfig())
	if err != nil {
		return nil, fmt.Errorf("worker: dial %s: %w", addr, err)
	}
	return &Client{conn: conn, instanceID: instanceID, generation: generation}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.CloseWithError(0, "") }

// StaleFrames counts frames dropped for an old generation.
func (c *Client) StaleFrames() uint64 { c.mu.Lock(); defer c.mu.Unlock(); return c.staleFrames }

// Stream is one request's frames.
type Stream struct {
	c  *Client
	st *quic.Stream
	r  *bufio.Reader
}

// openTimeout bounds opening a stream and sending the request: a worker
// that cannot take a stream for that long is treated as failed.
const openTimeout = 5 * time.Second

func (c *Client) open(ctx context.Context, req *wire.Request) (*Stream, error) {
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	st, err := c.conn.OpenStreamSync(octx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("worker: open stream: %w", err)
	}
	st.SetWriteDeadline(time.Now().Add(openTimeout))
	if err := frame.Write(st, req); err != nil {
		st.CancelWrite(1)
		return nil, fmt.Errorf("worker: send request: %w", err)
	}
	st.SetWriteDeadline(time.Time{})
	st.Close() // done sending; frames come back
	go func() {
		<-ctx.Done()
		st.CancelRead(1)
		st.CancelWrite(1)
	}()
	return &Stream{c: c, st: st, r: bufio.NewReader(st)}, nil
}

// Generate starts a generation.
func (c *Client) Generate(ctx context.Context, g *wire.Generate) (*Stream, error) {
	return c.open(ctx, &wire.Request{Op: &wire.Request_Generate{Generate: g}})
}

// Health asks the worker for its load and identity.
func (c *Client) Health(ctx context.Context) (*wire.HealthReply, error) {
	s, err := c.open(ctx, &wire.Request{Op: &wire.Request_Health{Health: &wire.Health{}}})
	if err != nil {
		return nil, err
	}
	defer s.Cancel()
	f, err := s.Next()
	if err != nil {
		return nil, err
	}
	if f.Health == nil {
		return nil, fmt.Errorf("worker: health answer without health")
	}
	return f.Health, nil
}

// Admin sets whether the worker accepts new requests and raises the
// generation it stamps; it returns the worker's health after the change.
func (c *Client) Admin(ctx context.Context, instanceID string, current uint64, accepting bool, generation uint64) (*wire.HealthReply, error) {
	s, err := c.open(ctx, &wire.Request{Op: &wire.Request_Admin{Admin: &wire.Admin{Accepting: accepting, Generation: generation,
		InstanceId: instanceID, CurrentGeneration: current}}})
	if err != nil {
		return nil, err
	}
	defer s.Cancel()
	f, err := s.Next()
	if err != nil {
		return nil, err
	}
	if f.Error != nil {
		return nil, fmt.Errorf("worker: admin refused: %s", f.Error.Message)
	}
	if f.Health == nil {
		return nil, fmt.Errorf("worker: admin answer without health")
	}
	return f.Health, nil
}

// Next returns the next frame; io.EOF after the last one. Frames stamped
// with another instance or an older generation are dropped and counted.
func (s *Stream) Next() (*wire.Frame, error) {
	for {
		var f wire.Frame
		if err := frame.Read(s.r, &f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("worker: stream: %w", err)
		}
		if f.InstanceId != s.c.instanceID || f.Generation < s.c.generation {
			s.c.mu.Lock()
			s.c.staleFrames++
			s.c.mu.Unlock()
			continue
		}
		return &f, nil
	}
}

// Cancel abandons the stream; the worker cancels the request.
func (s *Stream) Cancel() {
	s.st.CancelRead(1)
	s.st.CancelWrite(1)
}
