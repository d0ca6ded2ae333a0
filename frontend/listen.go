package frontend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/internal/debugsock"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// The API's listeners (cleartext HTTP/1.1 + h2c, or TLS HTTP/1.1 + HTTP/2
// with HTTP/3 on the same port) under the Limits, and the metrics
// listener, apart from the API: metrics tell who is served how much, and
// stay on a loopback address unless configured otherwise.

// handler routes the API.
func (s *Server) handler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /v1/streams/{id}", s.handleResume)
	mux.HandleFunc("DELETE /v1/streams/{id}", s.handleCancel)
	mux.HandleFunc("POST /v1/responses", s.handleResponseCreate)
	mux.HandleFunc("GET /v1/responses/{id}", s.handleResponseGet)
	mux.HandleFunc("DELETE /v1/responses/{id}", s.handleResponseDelete)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.handleResponseCancel)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", s.handleResponseInputItems)
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.HandleFunc("GET /v1/models/{id}", s.handleModel)
	// JSON for what the routes above do not take: a known path with
	// another method (405), any other path (404; /metrics included: the
	// metrics have their own listener).
	allow := map[string]string{"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET",
		"/v1/models/{id}": "GET", "/v1/streams/{id}": "GET, DELETE",
		"/v1/responses": "POST", "/v1/responses/{id}": "GET, DELETE", "/v1/responses/{id}/cancel": "POST", "/v1/responses/{id}/input_items": "GET", "/healthz": "GET", "/readyz": "GET"}
	for path, methods := range allow {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", methods)
			writeErrorBody(w, http.StatusMethodNotAllowed, openai.ErrInvalidRequest, "method_not_allowed", "",
				fmt.Sprintf("%s %s: method not allowed (allowed: %s)", r.Method, r.URL.Path, methods))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErrorBody(w, http.StatusNotFound, openai.ErrInvalidRequest, "not_found", "", fmt.Sprintf("%s %s: no such endpoint", r.Method, r.URL.Path))
	})
	return mux
}

// serveMetrics serves /metrics on the metrics address until ctx ends, and
// writes "frontend: metrics on ADDR" to ready. No address: no metrics.
func (s *Server) serveMetrics(ctx context.Context, ready io.Writer) error {
	if s.opts.MetricsAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.opts.MetricsAddr)
	if err != nil {
		return fmt.Errorf("frontend: metrics: listen %s: %w", s.opts.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	s.goes.Go(func() { <-ctx.Done(); srv.Close() })
	s.goes.Go(func() { srv.Serve(ln) })
	fmt.Fprintf(ready, "frontend: metrics on %s\n", ln.Addr())
	return nil
}

// serveDebug serves the debug pages on the debug socket until ctx ends,
// and writes "frontend: debug on unix:PATH" to ready. No socket: no
// debug pages.
func (s *Server) serveDebug(ctx context.Context, ready io.Writer) error {
	if s.opts.DebugSocket == "" {
		return nil
	}
	ln, err := debugsock.Listen(s.opts.DebugSocket)
	if err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	mux := http.NewServeMux()
	var traces http.Handler
	if s.opts.Tracing != nil {
		traces = s.opts.Tracing.Handler()
	}
	debugsock.Mount(mux, traces)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	s.goes.Go(func() { <-ctx.Done(); srv.Close() })
	s.goes.Go(func() { srv.Serve(ln) })
	fmt.Fprintf(ready, "frontend: debug on %s\n", debugsock.Base(s.opts.DebugSocket))
	return nil
}

// capped wraps the API's TCP listener in the connection cap (none with
// the limits off).
func (s *Server) capped(ln net.Listener, cleartext bool) net.Listener {
	if s.limits.Off {
		return ln
	}
	c := newCapListener(ln, &s.goes, s.limits.MaxConns, cleartext, s.metrics.connsRefused.Inc)
	s.metrics.gaugeOpen(c.Open)
	return c
}

// serveCleartext serves plain HTTP/1.1 and cleartext HTTP/2 (prior
// knowledge) on ln until ctx ends.
func (s *Server) serveCleartext(ctx context.Context, ln net.Listener, ready io.Writer) error {
	srv := s.limits.httpServer(s.handler())
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	stopped := make(chan struct{})
	s.goes.Go(func() { <-ctx.Done(); shutdown(srv); close(stopped) })
	fmt.Fprintf(ready, "frontend: listening on %s\n", ln.Addr())
	if err := srv.Serve(s.capped(ln, true)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-stopped // Serve returns as the shutdown begins: let the streams end
	return nil
}

// listenAPI opens the API's TCP listener on addr and, with TLS, the UDP
// socket of HTTP/3 on the same port. A port of 0 picks a free TCP port;
// the same UDP port may be taken (by any QUIC socket on the host), so then
// it tries other ports before it fails. listen is net.Listen but in tests.
func listenAPI(addr string, withTLS bool, listen func(network, addr string) (net.Listener, error)) (net.Listener, net.PacketConn, error) {
	_, port, _ := net.SplitHostPort(addr)
	tries := 1
	if withTLS && (port == "0" || port == "") {
		tries = 32
	}
	var err error
	for range tries {
		var ln net.Listener
		if ln, err = listen("tcp", addr); err != nil {
			return nil, nil, fmt.Errorf("frontend: listen %s: %w", addr, err)
		}
		if !withTLS {
			return ln, nil, nil
		}
		a := ln.Addr().(*net.TCPAddr)
		var udp net.PacketConn
		if udp, err = net.ListenPacket("udp", net.JoinHostPort(a.IP.String(), strconv.Itoa(a.Port))); err == nil {
			return ln, udp, nil
		}
		ln.Close()
		err = fmt.Errorf("frontend: HTTP/3 on UDP %d: %w", a.Port, err)
	}
	return nil, nil, err
}

// serveTLS serves HTTPS on ln (HTTP/2 negotiated by ALPN) and HTTP/3 on
// the same UDP port, advertised with Alt-Svc, until ctx ends. Clients of
// the API are not components: no client certificate.
func (s *Server) serveTLS(ctx context.Context, ln net.Listener, udp net.PacketConn, ready io.Writer) error {
	base, err := pki.Load(s.opts.CertDir, "h2")
	if err != nil {
		ln.Close()
		udp.Close()
		return err
	}
	tcpTLS := base.Clone()
	tcpTLS.ClientAuth, tcpTLS.NextProtos = tls.NoClientCert, []string{"h2", "http/1.1"}
	quicTLS := base.Clone()
	quicTLS.ClientAuth, quicTLS.NextProtos = tls.NoClientCert, []string{"h3"}
	port := ln.Addr().(*net.TCPAddr).Port
	// Session tickets sealed with keys derived from the resume keys: every
	// frontend of the cluster resumes every other's TLS sessions (and
	// accepts their 0-RTT), through key rotations.
	quicTLS.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := quicTLS.Clone()
		c.GetConfigForClient = nil
		c.SetSessionTicketKeys(s.keys.ticketKeys())
		return c, nil
	}
	mux := s.handler()
	// 0-RTT on, for idempotent reads only (early.go).
	h3 := &http3.Server{Handler: s.earlyGuard(mux), TLSConfig: quicTLS, QUICConfig: &quic.Config{Allow0RTT: true}, ConnContext: withQUICConn}
	s.limits.http3Server(h3, h3.QUICConfig)
	altSvc := fmt.Sprintf(`h3=":%d"; ma=86400`, port)
	srv := s.limits.httpServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Alt-Svc", altSvc)
		mux.ServeHTTP(w, r)
	}))
	srv.TLSConfig = tcpTLS
	stopped := make(chan struct{})
	s.goes.Go(func() {
		defer close(stopped)
		<-ctx.Done()
		var wg sync.WaitGroup
		wg.Go(func() {
			gctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			defer cancel()
			h3.Shutdown(gctx)
			h3.Close()
		})
		shutdown(srv)
		wg.Wait()
		udp.Close()
	})
	s.goes.Go(func() { h3.Serve(udp) })
	fmt.Fprintf(ready, "frontend: listening on %s\n", ln.Addr())
	if err := srv.Serve(tls.NewListener(s.capped(ln, false), tcpTLS)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-stopped
	return nil
}

// shutdownGrace is how long a stopping frontend lets its streams write
// their end (the requests end as frontend_stopping) before it closes
// their connections.
const shutdownGrace = 2 * time.Second

// shutdown stops srv: no new connections, a grace for open streams to
// write their end, then every connection closed.
func shutdown(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		srv.Close()
	}
}
