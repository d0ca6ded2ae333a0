// Package client is the Go client of Lifeline frontends: it streams
// completions, and when a stream breaks it reconnects with backoff and
// jitter to the next frontend of its list, resumes after the last sequence
// number it saw (Last-Event-ID) with the stream's resume token, drops
// duplicates, and surfaces the frontends' typed errors. Over HTTPS it
// speaks HTTP/3 when a frontend offers it (Alt-Svc) or when told to,
// resumes a TLS session with 0-RTT early data for the resume GET, and can
// move its QUIC connections to a new UDP socket without a reconnect.
package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Error is a typed error the frontend returned (OpenAI shape).
type Error struct {
	Status     int
	Type       string
	Message    string
	RetryAfter time.Duration
	// OwnerURL names the frontend that owns the stream now, when the one
	// asked knows it (the Lifeline-Owner-URL header or the error's
	// owner_url).
	OwnerURL string
}

func (e *Error) Error() string {
	return fmt.Sprintf("lifeline: %s (%d): %s", e.Type, e.Status, e.Message)
}

// Request is a completion request.
type Request struct {
	Model       string   `json:"model"`
	Prompt      string   `json:"prompt"`
	MaxTokens   int      `json:"max_tokens"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	Seed        uint64   `json:"seed"`
	Stop        []string `json:"stop,omitempty"`
	IgnoreEOS   bool     `json:"ignore_eos,omitempty"`
	// N > 1 asks for N choices: each Token names its choice (Index), and
	// Result has each one's finish reason.
	N int `json:"n,omitempty"`
}

// Token is one streamed token.
type Token struct {
	SequenceNo int
	TokenID    int
	Text       string
	Instance   string
	// Index is the token's choice (0 unless Request.N > 1); SequenceNo
	// counts within it.
	Index int
}

// Result is what a finished stream reports besides its tokens.
type Result struct {
	FinishReason string
	// Migrations is how many times the frontend moved the request to
	// another worker; LastMigration is the timeline of the last move
	// (unix nanoseconds by step), nil when it never moved.
	Migrations    int
	LastMigration map[string]int64
	// KVReusedPositions is how many prompt positions the serving worker
	// took from the node's KV cache instead of computing them.
	KVReusedPositions int
	// RequestID is the frontend's id of the request (its end chunk's):
	// what its logs, records and trace spans are keyed by.
	RequestID string
	// FinishReasons is each choice's finish reason (Request.N > 1;
	// FinishReason is then choice 0's), Migrations their sum.
	FinishReasons []string
}

// Options configure a client.
type Options struct {
	// TLS configures HTTPS (roots, server name); it is cloned, and given a
	// session cache of its own per protocol if it has none, so that a
	// reconnection resumes the TLS session.
	TLS *tls.Config
	// H3 speaks HTTP/3 to https URLs from the first request on; without
	// it the client switches to HTTP/3 for a host once an HTTPS response
	// advertised it (Alt-Svc).
	H3 bool
	// MaxReconnects bounds the reconnections of one stream, across all
	// URLs (default 10).
	MaxReconnects int
	// IdleTimeout is how long an HTTP/3 connection may hear nothing before
	// it counts as broken (default 5 s; keep-alives every third of it):
	// a frontend that vanished without closing its connections is noticed
	// after this.
	IdleTimeout time.Duration
	// ReadIdle is how long a stream may send nothing before the client
	// takes its connection for cut and resumes at the next frontend
	// (default 15 s, three of the frontend's 5 s keep-alive comments;
	// negative: never). It covers what IdleTimeout cannot: a TCP
	// connection to a frontend cut off silently, which the kernel would
	// keep for minutes.
	ReadIdle time.Duration
}

// Stats count what the client did, for tests and metrics.
type Stats struct {
	// Resumes is the resume requests sent; ZeroRTTResumes those that went
	// out as 0-RTT early data on a new connection and were accepted.
	Resumes, ZeroRTTResumes int64
	// Failovers is the requests sent to another URL than the previous one
	// of their stream (or, for a stream's first request, than its first
	// choice).
	Failovers int64
	// Rebinds is the HTTP/3 connections moved to a new UDP socket.
	Rebinds int64
}

// Client talks to one or more frontends of a cluster.
type Client struct {
	// URLs are the frontends, tried in order (round robin) when a stream
	// breaks.
	URLs []string
	// HTTP is the HTTP/1.1 and HTTP/2 client; tests may replace it before
	// the first stream.
	HTTP *http.Client
	// MaxReconnects bounds reconnections of one stream (default 10).
	MaxReconnects int

	opts Options
	tcp  *tcpConns
	h3   *h3Client
	alt  altSvc
	// preferred is the index of the URL that last served a request: the
	// next stream starts there.
	preferred atomic.Int64
	stats     struct{ resumes, zeroRTT, failovers, rebinds atomic.Int64 }
	closeOnce sync.Once
}

// New returns a client of the frontends at urls with default options.
func New(urls ...string) *Client { return NewWith(Options{}, urls...) }

// DefaultReadIdle is Options.ReadIdle's default.
const DefaultReadIdle = 15 * time.Second

// NewWith returns a client of the frontends at urls.
func NewWith(opts Options, urls ...string) *Client {
	if opts.MaxReconnects == 0 {
		opts.MaxReconnects = 10
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 5 * time.Second
	}
	if opts.ReadIdle == 0 {
		opts.ReadIdle = DefaultReadIdle
	}
	c := &Client{MaxReconnects: opts.MaxReconnects, opts: opts, tcp: newTCPConns()}
	for _, u := range urls {
		c.URLs = append(c.URLs, strings.TrimRight(u, "/"))
	}
	tcpTLS := cloneTLS(opts.TLS)
	c.HTTP = &http.Client{Transport: &http.Transport{TLSClientConfig: tcpTLS, ForceAttemptHTTP2: true,
		DialContext: c.tcp.dial, Proxy: http.ProxyFromEnvironment}}
	c.h3 = newH3Client(cloneTLS(opts.TLS), opts.IdleTimeout)
	return c
}

// cloneTLS returns a copy of base (or an empty config) with a session
// cache of its own.
func cloneTLS(base *tls.Config) *tls.Config {
	cfg := &tls.Config{}
	if base != nil {
		cfg = base.Clone()
	}
	if cfg.ClientSessionCache == nil {
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(64)
	}
	return cfg
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{Resumes: c.stats.resumes.Load(), ZeroRTTResumes: c.stats.zeroRTT.Load(),
		Failovers: c.stats.failovers.Load(), Rebinds: c.stats.rebinds.Load()}
}

// Rebind moves every open HTTP/3 connection to a fresh UDP socket (a new
// local port), as after a NAT rebinding or a network switch: it probes the
// new path and switches to it, and the old socket is no longer used. The
// streams on a connection go on without a reconnect. A connection whose
// probe fails stays where it was (and if that path is dead its streams
// break and resume by token). It returns the connections that failed.
func (c *Client) Rebind(ctx context.Context) error {
	n, err := c.h3.rebind(ctx)
	c.stats.rebinds.Add(int64(n))
	return err
}

// DropConnections closes every connection the client holds, as a network
// failure would: the streams on them break and resume.
func (c *Client) DropConnections() {
	c.h3.dropAll()
	c.tcp.dropAll()
}

// Close releases the client's connections and sockets.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.DropConnections()
		c.HTTP.CloseIdleConnections()
		c.h3.close()
	})
	return nil
}

// Stream runs a resumable streaming completion and calls each for every
// token exactly once, in order, across reconnections and frontends.
func (c *Client) Stream(ctx context.Context, r Request, each func(Token)) (Result, error) {
	if len(c.URLs) == 0 {
		return Result{}, fmt.Errorf("lifeline: no frontend URL")
	}
	body, _ := json.Marshal(struct {
		Request
		Stream        bool           `json:"stream"`
		StreamOptions map[string]any `json:"stream_options"`
	}{r, true, map[string]any{"resumable": true}})
	s, resp, err := c.start(ctx, body)
	if err != nil {
		return Result{}, err
	}
	if r.N > 1 {
		s.multi = newChoices(r.N)
	}
	return s.follow(ctx, resp, each)
}
