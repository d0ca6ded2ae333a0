package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"

	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// seededRequest is the stream the client tests compare against a
// fault-free run.
func seededRequest() client.Request {
	temp := 0.9
	return client.Request{Model: "tiny", Prompt: "Far away", MaxTokens: 160, Temperature: &temp, Seed: 11, IgnoreEOS: true}
}

// collect runs one stream and returns its tokens; at, if not nil, runs
// when the token of sequence number k arrives.
func collect(t *testing.T, c *client.Client, k int, at func()) []client.Token {
	t.Helper()
	var got []client.Token
	if _, err := c.Stream(t.Context(), seededRequest(), func(tok client.Token) {
		got = append(got, tok)
		if tok.SequenceNo == k && at != nil {
			at()
		}
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// sameClientTokens fails unless got is want: contiguous sequence numbers, the
// same token ids and text.
func sameClientTokens(t *testing.T, got, want []client.Token) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d tokens, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].SequenceNo != i+1 || got[i].TokenID != want[i].TokenID || got[i].Text != want[i].Text {
			t.Fatalf("token %d: %+v, want %+v", i+1, got[i], want[i])
		}
	}
}

// deadURL is an address where nothing listens (TCP and UDP).
func deadURL(t *testing.T, scheme string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return scheme + "://" + addr
}

// TestClientFailsOverToTheNextURL: the first URL refuses connections; the
// stream is served by the second, identical to a run against it alone.
func TestClientFailsOverToTheNextURL(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	want := collect(t, client.New(url), 0, nil)
	c := client.New(deadURL(t, "http"), url)
	defer c.Close()
	got := collect(t, c, 0, nil)
	sameClientTokens(t, got, want)
	if st := c.Stats(); st.Failovers < 1 || st.Resumes != 0 {
		t.Fatalf("stats %+v: want a failover and no resume", st)
	}
}

// TestClientResumesAfterDroppedConnection: mid-stream the client's
// connections are cut (not the frontend); the stream resumes by token on
// the next URL of the list (the same frontend, listed twice), contiguous
// and bit-identical.
func TestClientResumesAfterDroppedConnection(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	want := collect(t, client.New(url), 0, nil)
	c := client.New(url, url)
	defer c.Close()
	got := collect(t, c, 40, c.DropConnections)
	sameClientTokens(t, got, want)
	if st := c.Stats(); st.Resumes < 1 {
		t.Fatalf("stats %+v: want a resume", st)
	}
	if !strings.Contains(clustertest.Metrics(t, url), `lifeline_frontend_resumes_total{result="ok"}`) {
		t.Fatal("the frontend counted no resume")
	}
}

// tlsFrontend starts a --tls frontend and returns its https URL and a TLS
// config that trusts it.
func tlsFrontend(t *testing.T, n *clustertest.Node) (string, *tls.Config) {
	t.Helper()
	addr := strings.TrimPrefix(clustertest.StartFrontend(t, n, "--tls"), "https://")
	ca, err := pki.Load(n.Env.Certs, "h2")
	if err != nil {
		t.Fatal(err)
	}
	return "https://" + addr, &tls.Config{RootCAs: ca.RootCAs, ServerName: "localhost"}
}

// tlsMetric sums the samples of name (any labels) on the frontend's page.
func tlsMetric(t *testing.T, url string, roots *tls.Config, name string) float64 {
	t.Helper()
	// The metrics listener is plain HTTP on loopback, apart from the API.
	resp, err := http.Get(clustertest.MetricsURL(t, url) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for line := range strings.SplitSeq(string(page), "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}

// TestClientHTTP3Rebind: a seeded stream over HTTP/3; mid-stream the
// client moves its connection to a new UDP socket and stops using the old
// one (a NAT rebinding). The stream goes on on the same connection: no
// resume request (client and frontend agree), no gap or duplicate, the
// tokens of a fault-free run.
func TestClientHTTP3Rebind(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url, roots := tlsFrontend(t, n)
	plain := client.NewWith(client.Options{TLS: roots, H3: true}, url)
	want := collect(t, plain, 0, nil)
	plain.Close()
	c := client.NewWith(client.Options{TLS: roots, H3: true}, url)
	defer c.Close()
	got := collect(t, c, 30, func() {
		if err := c.Rebind(t.Context()); err != nil {
			t.Errorf("rebind: %v", err)
		}
	})
	sameClientTokens(t, got, want)
	if st := c.Stats(); st.Rebinds != 1 || st.Resumes != 0 {
		t.Fatalf("stats %+v: want one rebind and no resume", st)
	}
	if r := tlsMetric(t, url, roots, "lifeline_frontend_resumes_total"); r != 0 {
		t.Fatalf("the frontend saw %v resumes", r)
	}
	// Closed, the client reads from no socket, the retired one included
	// (its transport's Close once never returned, and its read loop spun
	// on a core for the rest of the process).
	c.Close()
	proctest.WaitFor(t, 5*time.Second, "the client's sockets to stop reading", func() (bool, string) {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		n := strings.Count(stacks, "frontend/client.(*socket).ReadFrom")
		return n == 0, fmt.Sprintf("%d goroutines in socket.ReadFrom", n)
	})
}

// TestClientHTTP3ZeroRTTResume: the stream's HTTP/3 connection (which got
// a session ticket) is closed by the client mid-stream; the resume GET
// goes out as 0-RTT early data on a new connection, the frontend accepts
// it, and the stream continues bit-identical.
func TestClientHTTP3ZeroRTTResume(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url, roots := tlsFrontend(t, n)
	c := client.NewWith(client.Options{TLS: roots, H3: true}, url)
	defer c.Close()
	want := collect(t, c, 0, nil)
	got := collect(t, c, 40, c.DropConnections)
	sameClientTokens(t, got, want)
	if st := c.Stats(); st.Resumes < 1 || st.ZeroRTTResumes < 1 {
		t.Fatalf("stats %+v: want a resume sent and accepted as 0-RTT", st)
	}
	if r := tlsMetric(t, url, roots, "lifeline_frontend_zero_rtt_resumes_total"); r < 1 {
		t.Fatalf("the frontend counted %v 0-RTT resumes", r)
	}
}

// TestClientTLSAltSvcSwitchesToHTTP3: without H3, the first request goes
// over HTTPS (TCP); the Alt-Svc of its answer moves the resume to HTTP/3.
func TestClientTLSAltSvcSwitchesToHTTP3(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url, roots := tlsFrontend(t, n)
	c := client.NewWith(client.Options{TLS: roots}, url)
	defer c.Close()
	want := collect(t, c, 0, nil)
	got := collect(t, c, 40, c.DropConnections)
	sameClientTokens(t, got, want)
	// Only HTTP/3 counts a resume as 0-RTT: the resume went over it.
	if st := c.Stats(); st.ZeroRTTResumes < 1 {
		t.Fatalf("stats %+v: the resume did not go over HTTP/3 with 0-RTT", st)
	}
}

// TestFrontendRefusesEarlyPOST: a POST /v1/completions that arrives as
// 0-RTT early data, from a sender that never completes the handshake (an
// attacker replaying a recorded ClientHello and its early data), is
// answered 425 Too Early and starts nothing; a resume GET in early data
// from the same kind of sender is not refused.
func TestFrontendRefusesEarlyPOST(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url, roots := tlsFrontend(t, n)
	before := requestsStarted(t, n, "n1-decode-tiny-0")
	routes := tlsMetric(t, url, roots, "lifeline_frontend_cache_aware_routes_total")
	body := `{"model":"tiny","prompt":"hello","max_tokens":10,"seed":2,"stream":true}`
	if status := earlyRequest(t, url, roots, http.MethodPost, "/v1/completions", body); status != http.StatusTooEarly {
		t.Fatalf("early POST: status %d, want 425", status)
	}
	if r := tlsMetric(t, url, roots, "lifeline_frontend_too_early_total"); r != 1 {
		t.Fatalf("the frontend counted %v refusals", r)
	}
	if got := tlsMetric(t, url, roots, "lifeline_frontend_cache_aware_routes_total"); got != routes {
		t.Fatalf("routing decisions %v → %v: the early POST was routed", routes, got)
	}
	if after := requestsStarted(t, n, "n1-decode-tiny-0"); after != before {
		t.Fatalf("the worker started %d requests", after-before)
	}
	// A resume read is allowed early: it gets the frontend's answer
	// (401: no token), not 425.
	if status := earlyRequest(t, url, roots, http.MethodGet, "/v1/streams/cmpl-x", ""); status != http.StatusUnauthorized {
		t.Fatalf("early resume GET: status %d, want 401", status)
	}
}

// earlyRequest sends one request as 0-RTT early data on a connection whose
// handshake never completes: once the request's last byte went out in a
// 0-RTT packet, the sender drops everything it would send (its Finished
// included) and only listens. It returns the status of the answer.
func earlyRequest(t *testing.T, base string, roots *tls.Config, method, path, body string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cfg := roots.Clone()
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	// An honest connection first, for a session ticket that allows 0-RTT.
	honest := &http3.Transport{TLSClientConfig: cfg}
	resp, err := (&http.Client{Transport: honest}).Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	honest.Close()

	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		t.Fatal(err)
	}
	sock := &earlyOnlySocket{PacketConn: udp, released: make(chan struct{})}
	defer sock.release()
	tr := &quic.Transport{Conn: sock}
	defer tr.Close()
	raddr, err := net.ResolveUDPAddr("udp", strings.TrimPrefix(base, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	tcfg := cfg.Clone()
	tcfg.NextProtos = []string{http3.NextProtoH3}
	qcfg := &quic.Config{Versions: []quic.Version{quic.Version1}, Tracer: func(context.Context, bool, quic.ConnectionID) qlogwriter.Trace {
		return zeroRTTWatch{sock}
	}}
	conn, err := tr.DialEarly(ctx, raddr, tcfg, qcfg)
	if err != nil {
		t.Fatal(err)
	}
	cc := (&http3.Transport{}).NewClientConn(conn)
	rs, err := cc.OpenRequestStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sock.watch(rs.StreamID())
	req, _ := http.NewRequest(method, base+path, nil)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = int64(len(body))
	}
	if err := rs.SendRequestHeader(req); err != nil {
		t.Fatal(err)
	}
	if body != "" {
		if _, err := rs.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	rs.Close()
	select {
	case <-sock.released:
	case <-ctx.Done():
		t.Fatal("the request never went out in a 0-RTT packet")
	}
	rsp, err := rs.ReadResponse()
	if err != nil {
		t.Fatal(err)
	}
	rsp.Body.Close()
	return rsp.StatusCode
}

// earlyOnlySocket lets a QUIC client send only Initial and 0-RTT packets:
// the server never sees its Handshake packets (its Finished), so the
// handshake never completes there. It holds back what the server sends
// until the request's last STREAM frame went out in a 0-RTT packet (its
// qlog events say so), so that the request goes as early data.
type earlyOnlySocket struct {
	net.PacketConn
	released chan struct{}
	once     sync.Once
	mu       sync.Mutex
	stream   quic.StreamID
	watching bool
}

func (s *earlyOnlySocket) release() { s.once.Do(func() { close(s.released) }) }

func (s *earlyOnlySocket) watch(id quic.StreamID) {
	s.mu.Lock()
	s.stream, s.watching = id, true
	s.mu.Unlock()
}

func (s *earlyOnlySocket) SetReadBuffer(n int) error {
	return s.PacketConn.(*net.UDPConn).SetReadBuffer(n)
}
func (s *earlyOnlySocket) SetWriteBuffer(n int) error {
	return s.PacketConn.(*net.UDPConn).SetWriteBuffer(n)
}

func (s *earlyOnlySocket) ReadFrom(b []byte) (int, net.Addr, error) {
	<-s.released
	return s.PacketConn.ReadFrom(b)
}

func (s *earlyOnlySocket) WriteTo(b []byte, addr net.Addr) (int, error) {
	if !initialOr0RTT(b) {
		return len(b), nil
	}
	return s.PacketConn.WriteTo(b, addr)
}

// initialOr0RTT tells whether a QUIC v1 datagram holds only Initial and
// 0-RTT packets (long headers of type 0 and 1; RFC 9000 §17.2).
func initialOr0RTT(b []byte) bool {
	varint := func(b []byte) (uint64, int) {
		if len(b) == 0 {
			return 0, 1 << 30
		}
		n := 1 << (b[0] >> 6)
		if len(b) < n {
			return 0, 1 << 30
		}
		v := uint64(b[0] & 0x3f)
		for _, c := range b[1:n] {
			v = v<<8 | uint64(c)
		}
		return v, n
	}
	for len(b) > 0 {
		typ := b[0] >> 4 & 3
		if b[0]&0x80 == 0 || typ > 1 || len(b) < 7 {
			return false
		}
		p := 5
		p += 1 + int(b[p]) // destination connection id
		if p >= len(b) {
			return false
		}
		p += 1 + int(b[p]) // source connection id
		if p > len(b) {
			return false
		}
		if typ == 0 { // Initial: the token
			tl, n := varint(b[p:])
			p += n + int(tl)
		}
		if p > len(b) {
			return false
		}
		l, n := varint(b[p:])
		p += n + int(l)
		if p > len(b) {
			return false
		}
		b = b[p:]
	}
	return true
}

// zeroRTTWatch is the sender's qlog trace: it releases the socket once the
// watched stream's FIN went out in a 0-RTT packet.
type zeroRTTWatch struct{ s *earlyOnlySocket }

func (w zeroRTTWatch) AddProducer() qlogwriter.Recorder { return w }
func (w zeroRTTWatch) Close() error                     { return nil }

func (w zeroRTTWatch) RecordEvent(ev qlogwriter.Event) {
	s := w.s
	p, ok := ev.(qlog.PacketSent)
	if !ok || p.Header.PacketType != qlog.PacketType0RTT {
		return
	}
	s.mu.Lock()
	id, watching := s.stream, s.watching
	s.mu.Unlock()
	for _, f := range p.Frames {
		if sf, ok := f.Frame.(*qlog.StreamFrame); ok && watching && sf.StreamID == id && sf.Fin {
			s.release()
		}
	}
}

// TestClientResumesOnAnotherFrontend: two frontends share a static resume
// secret; the one serving the stream is killed mid-stream; the client
// resumes on the other, bit-identical and contiguous.
func TestClientResumesOnAnotherFrontend(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	secret := t.TempDir() + "/secret"
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := clustertest.StartFrontendProc(t, n, "--resume-secret-file", secret)
	b := clustertest.StartFrontend(t, n, "--resume-secret-file", secret)
	want := collect(t, client.New(b), 0, nil)
	c := client.New(a.URL, b)
	defer c.Close()
	got := collect(t, c, 40, func() { a.Signal(syscall.SIGKILL) })
	sameClientTokens(t, got, want)
	if st := c.Stats(); st.Resumes < 1 {
		t.Fatalf("stats %+v: want a resume", st)
	}
}

// TestClientResumesOnAnotherFrontendHTTP3: two TLS frontends of one
// cluster (resume tokens and TLS session tickets both from the cluster's
// key ring); the client streams over HTTP/3 from A, A is SIGKILLed
// mid-stream, and the client resumes on B with its resume GET as 0-RTT
// early data (a session ticket A issued, which B accepts): bit-identical,
// contiguous.
func TestClientResumesOnAnotherFrontendHTTP3(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--tls", "--id", "A")
	aURL := a.URL
	bURL, roots := tlsFrontend(t, n)
	want := collect(t, client.NewWith(client.Options{TLS: roots, H3: true}, bURL), 0, nil)
	c := client.NewWith(client.Options{TLS: roots, H3: true}, aURL, bURL)
	defer c.Close()
	got := collect(t, c, 40, func() { a.Signal(syscall.SIGKILL) })
	sameClientTokens(t, got, want)
	if st := c.Stats(); st.Resumes < 1 || st.ZeroRTTResumes < 1 {
		t.Fatalf("stats %+v: want a resume on B sent and accepted as 0-RTT", st)
	}
	if r := tlsMetric(t, bURL, roots, "lifeline_frontend_zero_rtt_resumes_total"); r < 1 {
		t.Fatalf("B counted %v 0-RTT resumes", r)
	}
}
