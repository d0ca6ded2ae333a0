package frontend

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// The HTTP/3 server accepts TLS 1.3 early data (0-RTT), so that a client
// resuming a stream on a new connection gets its tokens without a round
// trip first. Early data can be replayed by anyone who recorded it (RFC
// 8446 §8, RFC 8470), so it is accepted only for reads that change
// nothing: the resume GET and the probes. Anything else that arrives
// before the handshake completed is refused with 425 Too Early and never
// reaches its handler.

// quicConnKey holds a request's *earlyConn in its context.
type quicConnKey struct{}

// earlyConn is what the early-data check knows of a request's connection.
type earlyConn struct {
	conn *quic.Conn
	// requests counts the connection's requests, to tell its first.
	requests atomic.Int64
}

// withQUICConn is the HTTP/3 server's ConnContext: it puts the request's
// QUIC connection into every request context of that connection.
func withQUICConn(ctx context.Context, c *quic.Conn) context.Context {
	return context.WithValue(ctx, quicConnKey{}, &earlyConn{conn: c})
}

// handshakePending tells whether the request's handshake is still not
// complete. quic-go's http3 server hands a request stream to its handler
// as soon as the stream's frames arrive, 0-RTT ones included, and closes
// HandshakeComplete only once the client's Finished was verified. A
// request seen while it is still open came as early data and may be a
// replay: whoever replays a recorded ClientHello and early data cannot
// send that Finished, so a replayed request always sees the handshake
// pending. (A request from a live client whose Finished overtook the
// handler is seen as complete: it is no replay, and it is served.)
func handshakePending(c *quic.Conn) bool {
	select {
	case <-c.HandshakeComplete():
		return false
	default:
		return true
	}
}

// earlySafe tells the requests that may be answered from early data: the
// reads that change nothing.
func earlySafe(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch r.URL.Path {
	case "/v1/models", "/healthz", "/readyz":
		return true
	}
	id, ok := strings.CutPrefix(r.URL.Path, "/v1/streams/")
	return ok && id != "" && !strings.Contains(id, "/")
}

// earlyGuard refuses with 425 every request that arrived before the
// handshake completed unless it is earlySafe, and counts the resume reads
// served from 0-RTT.
func (s *Server) earlyGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ec, _ := r.Context().Value(quicConnKey{}).(*earlyConn)
		if ec == nil {
			next.ServeHTTP(w, r)
			return
		}
		first := ec.requests.Add(1) == 1
		pending := handshakePending(ec.conn)
		if pending && !earlySafe(r) {
			s.metrics.tooEarly.Inc()
			writeError(w, http.StatusTooEarly, openai.ErrTooEarly, "request sent as 0-RTT early data: send it again once the handshake is complete")
			return
		}
		// A resume counts as a 0-RTT one if the handshake is still pending
		// or if it is the first request of a connection whose early data
		// the server accepted (its client sent it early, and the Finished
		// may have overtaken this handler).
		if earlySafe(r) && strings.HasPrefix(r.URL.Path, "/v1/streams/") && (pending || first && ec.conn.ConnectionState().Used0RTT) {
			s.metrics.zeroRTTResumes.Inc()
		}
		next.ServeHTTP(w, r)
	})
}

// ticketKeys derives TLS session ticket keys from the resume keys, the
// current one first (it seals new tickets; the others still open old
// ones), so that frontends sharing the keys resume each other's TLS
// sessions and accept each other's 0-RTT: a client that fails over to
// another frontend keeps its round trip saving.
func (k *resumeKeys) ticketKeys() [][32]byte {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([][32]byte, 0, len(k.keys))
	for _, key := range k.keys {
		m := hmac.New(sha256.New, key.Secret)
		m.Write([]byte("lifeline tls session ticket key v1"))
		var t [32]byte
		copy(t[:], m.Sum(nil))
		out = append(out, t)
	}
	return out
}
