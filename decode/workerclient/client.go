// Package workerclient speaks to worker instances: the protocol's ALPN
// and QUIC settings, the Ready line a worker prints once it serves, and the
// client the frontend and the node agent's canary use. It imports none of
// the engine, so a frontend that dials workers does not link one.
package workerclient

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

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/quicdial"
	"github.com/lifeline-llm/lifeline/kv/blockid"
)

// ErrStaleGeneration is returned when a frame comes from an older
// generation than the client expects of that instance.
var ErrStaleGeneration = errors.New("workerclient: frame from a stale generation")

// Stream error codes a client sends (STOP_SENDING, RESET_STREAM) to end a
// stream. quic-go sends only the first STOP_SENDING of a stream, so the
// first of Cancel and Detach called wins.
const (
	// CodeCancel cancels the request: the worker ends it at once.
	CodeCancel quic.StreamErrorCode = 1
	// CodeDetach leaves a detachable request (Generate.detach_grace_ms)
	// running on the worker for another stream to Attach; a request that
	// is not detachable is cancelled, as by any stream end.
	CodeDetach quic.StreamErrorCode = 2
)

// MaxDetachGrace bounds Generate.detach_grace_ms; a worker refuses a
// longer one as an invalid request.
const MaxDetachGrace = 10 * time.Minute

// Client is a connection to one worker instance at one generation.
type Client struct {
	conn       *quic.Conn
	instanceID string
	generation uint64

	// explain names the certificate a worker refused (Dial's
	// connections): with QUIC the refusal arrives after the client's
	// side of the handshake, on the first stream.
	explain func(error) error

	mu          sync.Mutex
	staleFrames uint64
}

func (c *Client) explained(err error) error {
	if c.explain == nil {
		return err
	}
	return c.explain(err)
}

// Dial connects to a worker that must be instanceID at generation: the
// server's certificate must be that instance's worker (of the node the
// instance id names, signed by that node's CA). The client's socket is
// bound to the local address that routes to addr (loopback for a loopback
// worker), never to every interface.
func Dial(ctx context.Context, addr string, tlsConf *tls.Config, instanceID string, generation uint64) (*Client, error) {
	return DialFrom(ctx, nil, addr, tlsConf, instanceID, generation)
}

// DialFrom is Dial from a socket bound to local (nil: as Dial).
func DialFrom(ctx context.Context, local net.IP, addr string, tlsConf *tls.Config, instanceID string, generation uint64) (*Client, error) {
	conn, err := quicdial.Dial(ctx, local, addr, ExpectWorker(tlsConf, instanceID), QUICConfig())
	node, _ := pki.InstanceNode(instanceID)
	explain := func(err error) error { return pki.Explain(err, tlsConf, WorkerPeers(node)...) }
	if err != nil {
		return nil, fmt.Errorf("workerclient: dial %s: %w", addr, explain(err))
	}
	c := New(conn, instanceID, generation)
	c.explain = explain
	return c, nil
}

// ExpectWorker is tlsConf for dialing instanceID's worker: the handshake
// fails unless the server's certificate names that worker.
func ExpectWorker(tlsConf *tls.Config, instanceID string) *tls.Config {
	return pki.Accept(tlsConf, nil, pki.Peer{Role: pki.RoleWorker, Instance: instanceID})
}

// New wraps a connection already dialed to a worker that must be
// instanceID at generation (one dialed on a caller's own quic.Transport).
func New(conn *quic.Conn, instanceID string, generation uint64) *Client {
	return &Client{conn: conn, instanceID: instanceID, generation: generation}
}

// LocalAddr is the address of the client's socket.
func (c *Client) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.CloseWithError(0, "") }

// StaleFrames counts frames dropped for an old generation.
func (c *Client) StaleFrames() uint64 { c.mu.Lock(); defer c.mu.Unlock(); return c.staleFrames }

// Stream is one request's frames.
type Stream struct {
	c  *Client
	st *quic.Stream
	r  *bufio.Reader
	// scratch holds a frame's bytes while it is decoded (Next runs on
	// one goroutine at a time).
	scratch []byte
	// release forgets the cancel on the call's ctx end, once the stream
	// ended or was abandoned.
	release func() bool
}

// streamReadBuffer is a stream's read buffer. A frame is a token's (tens
// of bytes) and a frontend holds one stream per request it relays, so
// bufio's 4 KiB would be most of what a relayed stream costs it; a frame
// longer than the buffer is read straight through.
const streamReadBuffer = 512

// openTimeout bounds opening a stream and sending the request: a worker
// that cannot take a stream for that long is treated as failed.
const openTimeout = 5 * time.Second

func (c *Client) open(ctx context.Context, req *wire.Request) (*Stream, error) {
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	st, err := c.conn.OpenStreamSync(octx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("workerclient: open stream: %w", c.explained(err))
	}
	st.SetWriteDeadline(time.Now().Add(openTimeout))
	if err := frame.Write(st, req); err != nil {
		st.CancelWrite(CodeCancel)
		return nil, fmt.Errorf("workerclient: send request: %w", c.explained(err))
	}
	st.SetWriteDeadline(time.Time{})
	st.Close() // done sending; frames come back
	// The call's ctx ending cancels the request, unless Detach came
	// first: only the first STOP_SENDING code reaches the worker.
	release := context.AfterFunc(ctx, func() {
		st.CancelRead(CodeCancel)
		st.CancelWrite(CodeCancel)
	})
	return &Stream{c: c, st: st, r: bufio.NewReaderSize(st, streamReadBuffer), release: release}, nil
}

// Generate starts a generation.
func (c *Client) Generate(ctx context.Context, g *wire.Generate) (*Stream, error) {
	return c.open(ctx, &wire.Request{Op: &wire.Request_Generate{Generate: g}})
}

// Attach re-attaches to a detachable request the worker holds (see
// wire.Attach); the stream's frames are those of the request from
// a.FromSequenceNo on, stamped with a.RequestEpoch, or one error frame.
func (c *Client) Attach(ctx context.Context, a *wire.Attach) (*Stream, error) {
	return c.open(ctx, &wire.Request{Op: &wire.Request_Attach{Attach: a}})
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
		return nil, fmt.Errorf("workerclient: health answer without health")
	}
	return f.Health, nil
}

// Admin sets whether the worker accepts new requests and raises the
// generation it stamps; it returns the worker's health after the change.
func (c *Client) Admin(ctx context.Context, instanceID string, current uint64, accepting bool, generation uint64) (*wire.HealthReply, error) {
	return c.AdminWith(ctx, &wire.Admin{Accepting: accepting, Generation: generation, InstanceId: instanceID, CurrentGeneration: current})
}

// AdminWith sends an Admin request as given (a drain's flags included);
// it returns the worker's health after the change.
func (c *Client) AdminWith(ctx context.Context, a *wire.Admin) (*wire.HealthReply, error) {
	s, err := c.open(ctx, &wire.Request{Op: &wire.Request_Admin{Admin: a}})
	if err != nil {
		return nil, err
	}
	defer s.Cancel()
	f, err := s.Next()
	if err != nil {
		return nil, err
	}
	if f.Error != nil {
		return nil, fmt.Errorf("workerclient: admin refused: %s", f.Error.Message)
	}
	if f.Health == nil {
		return nil, fmt.Errorf("workerclient: admin answer without health")
	}
	return f.Health, nil
}

// Next returns the next frame; io.EOF after the last one. Frames stamped
// with another instance or an older generation are dropped and counted.
func (s *Stream) Next() (*wire.Frame, error) {
	for {
		var f wire.Frame
		if err := frame.ReadInto(s.r, &f, &s.scratch); err != nil {
			if errors.Is(err, io.EOF) {
				s.release()
				return nil, io.EOF
			}
			return nil, fmt.Errorf("workerclient: stream: %w", s.c.explained(err))
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

// Buffered reports whether a whole frame was received and not yet read:
// Next returns it without waiting (unless it is stale, dropped, and the
// next one is not there yet). A relay takes every frame already there in
// one go and waits only for the first.
func (s *Stream) Buffered() bool { return frame.Buffered(s.r) }

// Cancel abandons the stream; the worker cancels the request. After
// Detach it changes nothing: only a stream's first STOP_SENDING is sent.
func (s *Stream) Cancel() {
	s.release()
	s.st.CancelRead(CodeCancel)
	s.st.CancelWrite(CodeCancel)
}

// Detach abandons the stream but leaves a detachable request running on
// the worker for an Attach. Called before the call's ctx ends, it wins
// over the cancel that ctx's end sends.
func (s *Stream) Detach() {
	s.release()
	s.st.CancelRead(CodeDetach)
	s.st.CancelWrite(CodeDetach)
}

// ALPN is the protocol name of the worker endpoint.
const ALPN = "lifeline-worker/1"

// Ready is the JSON line a worker prints on stdout once it serves.
type Ready struct {
	InstanceID    string `json:"instance_id"`
	Generation    uint64 `json:"generation"`
	Addr          string `json:"addr"`
	Model         string `json:"model"`
	ModelRevision string `json:"model_revision"`
	NumericsID    string `json:"numerics_id"`
	// KVIdentity describes the blocks the worker publishes (nil without a
	// shared arena): a router that can tokenize the same way computes the
	// keys of a prompt from it and finds nodes that hold its prefix.
	KVIdentity *blockid.Identity `json:"kv_identity,omitempty"`
	// ContextLen is the model's context in tokens (BOS, prompt and
	// output); TokenizerHash names its tokenizer. A frontend that
	// tokenizes the same way refuses a prompt that cannot fit before it
	// reaches a worker.
	ContextLen    int    `json:"context_len,omitempty"`
	TokenizerHash string `json:"tokenizer_hash,omitempty"`
	// Capacity and BatchCapacity are the most requests (interactive,
	// batch) the worker holds at once, running and queued; 0: not said.
	Capacity      int `json:"capacity,omitempty"`
	BatchCapacity int `json:"batch_capacity,omitempty"`
	// Continuation is the guarantee a continuation of this worker's
	// sequences on another instance of its numerics keeps: "bit-exact",
	// "token-exact" or "inexact" (its engine checks at start).
	Continuation string `json:"continuation,omitempty"`
	// Error, instead of the rest, is why the worker could not start (its
	// model did not load: a file llama.cpp refused, a binary without
	// llama.cpp); the worker exits after this line, and its agent shows
	// the error as the instance's.
	Error string `json:"error,omitempty"`
}

// RankReady is the JSON line a follower rank of a tensor-parallel group
// prints on stdout once it joined its group (it serves no endpoint).
type RankReady struct {
	InstanceID      string `json:"instance_id"`
	Generation      uint64 `json:"generation"`
	Rank            int    `json:"rank"`
	TP              int    `json:"tp"`
	GroupGeneration uint64 `json:"group_generation"`
}

// QUICConfig is the worker endpoint's QUIC configuration, the same on both
// ends.
func QUICConfig() *quic.Config {
	return &quic.Config{MaxIdleTimeout: 10 * time.Second, KeepAlivePeriod: 2 * time.Second, MaxIncomingStreams: 4096}
}

// ClientTLS loads the mutual-TLS config a client of workers presents.
// Dial adds the check that the server is the worker of the instance it
// dials.
func ClientTLS(certDir string) (*tls.Config, error) { return pki.Load(certDir, ALPN) }

// ServerTLS loads a worker endpoint's mutual-TLS config: its certificate
// must be a worker's, and it accepts frontends and its own node's agent
// only; onRefuse (when not nil) hears each refused peer.
func ServerTLS(certDir string, onRefuse func(error)) (*tls.Config, pki.Identity, error) {
	conf, err := pki.Load(certDir, ALPN)
	if err != nil {
		return nil, pki.Identity{}, err
	}
	self, err := pki.Self(conf)
	if err != nil {
		return nil, self, err
	}
	if self.Role != pki.RoleWorker {
		return nil, self, fmt.Errorf("workerclient: %s holds %s, not a worker certificate", certDir, self)
	}
	return pki.Accept(conf, onRefuse, WorkerPeers(self.Node())...), self, nil
}

// WorkerPeers are the peers a worker of node accepts.
func WorkerPeers(node string) []pki.Peer {
	return []pki.Peer{{Role: pki.RoleFrontend}, {Role: pki.RoleAgent, Node: node}}
}
