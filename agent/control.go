package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/internal/debugsock"
	"github.com/lifeline-llm/lifeline/internal/unixsock"
)

func (a *Agent) workers() []controlapi.Worker {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []controlapi.Worker
	for _, inst := range a.instances {
		out = append(out, a.workerLocked(inst))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out
}

// workerLocked is inst as the control API shows it. Agent.mu must be held.
func (a *Agent) workerLocked(inst *instance) controlapi.Worker {
	w := controlapi.Worker{InstanceID: inst.id, Role: inst.spec.Role, PID: inst.pid, Generation: inst.gen, Ready: inst.ready,
		LastExit: inst.lastExit, State: inst.state, NotReady: inst.notReady, Addr: inst.addr, Restarts: inst.restarts,
		NextAttempt: inst.nextAttempt, CrashLoops: inst.crashLoops, StartError: inst.startError}
	if n := inst.spec.ranks(); n > 1 {
		w.TP = n
		if inst.pid > 0 {
			w.Ranks = append(w.Ranks, controlapi.RankProc{Rank: 0, PID: inst.pid})
		}
		for i, pid := range inst.rankPIDs {
			w.Ranks = append(w.Ranks, controlapi.RankProc{Rank: i + 1, PID: pid})
		}
	}
	return w
}

func (a *Agent) status() controlapi.Status {
	st := controlapi.Status{NodeID: a.opts.NodeID, PID: os.Getpid(), Detector: a.detector.Name(), Instances: a.workers(), UptimeSeconds: time.Since(a.started).Seconds()}
	if a.detectorFallback != nil {
		st.DetectorFallback = a.detectorFallback.Error()
	}
	st.GPU = "ok"
	if a.gpuErr != nil {
		st.GPU = a.gpuErr.Error()
	} else if a.gpu != nil {
		st.GPU = fmt.Sprintf("ok: %d devices watched for XID and double-bit ECC errors", a.gpu.Devices())
	}
	a.mu.Lock()
	st.Etcd = controlapi.EtcdStatus{Endpoints: a.opts.Etcd, LeaseID: int64(a.lease), Routable: a.routableLocked(), LastRenewalMs: time.Since(a.leaseAlive).Milliseconds()}
	if a.drain != nil {
		d := a.drain.Drain
		st.Drain = &d
	}
	a.mu.Unlock()
	st.KVTransfer = controlapi.TransferStatus{TransportStatus: controlapi.TransportStatus(a.transport), Addr: a.kvAddr,
		Stats: controlapi.TransferStats(a.transfer.Stats())}
	ks := a.kvOwner.Stats()
	st.Arena = map[string]any{"slots": ks.Slots, "slots_in_use": ks.SlotsInUse, "by_state": ks.ByState, "leases": ks.Leases,
		"sessions": ks.Sessions, "unpublished_by_writer": ks.Unpublished, "leases_by_session": ks.LeasesBy, "orphans_reclaimed": ks.OrphansReclaimed, "sessions_replaced": ks.SessionsReplaced, "stale_rejects": ks.StaleRejects,
		"checksum_failures": ks.ChecksumFailures, "corrupt_dropped": ks.CorruptDropped}
	for state, n := range ks.ByState {
		a.metrics.slots.WithLabelValues(state).Set(float64(n))
	}
	return st
}

// writeError answers with a typed error: its code and message.
func writeError(w http.ResponseWriter, status int, err error) {
	var e *controlapi.Error
	if !errors.As(err, &e) {
		e = &controlapi.Error{Message: err.Error()}
	}
	writeJSON(w, status, e)
}

// errorStatus is the HTTP status of a typed control error.
func errorStatus(err error) int {
	switch {
	case errors.Is(err, controlapi.ErrUnknownInstance), errors.Is(err, controlapi.ErrNoSuchEndpoint):
		return http.StatusNotFound
	case errors.Is(err, controlapi.ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, controlapi.ErrNotDrained), errors.Is(err, controlapi.ErrDrainInProgress), errors.Is(err, controlapi.ErrBudgetTaken),
		errors.Is(err, controlapi.ErrNotInCrashLoop):
		return http.StatusConflict
	}
	var e *controlapi.Error
	if !errors.As(err, &e) {
		return http.StatusServiceUnavailable // not the request's fault: etcd, most likely
	}
	return http.StatusConflict
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (a *Agent) handleLivez(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"live": true})
}

// handleReadyz: the node is ready when it can prove its lease and at least
// one instance is ready.
func (a *Agent) handleReadyz(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	ready := a.routableLocked()
	someReady := false
	for _, inst := range a.instances {
		someReady = someReady || inst.ready
	}
	a.mu.Unlock()
	if ready && someReady {
		writeJSON(w, http.StatusOK, map[string]any{"ready": true})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "routable": ready, "instance_ready": someReady})
}

// serveControl answers nodectl on a unix socket that only the agent's user
// can reach.
func (a *Agent) serveControl(ctx context.Context) (*http.Server, error) {
	if err := os.MkdirAll(filepath.Dir(a.opts.Socket), 0o700); err != nil {
		return nil, err
	}
	// Mode 0600 from the start: nodectl runs as the agent's user or root.
	ln, err := unixsock.Listen(a.opts.Socket, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent: control socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, a.status()) })
	mux.HandleFunc("GET /v1/etcd/members", func(w http.ResponseWriter, r *http.Request) {
		ms, err := a.etcdMembers(r.Context())
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err)
			return
		}
		writeJSON(w, http.StatusOK, ms)
	})
	mux.HandleFunc("GET /v1/workers", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, a.workers()) })
	mux.HandleFunc("GET /v1/kv/stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, a.kvOwner.Stats()) })
	mux.HandleFunc("GET /v1/kv/ls", func(w http.ResponseWriter, r *http.Request) {
		ls := []controlapi.Slot{}
		for _, s := range a.kvOwner.List() {
			ls = append(ls, controlapi.Slot(s))
		}
		writeJSON(w, http.StatusOK, ls)
	})
	mux.HandleFunc("GET /v1/events", a.handleEvents)
	mux.HandleFunc("POST /v1/drain", a.handleDrain)
	mux.HandleFunc("POST /v1/undrain", func(w http.ResponseWriter, r *http.Request) {
		d, err := a.undrain()
		if err != nil {
			writeError(w, errorStatus(err), err)
			return
		}
		writeJSON(w, http.StatusOK, d)
	})
	mux.HandleFunc("POST /v1/instances/{id}/reset", func(w http.ResponseWriter, r *http.Request) {
		wk, err := a.resetInstance(r.PathValue("id"))
		if err != nil {
			writeError(w, errorStatus(err), err)
			return
		}
		writeJSON(w, http.StatusOK, wk)
	})
	mux.HandleFunc("GET /livez", a.handleLivez)
	mux.HandleFunc("GET /readyz", a.handleReadyz)
	// The debug pages: pprof profiles and traces, which name requests,
	// models and stacks, only where the agent's user alone connects.
	var traces http.Handler
	if a.tracing != nil {
		traces = a.tracing.Handler()
	}
	debugsock.Mount(mux, traces)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, &controlapi.Error{Code: controlapi.ErrNoSuchEndpoint.Code, Message: fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path)})
	})
	// Idle connections close after a while: a client that keeps them (one
	// per call) cannot grow the agent without bound.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}
	a.track(func() {
		<-ctx.Done()
		srv.Close()
	})
	a.track(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("control socket", "err", err)
		}
	})
	return srv, nil
}

// handleEvents writes the recent events as JSON lines; with ?follow=1 it
// keeps writing new ones until the client goes away.
func (a *Agent) handleEvents(w http.ResponseWriter, r *http.Request) {
	follow := r.URL.Query().Get("follow")
	if follow != "" && follow != "0" && follow != "1" && follow != "true" && follow != "false" {
		writeError(w, http.StatusBadRequest, &controlapi.Error{Code: controlapi.ErrBadRequest.Code, Message: "follow: want 0 or 1"})
		return
	}
	var ch chan controlapi.Event
	if follow == "1" || follow == "true" {
		var unsub func()
		ch, unsub = a.events.subscribe()
		defer unsub()
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, e := range a.events.snapshot() {
		enc.Encode(e)
	}
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	if ch == nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case e := <-ch:
			if enc.Encode(e) != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
		}
	}
}

// handleDrain starts a drain of the node (POST /v1/drain) and answers
// with its state at once; nodectl follows it through /v1/status. With
// no_wait the disruption budget is taken here, or the drain is refused.
func (a *Agent) handleDrain(w http.ResponseWriter, r *http.Request) {
	var req controlapi.DrainRequest
	if r.ContentLength != 0 {
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, &controlapi.Error{Code: controlapi.ErrBadRequest.Code, Message: "drain request: " + err.Error()})
			return
		}
	}
	deadline, hard, err := drainDeadlines(req, defaultDrainDeadline, defaultDrainHardDeadline)
	if err != nil {
		writeError(w, errorStatus(err), err)
		return
	}
	a.mu.Lock()
	busy := a.drain != nil && a.drain.Phase != controlapi.DrainUndraining
	a.mu.Unlock()
	held := false
	if req.NoWait && !busy {
		ans, err := a.takeBudget(r.Context(), triggerNodectl)
		if err != nil {
			writeError(w, errorStatus(err), err)
			return
		}
		if !ans.taken {
			err := &controlapi.Error{Code: controlapi.ErrBudgetTaken.Code, Message: fmt.Sprintf(
				"not draining node %s: the disruption budget is taken (%s); drain without --no-wait to wait for it", a.opts.NodeID, ans)}
			writeError(w, http.StatusConflict, err)
			return
		}
		held = true
	}
	d := a.startDrain(triggerNodectl, deadline, hard, held)
	a.mu.Lock()
	snap := d.Drain
	a.mu.Unlock()
	writeJSON(w, http.StatusAccepted, snap)
}

// The deadlines of a drain nodectl asks for without naming them.
const (
	defaultDrainDeadline     = 60 * time.Second
	defaultDrainHardDeadline = 90 * time.Second
)

// etcdMembers lists etcd's members, each asked for its status (a second
// at most, all at once): how `nodectl status` shows etcd's health.
func (a *Agent) etcdMembers(ctx context.Context) ([]controlapi.EtcdMember, error) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := a.etcd.MemberList(lctx)
	if err != nil {
		return nil, fmt.Errorf("etcd %v: member list: %w", a.opts.Etcd, err)
	}
	out := make([]controlapi.EtcdMember, len(list.Members))
	var wg sync.WaitGroup
	for i, m := range list.Members {
		out[i] = controlapi.EtcdMember{ID: fmt.Sprintf("%x", m.ID), Name: m.Name, ClientURLs: m.ClientURLs}
		if len(m.ClientURLs) == 0 {
			out[i].Error = "not started yet (added, no client URL)"
			continue
		}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			st, err := a.etcd.Status(sctx, m.ClientURLs[0])
			if err != nil {
				out[i].Error = err.Error()
				return
			}
			out[i].Healthy = st.Leader != 0 && len(st.Errors) == 0
			out[i].Leader = st.Leader == st.Header.MemberId
			out[i].DBSize, out[i].RaftIndex, out[i].Errors = st.DbSize, st.RaftIndex, st.Errors
			if st.Leader == 0 {
				out[i].Error = "knows no leader"
			}
		})
	}
	wg.Wait()
	return out, nil
}
