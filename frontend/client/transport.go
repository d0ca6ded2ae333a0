package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/quic-go/quic-go/http3"
)

// do sends one request to base+path: over HTTP/3 when the client was told
// to or the host advertised it, else over c.HTTP. A resume GET over
// HTTP/3 goes out as 0-RTT early data when the connection is new and its
// TLS session allows it; nothing else does.
func (c *Client) do(ctx context.Context, method, base, path string, body []byte, h http.Header) (*http.Response, error) {
	u, err := url.Parse(base + path)
	if err != nil {
		return nil, fmt.Errorf("lifeline: frontend URL %q: %w", base, err)
	}
	if c.opts.H3 && u.Scheme != "https" {
		return nil, fmt.Errorf("lifeline: HTTP/3 needs an https URL, not %q", base)
	}
	authority, useH3 := u.Host, c.opts.H3
	if u.Scheme == "https" && !useH3 {
		authority, useH3 = c.alt.lookup(u.Host)
	}
	if useH3 {
		resp, err := c.doH3(ctx, method, u, authority, body, h)
		if err == nil || c.opts.H3 || !isDialError(err) {
			return resp, err
		}
		// The advertised HTTP/3 endpoint is unreachable: forget it and
		// fall back to TCP.
		c.alt.forget(u.Host)
	}
	req, err := newRequest(ctx, method, u, body, h)
	if err != nil {
		return nil, err
	}
	resp, err := c.HTTP.Do(req)
	if err == nil && resp.TLS != nil {
		c.alt.learn(u.Host, resp.Header.Get("Alt-Svc"))
	}
	return resp, err
}

// doH3 sends the request over HTTP/3 to authority (the host's own, or the
// one its Alt-Svc named) and counts a resume that went out as accepted
// 0-RTT early data.
func (c *Client) doH3(ctx context.Context, method string, u *url.URL, authority string, body []byte, h http.Header) (*http.Response, error) {
	target := *u
	target.Host = authority
	early := method == http.MethodGet
	if early {
		method = http3.MethodGet0RTT
	}
	req, err := newRequest(ctx, method, &target, body, h)
	if err != nil {
		return nil, err
	}
	req.Host = u.Host
	dialsBefore := c.h3.dialsTo(authority)
	resp, err := c.h3.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	// A new connection dialed for this request: did its early data go?
	if early && c.h3.dialsTo(authority) != dialsBefore && c.h3.used0RTT(ctx, authority) {
		c.stats.zeroRTT.Add(1)
	}
	return resp, nil
}

func newRequest(ctx context.Context, method string, u *url.URL, body []byte, h http.Header) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("lifeline: %w", err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// dialError marks a failure to reach a frontend at all: nothing was sent.
type dialError struct{ err error }

func (e *dialError) Error() string { return "lifeline: dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// isDialError tells a request that never reached a frontend.
func isDialError(err error) bool {
	var d *dialError
	var op *net.OpError
	return errors.As(err, &d) || errors.As(err, &op) && op.Op == "dial"
}

// tcpConns tracks the client's TCP connections, so that DropConnections
// can cut them.
type tcpConns struct {
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func newTCPConns() *tcpConns { return &tcpConns{conns: map[*trackedConn]struct{}{}} }

func (t *tcpConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, &dialError{err}
	}
	tc := &trackedConn{Conn: conn, set: t}
	t.mu.Lock()
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc, nil
}

func (t *tcpConns) dropAll() {
	t.mu.Lock()
	conns := make([]*trackedConn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

type trackedConn struct {
	net.Conn
	set  *tcpConns
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

// altSvc remembers, per host, the HTTP/3 endpoint its HTTPS responses
// advertised.
type altSvc struct {
	mu sync.Mutex
	h3 map[string]string // host:port → host:port of its HTTP/3 endpoint
}

func (a *altSvc) lookup(host string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h3, ok := a.h3[host]
	return h3, ok
}

func (a *altSvc) forget(host string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.h3, host)
}

// learn records the h3 entry of an Alt-Svc header value; "clear" forgets.
func (a *altSvc) learn(host, header string) {
	if header == "" {
		return
	}
	if strings.TrimSpace(header) == "clear" {
		a.forget(host)
		return
	}
	to, ok := parseAltSvcH3(host, header)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.h3 == nil {
		a.h3 = map[string]string{}
	}
	a.h3[host] = to
}

// parseAltSvcH3 returns the authority of the first h3 alternative of an
// Alt-Svc value (RFC 7838), e.g. `h3=":443"; ma=86400, h3-29=":443"`, with
// the origin's host where the alternative names none.
func parseAltSvcH3(origin, header string) (string, bool) {
	for alt := range strings.SplitSeq(header, ",") {
		proto, rest, ok := strings.Cut(strings.TrimSpace(alt), "=")
		if !ok || proto != "h3" {
			continue
		}
		value, _, _ := strings.Cut(rest, ";")
		value = strings.Trim(strings.TrimSpace(value), `"`)
		host, port, err := net.SplitHostPort(value)
		if err != nil || port == "" {
			continue
		}
		if host == "" {
			if host, _, err = net.SplitHostPort(origin); err != nil {
				host = origin
			}
		}
		return net.JoinHostPort(host, port), true
	}
	return "", false
}
