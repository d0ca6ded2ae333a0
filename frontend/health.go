package frontend

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// watchStale is how long the registry watch may go without an answer
// from etcd (events, or the probe every probeEvery) before the frontend
// stops calling itself ready.
const watchStale = 5 * time.Second

// watchHealth is what the frontend knows of its registry watch.
type watchHealth struct {
	mu sync.Mutex
	// synced is set by a full read of the registry, and cleared when the
	// watch that followed it breaks.
	synced bool
	// last is when etcd last answered (a read, events, a probe).
	last time.Time
}

func (h *watchHealth) heard(now time.Time, synced bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = now
	h.synced = h.synced || synced
}

func (h *watchHealth) broken() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.synced = false
}

// problem is why the watch is not healthy at now ("" when it is).
func (h *watchHealth) problem(now time.Time) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.synced:
		return "registry watch: not synced with etcd"
	case now.Sub(h.last) > watchStale:
		return fmt.Sprintf("registry watch: no answer from etcd for %v", now.Sub(h.last).Round(100*time.Millisecond))
	}
	return ""
}

// heard records an answer of etcd on the watch.
func (s *Server) heard() { s.health.heard(time.Now(), false) }

// handleHealth answers GET /healthz: the process serves.
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
}

// handleReady answers GET /readyz: 200 while the registry watch is
// healthy and at least one instance is routable, 503 with the reason
// otherwise.
func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	why := s.health.problem(now)
	n := s.router.Routable(now)
	if why == "" && n == 0 {
		why = "no routable instance"
	}
	if why != "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": why, "routable_instances": n})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true, "routable_instances": n})
}
