package frontend

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/quic-go/quic-go/http3"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
)

// Options configure a frontend.
type Options struct {
	Listen  string
	Etcd    []string
	EtcdTLS bool
	CertDir string
	Policy  Policy
	// ResumeWindow is how long a resumable request runs on without a
	// client, and how long a finished one stays resumable (default 60 s).
	ResumeWindow time.Duration
	// ResumeSecret signs resume tokens; replicas that share it accept each
	// other's tokens (default: random per process).
	ResumeSecret []byte
	// TLS serves HTTPS (HTTP/1.1 and HTTP/2) on the TCP address and HTTP/3
	// on the same UDP port, advertised with Alt-Svc, with the node
	// certificate from CertDir. Without it the API is plain HTTP/1.1 and
	// cleartext HTTP/2 (prior knowledge).
	TLS bool
	// NoKVPull stops naming peers a migrated request's new worker may pull
	// its prefix KV from: it then reuses only what its own node holds and
	// computes the rest (for networks where recomputing is cheaper than
	// moving, and for measuring the difference).
	NoKVPull bool
}

// Server is one frontend replica.
type Server struct {
	opts    Options
	log     *slog.Logger
	etcd    *clientv3.Client
	workTLS *tls.Config
	// kv asks agents to pull KV blocks (P/D hand-offs).
	kv *transferclient.Dialer

	mu      sync.Mutex
	router  *Router
	addrs   map[string]string // instance id → QUIC address
	clients map[Endpoint]*workerclient.Client
	active  map[string]map[*run]struct{} // instance id → runs on it
	nextID  uint64
	streams map[string]*stream
	keys    resumeKeys
	ctx     context.Context
	metrics *metrics
}

func (s *Server) resumeWindow() time.Duration {
	if s.opts.ResumeWindow > 0 {
		return s.opts.ResumeWindow
	}
	return time.Minute
}

// forgetLater drops a finished stream's log after the resume window.
func (s *Server) forgetLater(st *stream) {
	time.AfterFunc(s.resumeWindow(), func() {
		s.mu.Lock()
		delete(s.streams, st.id)
		s.mu.Unlock()
	})
}

// reapIdle cancels a resumable request nobody has followed for the resume
// window.
func (s *Server) reapIdle(st *stream) {
	st.mu.Lock()
	idle := st.watchers == 0 && !st.idleAt.IsZero() && time.Since(st.idleAt) > s.resumeWindow()
	st.mu.Unlock()
	if idle {
		st.cancel()
	}
}

// authorise checks a request's resume token (Authorization: Bearer, or the
// Lifeline-Resume-Token header) and returns its stream.
func (s *Server) authorise(w http.ResponseWriter, req *http.Request) *stream {
	id := req.PathValue("id")
	tok := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
	if tok == "" {
		tok = req.Header.Get("Lifeline-Resume-Token")
	}
	if err := s.keys.Check(tok, id, time.Now()); err != nil {
		s.metrics.resumes.WithLabelValues("refused").Inc()
		writeError(w, http.StatusUnauthorized, ErrInvalidRequest, err.Error())
		return nil
	}
	s.mu.Lock()
	st := s.streams[id]
	s.mu.Unlock()
	if st == nil {
		writeError(w, http.StatusNotFound, ErrInvalidRequest, "no such stream (finished longer ago than the resume window?)")
		return nil
	}
	return st
}

// handleResume replays a stream after the client's last sequence number
// (Last-Event-ID, or ?starting_after=N) and follows it to its end.
func (s *Server) handleResume(w http.ResponseWriter, req *http.Request) {
	st := s.authorise(w, req)
	if st == nil {
		return
	}
	after := req.Header.Get("Last-Event-ID")
	if q := req.URL.Query().Get("starting_after"); q != "" {
		after = q
	}
	from := 0
	if after != "" {
		n, err := strconv.Atoi(after)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, ErrInvalidRequest, fmt.Sprintf("last event id %q", after))
			return
		}
		from = n
	}
	w.Header().Set("Lifeline-Request-Id", st.id)
	s.metrics.resumes.WithLabelValues("ok").Inc()
	s.follow(w, req, st, from, false)
}

func (s *Server) handleCancel(w http.ResponseWriter, req *http.Request) {
	st := s.authorise(w, req)
	if st == nil {
		return
	}
	st.cancel()
	writeJSON(w, http.StatusOK, map[string]any{"id": st.id, "cancelled": true})
}

// Run serves until ctx is done. It writes "frontend: listening on ADDR"
// to log once it accepts connections.
func Run(ctx context.Context, opts Options, log *slog.Logger, ready io.Writer) error {
	if opts.Policy == (Policy{}) {
		opts.Policy = DefaultPolicy
	}
	s := &Server{opts: opts, log: log, router: NewRouter(), addrs: map[string]string{}, clients: map[Endpoint]*workerclient.Client{},
		active: map[string]map[*run]struct{}{}, streams: map[string]*stream{}, keys: newResumeKeys(opts.ResumeSecret), metrics: newMetrics()}
	kvTLS, err := transferclient.TLS(opts.CertDir)
	if err != nil {
		return fmt.Errorf("frontend: certs: %w", err)
	}
	s.kv = transferclient.NewDialer(kvTLS)
	defer s.kv.Close()
	if s.workTLS, err = workerclient.ClientTLS(opts.CertDir); err != nil {
		return fmt.Errorf("frontend: certs: %w", err)
	}
	ecfg := clientv3.Config{Endpoints: opts.Etcd, DialTimeout: 2 * time.Second}
	if opts.EtcdTLS {
		if ecfg.TLS, err = pki.Load(opts.CertDir, "h2"); err != nil {
			return err
		}
	}
	if s.etcd, err = clientv3.New(ecfg); err != nil {
		return fmt.Errorf("frontend: etcd: %w", err)
	}
	defer s.etcd.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.ctx = ctx
	// Serve only with a view of the registry: one full read first.
	rev, err := s.sync(ctx)
	for deadline := time.Now().Add(30 * time.Second); err != nil && time.Now().Before(deadline); rev, err = s.sync(ctx) {
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("frontend: read the registry: %w", err)
	}
	go s.watch(ctx, rev)
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("frontend: listen %s: %w", opts.Listen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /v1/streams/{id}", s.handleResume)
	mux.HandleFunc("DELETE /v1/streams/{id}", s.handleCancel)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	var handler http.Handler = mux
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	if !opts.TLS {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		go func() { <-ctx.Done(); srv.Close() }()
		fmt.Fprintf(ready, "frontend: listening on %s\n", ln.Addr())
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	// HTTPS on TCP (HTTP/2 negotiated by ALPN) and HTTP/3 on the same UDP
	// port. Clients of the API are not components: no client certificate.
	base, err := pki.Load(opts.CertDir, "h2")
	if err != nil {
		return err
	}
	tcpTLS := base.Clone()
	tcpTLS.ClientAuth, tcpTLS.NextProtos = tls.NoClientCert, []string{"h2", "http/1.1"}
	quicTLS := base.Clone()
	quicTLS.ClientAuth, quicTLS.NextProtos = tls.NoClientCert, []string{"h3"}
	port := ln.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenPacket("udp", fmt.Sprintf("%s:%d", ln.Addr().(*net.TCPAddr).IP, port))
	if err != nil {
		ln.Close()
		return fmt.Errorf("frontend: HTTP/3 on UDP %d: %w", port, err)
	}
	h3 := &http3.Server{Handler: mux, TLSConfig: quicTLS}
	altSvc := fmt.Sprintf(`h3=":%d"; ma=86400`, port)
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Alt-Svc", altSvc)
		mux.ServeHTTP(w, r)
	})
	srv.TLSConfig = tcpTLS
	go func() { <-ctx.Done(); srv.Close(); h3.Close(); udp.Close() }()
	go h3.Serve(udp)
	fmt.Fprintf(ready, "frontend: listening on %s\n", ln.Addr())
	if err := srv.Serve(tls.NewListener(ln, tcpTLS)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// watch keeps the router in line with the registry: a full read, then the
// watch; failure announcements fail the streams on that instance at once.
// sync replaces the router's view with a full read and returns its revision.
func (s *Server) sync(ctx context.Context) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := s.etcd.Get(gctx, schema.InstancesPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	nodes, err := s.etcd.Get(gctx, schema.NodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
	if err != nil {
		return 0, err
	}
	var all []Instance
	var allNodes []Node
	for _, kv := range nodes.Kvs {
		if n, ok := decodeNode(kv.Value); ok {
			allNodes = append(allNodes, n)
		}
	}
	s.mu.Lock()
	for _, kv := range resp.Kvs {
		if in, addr, ok := decodeRegistration(kv.Value); ok {
			all = append(all, in)
			s.addrs[in.ID] = addr
		}
	}
	s.router.Replace(all)
	s.router.ReplaceNodes(allNodes)
	s.mu.Unlock()
	return resp.Header.Revision, nil
}

func (s *Server) watch(ctx context.Context, rev int64) {
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			var err error
			if rev, err = s.sync(ctx); err != nil {
				time.Sleep(200 * time.Millisecond)
				continue // keep the last snapshot while etcd is unreachable
			}
		}
		wctx, wcancel := context.WithCancel(ctx)
		insts := s.etcd.Watch(wctx, schema.InstancesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		fails := s.etcd.Watch(wctx, schema.FailuresPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		nodes := s.etcd.Watch(wctx, schema.NodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	loop:
		for {
			select {
			case <-ctx.Done():
				wcancel()
				return
			case wr, ok := <-insts:
				if !ok || wr.Err() != nil {
					break loop
				}
				for _, ev := range wr.Events {
					id := strings.TrimPrefix(string(ev.Kv.Key), schema.InstancesPrefix)
					if ev.Type == clientv3.EventTypeDelete {
						s.instanceGone(id, 0, "deregistered")
						continue
					}
					if in, addr, ok := decodeRegistration(ev.Kv.Value); ok {
						s.mu.Lock()
						s.router.Update(in)
						s.addrs[in.ID] = addr
						s.mu.Unlock()
					}
				}
			case nr, ok := <-nodes:
				if !ok || nr.Err() != nil {
					break loop
				}
				s.mu.Lock()
				for _, ev := range nr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						s.router.RemoveNode(strings.TrimPrefix(string(ev.Kv.Key), schema.NodesPrefix))
					} else if n, ok := decodeNode(ev.Kv.Value); ok {
						s.router.UpdateNode(n)
					}
				}
				s.mu.Unlock()
			case fr, ok := <-fails:
				if !ok || fr.Err() != nil {
					break loop
				}
				for _, ev := range fr.Events {
					if ev.Type == clientv3.EventTypePut {
						var f schema.Failure
						if json.Unmarshal(ev.Kv.Value, &f) == nil {
							s.instanceGone(f.InstanceID, f.Generation, "worker died: "+f.Reason)
						}
					}
				}
			}
		}
		wcancel()
	}
}

func decodeNode(b []byte) (Node, bool) {
	var r schema.NodeRecord
	if json.Unmarshal(b, &r) != nil || r.Node == "" {
		return Node{}, false
	}
	n := Node{Name: r.Node, KVAddr: r.KVAddr, Prefixes: make(map[string]bool, len(r.Prefixes)), Updated: time.Unix(0, r.UpdatedUnixNano)}
	for _, p := range r.Prefixes {
		n.Prefixes[p] = true
	}
	return n, true
}

func decodeRegistration(b []byte) (Instance, string, bool) {
	var r schema.Registration
	if json.Unmarshal(b, &r) != nil || r.InstanceID == "" {
		return Instance{}, "", false
	}
	return Instance{ID: r.InstanceID, Generation: r.Generation, Model: r.Model, ModelRevision: r.ModelRevision, NumericsID: r.NumericsID,
		Ready: r.Ready, Draining: r.Draining, Outstanding: r.Running + r.Queued, Role: r.Role, Node: r.Node, KVAddr: r.KVAddr, KVIdentity: r.KVIdentity}, r.Addr, true
}

// instanceGone removes an instance and fails every stream on it now,
// without waiting for the stream itself to notice.
// A failure names a generation: a late notice about an older generation
// never touches the newer one that replaced it.
func (s *Server) instanceGone(id string, gen uint64, reason string) {
	s.mu.Lock()
	cur, known := s.router.instances[id]
	if gen == 0 {
		gen = cur.Generation
	}
	if known && cur.Generation <= gen {
		s.router.Remove(id)
	}
	s.router.Suppress(id, gen, time.Now())
	var runs []*run
	for r := range s.active[id] {
		runs = append(runs, r)
	}
	for ep, c := range s.clients {
		if ep.InstanceID == id && ep.Generation <= gen {
			c.Close()
			delete(s.clients, ep)
		}
	}
	s.mu.Unlock()
	for _, r := range runs {
		r.notify(event{failed: true, instance: id, gen: gen, reason: reason})
	}
}

// dropClient forgets a client that failed, so that the next request dials
// afresh.
func (s *Server) dropClient(ep Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[ep]; ok {
		c.Close()
		delete(s.clients, ep)
	}
}

// knownModel reports whether any registered instance serves model.
func (s *Server) knownModel(model string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range s.router.instances {
		if in.Model == model {
			return true
		}
	}
	return false
}

func (s *Server) client(ctx context.Context, ep Endpoint) (*workerclient.Client, error) {
	s.mu.Lock()
	c, ok := s.clients[ep]
	addr := s.addrs[ep.InstanceID]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := workerclient.Dial(dctx, addr, s.workTLS, ep.InstanceID, ep.Generation)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.clients[ep]; ok {
		c.Close()
		return old, nil
	}
	s.clients[ep] = c
	return c, nil
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	seen := map[string]bool{}
	var data []map[string]any
	for _, in := range s.router.instances {
		if in.Ready && !seen[in.Model] {
			seen[in.Model] = true
			data = append(data, map[string]any{"id": in.Model, "object": "model", "owned_by": "lifeline"})
		}
	}
	s.mu.Unlock()
	if data == nil {
		data = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// writeError writes the OpenAI error shape with a stable type.
func writeError(w http.ResponseWriter, code int, typ ErrorType, msg string) {
	if typ == ErrOverloaded {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ}})
}
