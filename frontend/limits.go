package frontend

import (
	"fmt"
	"net/http"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// Limits bound what one client can hold of a frontend: connections,
// streams, time and bytes. The zero value of a field takes its default;
// Off lifts the connection, stream and time limits (the body's byte bound
// stays), for measuring what they cost.
type Limits struct {
	// MaxConns caps the open TCP connections of the API listener. Beyond
	// it a new connection is refused at once: cleartext gets a raw 503
	// with Retry-After, TLS a closed connection (nothing can be said
	// before the handshake); both are counted in
	// lifeline_frontend_connections_refused_total. HTTP/3 connections are
	// bounded by their idle timeout and stream limit instead.
	MaxConns int
	// MaxStreams is the concurrent streams of one HTTP/2 or HTTP/3
	// connection.
	MaxStreams int
	// ReadHeaderTimeout bounds the reading of a request's headers (and a
	// new connection's wait for its first request).
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds the reading of a request's body, from the
	// handler's start: a slower body is cut with 408 request_timeout.
	BodyTimeout time.Duration
	// IdleTimeout closes a keep-alive connection (HTTP/1.1, HTTP/2,
	// HTTP/3) with no request in flight for that long.
	IdleTimeout time.Duration
	// WriteTimeout bounds a write to a streaming client: a client whose
	// connection takes none of a write (an event, or the few kilobytes
	// buffered since the last) for that long has its stream closed, and
	// resumes by Last-Event-ID (slowclient.go). A slow reader costs no
	// more than its request's log meanwhile.
	WriteTimeout time.Duration
	// KeepAlive is how long a streamed response may send nothing before
	// it writes an SSE comment (keepalive.go), so that a client can tell
	// a silent stream from a cut connection; negative: never.
	KeepAlive time.Duration
	// MaxBodyBytes bounds a request body: a larger one is a 413
	// request_too_large, answered without reading it whole.
	MaxBodyBytes int64
	// Off: no connection cap, no body or idle timeout, the protocols'
	// own stream limits (the baseline of the limits' benchmark).
	Off bool
}

// The defaults of Limits.
const (
	DefaultMaxConns          = 4096
	DefaultMaxStreams        = 250
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultKeepAlive         = 5 * time.Second
	DefaultMaxBodyBytes      = 4 << 20
)

// withDefaults fills the zero fields.
func (l Limits) withDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.BodyTimeout, DefaultBodyTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	def(&l.WriteTimeout, DefaultWriteTimeout)
	def(&l.KeepAlive, DefaultKeepAlive)
	return l
}

// writeTimeout is the streams' write timeout in force (0: none, with the
// limits off).
func (l Limits) writeTimeout() time.Duration {
	if l.Off {
		return 0
	}
	return l.WriteTimeout
}

// Validate refuses negative limits, naming the field.
func (l Limits) Validate() error {
	switch {
	case l.MaxConns < 0:
		return fmt.Errorf("frontend: limits: MaxConns %d < 0", l.MaxConns)
	case l.MaxStreams < 0:
		return fmt.Errorf("frontend: limits: MaxStreams %d < 0", l.MaxStreams)
	case l.MaxBodyBytes < 0:
		return fmt.Errorf("frontend: limits: MaxBodyBytes %d < 0", l.MaxBodyBytes)
	case l.ReadHeaderTimeout < 0 || l.BodyTimeout < 0 || l.IdleTimeout < 0 || l.WriteTimeout < 0:
		return fmt.Errorf("frontend: limits: negative timeout (read header %v, body %v, idle %v, write %v)", l.ReadHeaderTimeout, l.BodyTimeout, l.IdleTimeout, l.WriteTimeout)
	}
	return nil
}

// httpServer is an http.Server for handler under the limits: HTTP/1.1
// and HTTP/2 (TLS or cleartext: the same idle timeout and stream limit).
func (l Limits) httpServer(handler http.Handler) *http.Server {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: l.ReadHeaderTimeout}
	if l.Off {
		return srv
	}
	srv.IdleTimeout = l.IdleTimeout
	srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: l.MaxStreams}
	return srv
}

// http3Server applies the limits to an HTTP/3 server and its QUIC
// configuration.
func (l Limits) http3Server(srv *http3.Server, qc *quic.Config) {
	if l.Off {
		return
	}
	srv.IdleTimeout = l.IdleTimeout
	// A connection silent for this long (no packet, not even a keep-alive)
	// is gone: quic-go's own default, or the idle timeout if shorter.
	qc.MaxIdleTimeout = min(l.IdleTimeout, 30*time.Second)
	qc.MaxIncomingStreams = int64(l.MaxStreams)
	qc.MaxIncomingUniStreams = 16 // control and QPACK streams, with room
}
