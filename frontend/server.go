// Package frontend is the client-facing side of Lifeline: the
// OpenAI-compatible HTTP/SSE and HTTP/3 API with resume, each request's
// run (the interpreter that carries out what the request machine
// decides), the token log's followers, failover records and takeover.
//
// The decisions are pure packages of their own, driven by events and an
// injected clock in the manner of etcd's raft: the request and takeover
// state machines in frontend/reqfsm, the router in frontend/route. The
// stream's wire format is package frontend/sse.
package frontend

import (
	"context"
	"crypto/tls"
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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
	"github.com/lifeline-llm/lifeline/internal/etcdlog"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/tracing"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
)

// Options configure a frontend.
type Options struct {
	Listen  string
	Etcd    []string
	EtcdTLS bool
	CertDir string
	Policy  reqfsm.Policy
	// ResumeWindow is how long a resumable request runs on without a
	// client, and how long a finished one stays resumable (default 60 s).
	ResumeWindow time.Duration
	// ResumeSecret signs resume tokens instead of the cluster's key ring
	// (schema.ResumeKeysKey), which every frontend shares by default.
	ResumeSecret []byte
	// AdvertiseURL is where clients reach this frontend, named in the
	// request records it owns (default: http(s)://<listen address>).
	AdvertiseURL string
	// NoFailoverRecords writes no request records: another frontend can
	// then neither take over nor replay this one's streams.
	NoFailoverRecords bool
	// RecordBytesMax bounds the bytes of the request records this
	// frontend may have live in etcd (default DefaultRecordBytesMax);
	// a streamed request over it is refused with a retryable 503.
	RecordBytesMax int64
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
	// CapacityWait bounds how long a request that finds no routable
	// instance of its model waits for one to register before a 503
	// (default DefaultCapacityWait; negative: do not wait). It sets
	// Policy.CapacityWait.
	CapacityWait time.Duration
	// ID names the frontend's record under schema.FrontendsPrefix, where
	// it acknowledges the registrations it applied (default: host, pid
	// and a random suffix).
	ID string
	// Limits bound what clients can hold: connections, streams, time and
	// bytes (limits.go).
	Limits Limits
	// MetricsAddr is where /metrics is served, apart from the API (""
	// serves none; the command's default is a loopback port).
	MetricsAddr string
	// DebugSocket, when set, is the unix socket (mode 0600) of the debug
	// pages: pprof profiles and /debug/traces. They name requests,
	// models and stacks, so they are never on the metrics listener.
	DebugSocket string
	// ResumeTokenMaxAge caps a resume token's lifetime: one whose expiry
	// lies further ahead is refused, whoever signed it (default
	// DefaultResumeTokenMaxAge).
	ResumeTokenMaxAge time.Duration
	// Tracing, when set, traces every request (its spans at
	// /debug/traces on the debug socket, and over OTLP when configured).
	Tracing *tracing.Tracing
}

// Server is one frontend replica.
type Server struct {
	// goes owns every goroutine the server starts; Run waits for them.
	goes    owned
	opts    Options
	limits  Limits // opts.Limits with the defaults
	slow    *slowWatch
	beat    *beat // streams' keep-alives
	log     *slog.Logger
	etcd    *clientv3.Client
	workTLS *tls.Config
	// kv asks agents to pull KV blocks (P/D hand-offs).
	kv *transferclient.Dialer

	keys *resumeKeys
	// recs writes and reads request records (nil: NoFailoverRecords).
	recs    *records
	ctx     context.Context // the server's: requests run under it
	metrics *metrics
	// tracer makes the requests' spans (nil: none).
	tracer  trace.Tracer
	retries retryBudgets
	// router has its own lock.
	router *route.Router

	// pool holds the connections to workers; capacity wakes requests
	// waiting for an instance; health is the registry watch's. Each has
	// its own lock.
	pool     *clientPool
	capacity capacitySignal
	health   watchHealth
	// ack acknowledges the registry view to draining agents, through key.
	ack *acker
	key *frontendKey

	mu      sync.Mutex
	addrs   map[string]string            // instance id → QUIC address
	active  map[string]map[*run]struct{} // instance id → runs on it
	nextID  uint64
	streams map[string]*stream
	// detach holds the worker streams of requests with a record: a
	// stopping frontend detaches them (their workers keep generating for
	// a takeover) rather than cancelling them.
	detach map[*workerclient.Stream]*stream
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
		if s.streams[st.id] == st { // not a later one of the same id (taken back)
			delete(s.streams, st.id)
		}
		s.mu.Unlock()
	})
}

// reapIdle cancels a resumable request nobody has followed for the resume
// window.
func (s *Server) reapIdle(st *stream) {
	if st.body.Response != nil && st.body.Response.Background {
		return // runs to its end, followed or not
	}
	st.mu.Lock()
	idle := st.watchers == 0 && !st.idleAt.IsZero() && time.Since(st.idleAt) > s.resumeWindow()
	st.mu.Unlock()
	if idle {
		st.cancel(errNotFollowed)
	}
}

// localStream is the log of request id this frontend drives, or drove
// to its end; nil if it has none, or lost the request to another
// frontend (whose record then says how it goes on).
func (s *Server) localStream(id string) *stream {
	s.mu.Lock()
	st := s.streams[id]
	s.mu.Unlock()
	if st == nil || st.rec == nil {
		return st
	}
	st.rec.mu.Lock()
	lost := st.rec.movedTo != ""
	st.rec.mu.Unlock()
	if lost {
		return nil
	}
	return st
}

// bearer is req's bearer token (Authorization: Bearer, the scheme in any
// case); false when it names another scheme or none.
func bearer(req *http.Request) (string, bool) {
	v := strings.TrimSpace(req.Header.Get("Authorization"))
	f := strings.Fields(v)
	if len(f) == 0 || !strings.EqualFold(f[0], "Bearer") {
		return "", false
	}
	return strings.TrimSpace(v[len(f[0]):]), true
}

// checkToken checks a request's resume token (Authorization: Bearer, or
// the Lifeline-Resume-Token header) for the request in its path.
func (s *Server) checkToken(w http.ResponseWriter, req *http.Request) (string, bool) {
	id := req.PathValue("id")
	tok, _ := bearer(req)
	if tok == "" {
		tok = req.Header.Get("Lifeline-Resume-Token")
	}
	if tok == "" && req.Method == http.MethodGet {
		// An EventSource cannot set headers: it reconnects to the URL it
		// was given, with Last-Event-ID.
		tok = req.URL.Query().Get("token")
	}
	if err := s.keys.Check(tok, id, time.Now()); err != nil {
		s.metrics.resumes.WithLabelValues("refused").Inc()
		writeError(w, http.StatusUnauthorized, openai.ErrInvalidRequest, err.Error())
		return id, false
	}
	return id, true
}

// handleResume replays a stream after the client's last sequence number
// (Last-Event-ID, or ?starting_after=N) and follows it to its end.
func (s *Server) handleResume(w http.ResponseWriter, req *http.Request) {
	id, ok := s.checkToken(w, req)
	if !ok || s.resumeChoices(w, req, id) {
		return
	}
	after := req.Header.Get("Last-Event-ID")
	if q := req.URL.Query().Get("starting_after"); q != "" {
		after = q
	}
	from, err := parsePosition(after)
	if err != nil {
		writeParamError(w, err)
		return
	}
	st := s.localStream(id)
	if st == nil {
		// Not served here (or not any more): its record says where it is.
		s.resumeFromRecord(w, req, id, from)
		return
	}
	w.Header().Set("Lifeline-Request-Id", st.id)
	s.metrics.resumes.WithLabelValues("ok").Inc()
	s.follow(w, req, st, from, false)
}

func (s *Server) handleCancel(w http.ResponseWriter, req *http.Request) {
	id, ok := s.checkToken(w, req)
	if !ok || s.cancelChoices(w, req, id) {
		return
	}
	st := s.localStream(id)
	if st == nil {
		s.cancelFromRecord(w, req, id)
		return
	}
	done, r, _ := st.state()
	if done && (r.Err == nil || r.Err.Type != openai.ErrCancelledType) {
		// Nothing left to cancel: it ended on its own.
		writeJSON(w, http.StatusOK, map[string]any{"id": st.id, "cancelled": false, "finished": true})
		return
	}
	st.cancel(errClientCancelled)
	writeJSON(w, http.StatusOK, map[string]any{"id": st.id, "cancelled": true})
}

// ShutdownWait bounds how long Run waits, once ctx is done and its
// requests are detached, for the goroutines it started.
const ShutdownWait = 5 * time.Second

// ErrGoroutinesOutlived is in Run's error when goroutines it started were
// still running ShutdownWait after the shutdown.
var ErrGoroutinesOutlived = errors.New("frontend: goroutines outlived the shutdown")

// Run serves until ctx is done. It writes "frontend: listening on ADDR"
// to ready once it accepts connections.
//
// It returns once every goroutine it started has returned (the requests
// detached or handed over, record writes done): a frontend that stops
// leaves nothing running. One still running ShutdownWait after the
// shutdown is a bug, reported in the error as ErrGoroutinesOutlived.
func Run(ctx context.Context, opts Options, log *slog.Logger, ready io.Writer) (err error) {
	s, err := newServer(opts, log)
	if err != nil {
		return err
	}
	defer s.close()
	defer s.key.revoke() // before close: agents stop waiting for this one
	defer func() {       // after the contexts below end, before etcd closes
		if left := s.goes.wait(ShutdownWait); left != 0 {
			err = errors.Join(err, fmt.Errorf("%w: %d still running %v after the shutdown", ErrGoroutinesOutlived, left, ShutdownWait))
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Requests run under their own context, ended once their worker
	// streams are detached: a stopping frontend hands them over (the
	// workers keep generating for a takeover) instead of cancelling them.
	rctx, stopRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRequests()
	defer context.AfterFunc(ctx, func() {
		s.metrics.detachedOnStop.Add(float64(s.detachAll()))
		stopRequests()
	})()
	s.ctx = rctx
	// Serve only with a view of the registry: one full read first.
	rev, err := s.firstSync(ctx, 30*time.Second)
	if err != nil {
		return fmt.Errorf("frontend: read the registry: %w", err)
	}
	s.goes.Go(func() { s.ack.run(ctx) })
	s.goes.Go(func() { s.beat.run(ctx) })
	s.goes.Go(func() { s.watch(ctx, rev) })
	ln, udp, err := listenAPI(s.opts.Listen, s.opts.TLS, net.Listen)
	if err != nil {
		return err
	}
	closeAll := func() {
		ln.Close()
		if udp != nil {
			udp.Close()
		}
	}
	if err := s.startFailover(ctx, ln.Addr(), rev); err != nil {
		closeAll()
		return err
	}
	if err := s.serveMetrics(ctx, ready); err != nil {
		closeAll()
		return err
	}
	if err := s.serveDebug(ctx, ready); err != nil {
		closeAll()
		return err
	}
	if !s.opts.TLS {
		return s.serveCleartext(ctx, ln, ready)
	}
	return s.serveTLS(ctx, ln, udp, ready)
}

// newServer sets up a server's clients: of workers, of agents' KV
// transfer endpoints, and of etcd. close releases them.
func newServer(opts Options, log *slog.Logger) (*Server, error) {
	if err := opts.Limits.Validate(); err != nil {
		return nil, err
	}
	if opts.ResumeTokenMaxAge < 0 {
		return nil, fmt.Errorf("frontend: ResumeTokenMaxAge %v < 0", opts.ResumeTokenMaxAge)
	}
	if opts.Policy == (reqfsm.Policy{}) {
		opts.Policy = reqfsm.DefaultPolicy
	}
	switch {
	case opts.CapacityWait > 0:
		opts.Policy.CapacityWait = opts.CapacityWait
	case opts.CapacityWait < 0:
		opts.Policy.CapacityWait = 0
	}
	s := &Server{opts: opts, log: log, router: route.NewRouter(), addrs: map[string]string{},
		active: map[string]map[*run]struct{}{}, streams: map[string]*stream{}, detach: map[*workerclient.Stream]*stream{}, keys: newResumeKeys(opts.ResumeSecret), metrics: newMetrics(),
		limits: opts.Limits.withDefaults()}
	s.keys.maxAge = opts.ResumeTokenMaxAge
	s.slow = &slowWatch{goes: &s.goes, timeout: s.limits.writeTimeout(), m: s.metrics}
	s.beat = &beat{every: s.limits.KeepAlive}
	if opts.Tracing != nil {
		s.tracer = opts.Tracing.Tracer("github.com/lifeline-llm/lifeline/frontend")
	}
	kvTLS, err := transferclient.TLS(opts.CertDir)
	if err != nil {
		return nil, fmt.Errorf("frontend: certs: %w", err)
	}
	if s.workTLS, err = workerclient.ClientTLS(opts.CertDir); err != nil {
		return nil, fmt.Errorf("frontend: certs: %w", err)
	}
	s.pool = newClientPool(s.workTLS)
	s.retries = newRetryBudgets(s.metrics.reg)
	s.metrics.gaugeConns(s.pool.openConns)
	ecfg := clientv3.Config{Endpoints: opts.Etcd, DialTimeout: 2 * time.Second, Logger: etcdlog.New(log),
		DialKeepAliveTime: etcdlog.KeepAliveTime, DialKeepAliveTimeout: etcdlog.KeepAliveTimeout}
	if opts.EtcdTLS {
		if ecfg.TLS, err = pki.EtcdClientTLS(opts.CertDir); err != nil {
			return nil, err
		}
	}
	if s.etcd, err = clientv3.New(ecfg); err != nil {
		return nil, fmt.Errorf("frontend: etcd: %w", err)
	}
	s.kv = transferclient.NewDialer(kvTLS)
	if s.opts.ID, err = frontendID(opts, s.workTLS); err != nil {
		return nil, err
	}
	// Every line this frontend logs carries its id (a correlation field
	// beside request_id and request_epoch).
	s.log = s.log.With("frontend_id", s.opts.ID)
	s.key = &frontendKey{goes: &s.goes, etcd: s.etcd, id: s.opts.ID}
	s.ack = newAcker(s.key.put, ackEvery)
	s.key.lost = s.ack.rewrite
	return s, nil
}

func (s *Server) close() {
	s.etcd.Close()
	s.kv.Close()
}

func (s *Server) handleCompletions(w http.ResponseWriter, req *http.Request) { s.serve(w, req, false) }

func (s *Server) handleChat(w http.ResponseWriter, req *http.Request) { s.serve(w, req, true) }

// serve answers a completion or chat completion request: whole, or
// streamed from the moment a worker takes it.
func (s *Server) serve(w http.ResponseWriter, req *http.Request, chat bool) {
	body, err := s.admit(w, req, chat)
	if err != nil {
		s.refuse(w, req, err)
		return
	}
	if !s.mayServe(body.Model) {
		writeModelNotFound(w, body.Model)
		return
	}
	if !body.SeedSet {
		// Fixed now and stored with the request: every migration and
		// takeover samples with it, and the client can reproduce it.
		body.Seed, body.SeedSet, body.SeedDrawn = randomSeed(), true, true
	}
	if e := s.reserveRecord(&body, body.choiceCount()); e != nil {
		e.write(w)
		return
	}
	if body.choiceCount() > 1 {
		s.serveChoices(w, req, body, chat)
		return
	}
	st := s.start(body, chat, resumable(body, req))
	w.Header().Set("Lifeline-Request-Id", st.id)
	w.Header().Set("Lifeline-Seed", strconv.FormatUint(body.Seed, 10))
	w.Header().Set("Lifeline-Resume-Token", s.keys.IssueFor(st.id, time.Now(), s.resumeWindow()))
	if !body.Stream {
		s.writeWhole(w, req, st)
		return
	}
	if streamable(w, req, st) {
		s.follow(w, req, st, 0, true)
	}
}

// streamable waits until a new stream may be sent: its first token is
// there and its record stored (or given up), so that the resume token in
// the headers works at every frontend once they are sent. A request
// that ends before streaming anything is answered with an HTTP status
// (a plain 4xx/5xx), and false; so is a client that left.
func streamable(w http.ResponseWriter, req *http.Request, st *stream) bool {
	rerr, ok := st.awaitStart(req.Context())
	switch {
	case !ok:
		return false
	case rerr != nil:
		writeRequestErrorFor(w, rerr, &st.body)
		return false
	}
	if st.rec != nil {
		select {
		case <-st.rec.stored:
		case <-req.Context().Done():
			st.clientGone()
			return false
		}
	}
	return true
}

// start admits a request and runs it. The request lives on the server,
// not on the connection that made it: a resumable one survives its
// client's disconnect.
func (s *Server) start(body CompletionRequest, chat, resumable bool) *stream {
	return s.startAs(s.newID(chat), body, chat, resumable)
}

func (s *Server) newID(chat bool) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	prefix := "cmpl"
	if chat {
		prefix = "chatcmpl"
	}
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), s.nextID)
}

// startAs admits and runs a request under id.
func (s *Server) startAs(id string, body CompletionRequest, chat, resumable bool) *stream {
	now := time.Now()
	var deadline time.Time
	if body.TimeoutMs > 0 {
		deadline = now.Add(time.Duration(body.TimeoutMs) * time.Millisecond)
	}
	policy := s.opts.Policy
	policy.Retries = s.retries.of(body.Priority)
	r := reqfsm.NewRequest(id, make([]int, body.promptEstimate()), body.maxTokens(), deadline, policy, now)
	rctx, cancel := context.WithCancelCause(s.ctx)
	st := newStream(id, body, chat, resumable, cancel)
	if s.recs != nil && body.recorded() {
		// Written while the request is routed and prefilled; its tokens
		// wait for it (at most recordTimeout).
		st.rec = &recordState{stored: make(chan struct{})}
		rec := s.recs.newRecord(st, deadline, now)
		s.goes.Go(func() { s.recs.admit(s.ctx, st, rec) })
	}
	s.mu.Lock()
	s.streams[id] = st
	s.mu.Unlock()
	x := newRun(s, r, body, st)
	s.goes.Go(func() { x.loop(rctx) })
	return st
}

// track makes announcements of the failure of any of the instances ids
// reach x; untrack stops them all.
func (s *Server) track(x *run, ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.active[id] == nil {
			s.active[id] = map[*run]struct{}{}
		}
		s.active[id][x] = struct{}{}
	}
}

func (s *Server) untrack(x *run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, runs := range s.active {
		delete(runs, x)
	}
}

// dropClient forgets a connection that failed, so that the next request
// dials afresh.
func (s *Server) dropClient(ep reqfsm.Endpoint) { s.pool.drop(ep) }

// client is the connection to ep, with a stream counted on it: release it
// with s.pool.release when the stream ends.
func (s *Server) client(ctx context.Context, ep reqfsm.Endpoint) (*pooled, error) {
	s.mu.Lock()
	addr := s.addrs[ep.InstanceID]
	s.mu.Unlock()
	return s.pool.get(ctx, ep, addr)
}

// mayServe tells a model a request may wait for from one nobody serves:
// a model is known once any registration named it since this frontend
// started (its instances may all be restarting now); before the frontend
// has seen any registration at all, the cluster is starting and every
// model may be one it will serve.
func (s *Server) mayServe(model string) bool {
	return s.router.Knows(model) || !s.router.KnowsAny()
}

// handleModel answers GET /v1/models/{id}: a model with a ready
// instance, else 404 model_not_found.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range s.router.ReadyModels() {
		if m == id {
			writeJSON(w, http.StatusOK, map[string]any{"id": m, "object": "model", "created": 0, "owned_by": "lifeline"})
			return
		}
	}
	writeModelNotFound(w, id)
}

func writeModelNotFound(w http.ResponseWriter, model string) {
	writeErrorBody(w, http.StatusNotFound, openai.ErrInvalidRequest, CodeModelNotFound, "model", fmt.Sprintf("the model %q is not served here", model))
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	data := []map[string]any{}
	for _, m := range s.router.ReadyModels() {
		data = append(data, map[string]any{"id": m, "object": "model", "created": 0, "owned_by": "lifeline"})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}
