package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lifeline-llm/lifeline/decode/wire"
)

type metrics struct {
	reg         *prometheus.Registry
	detection   *prometheus.HistogramVec
	exits       *prometheus.CounterVec
	restarts    *prometheus.CounterVec
	canary      *prometheus.CounterVec
	leaseLost   prometheus.Counter
	reregisters prometheus.Counter
	orphans     prometheus.Counter
	slots       *prometheus.GaugeVec
	staleGen    prometheus.Counter
	// etcdWriteErrors counts failed etcd writes by operation (register,
	// deregister, announce_failure).
	etcdWriteErrors *prometheus.CounterVec
	// Drains: how many by trigger, how long, requests in flight at their
	// start and end, requests routed here after not-ready, and requests
	// the deadline ended.
	drains                   *prometheus.CounterVec
	drainDuration            prometheus.Histogram
	drainActive              *prometheus.GaugeVec
	drainRoutedAfterNotReady prometheus.Counter
	drainForced              prometheus.Counter
	// drainOutcomes counts requests in flight by what a drain did with
	// them: finished_in_place, moved_early, ended_at_deadline.
	drainOutcomes *prometheus.CounterVec
	// Detachable requests per instance, as its worker last reported them
	// (the canary loop's health look): frames generated while detached
	// and frames dropped from full logs (both cumulative since the
	// worker started), requests running detached now, accepted Attaches.
	workerFramesBuffered, workerFramesDropped, workerDetached, workerAttaches *prometheus.GaugeVec
	// Tensor-parallel groups: groups ended after a rank's death, how long
	// from the abort until every rank was gone, and from the death until
	// the group was ready again (group.go).
	groupAborts           prometheus.Counter
	groupEnd, groupReboot prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.detection = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "lifeline_agent_failure_detection_seconds", Help: "From a worker's death (kernel time for eBPF) to the agent acting on it.",
		Buckets: prometheus.ExponentialBuckets(20e-6, 2, 16)}, []string{"detector"})
	m.exits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_agent_worker_exits_total", Help: "Worker exits by reason."}, []string{"reason"})
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_agent_restarts_total", Help: "Worker restarts."}, []string{"instance_id"})
	m.canary = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_agent_canary_total", Help: "Canary results."}, []string{"result"})
	m.leaseLost = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_agent_lease_expiries_total", Help: "Times the agent could not prove its etcd lease."})
	m.reregisters = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_agent_reregistrations_total", Help: "Re-registrations after a lost lease."})
	m.orphans = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_agent_orphan_blocks_reclaimed_total", Help: "KV blocks of dead writers reclaimed."})
	m.slots = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lifeline_agent_arena_slots", Help: "Arena slots by state."}, []string{"state"})
	m.staleGen = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_agent_stale_generation_rejects_total", Help: "Frames from an older generation than expected, dropped."})
	m.etcdWriteErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_agent_etcd_write_errors_total",
		Help: "etcd writes that failed, by operation (register, deregister, announce_failure)."}, []string{"op"})
	for _, op := range []string{opRegister, opDeregister, opAnnounceFailure} {
		m.etcdWriteErrors.WithLabelValues(op) // every operation is exported, at zero
	}
	// The agent process itself: Go runtime (goroutines, heap, GC) and
	// process (CPU, memory, descriptors) series.
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(m.detection, m.exits, m.restarts, m.canary, m.leaseLost, m.reregisters, m.orphans, m.slots, m.staleGen, m.etcdWriteErrors)
	m.registerDrain()
	m.registerWorker()
	m.groupAborts = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_agent_group_aborts_total",
		Help: "Tensor-parallel groups aborted and ended because one of their ranks died (or the group stopped)."})
	m.groupEnd = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lifeline_agent_group_abort_seconds",
		Help: "From a group's abort to every one of its ranks gone.", Buckets: prometheus.ExponentialBuckets(1e-4, 2, 16)})
	m.groupReboot = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lifeline_agent_group_restart_seconds",
		Help: "From a rank's death to its group ready again at a new generation.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 12)})
	m.reg.MustRegister(m.groupAborts, m.groupEnd, m.groupReboot)
	return m
}

func (m *metrics) registerWorker() {
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"instance_id"})
	}
	m.workerFramesBuffered = gauge("lifeline_agent_worker_frames_buffered",
		"Frames a worker generated for detachable requests while no stream was attached, since it started.")
	m.workerFramesDropped = gauge("lifeline_agent_worker_frames_dropped",
		"Frames a worker dropped from full detachable-request logs, since it started.")
	m.workerDetached = gauge("lifeline_agent_worker_detached_requests", "Detachable requests a worker runs with no stream attached.")
	m.workerAttaches = gauge("lifeline_agent_worker_attaches", "Attach operations a worker accepted, since it started.")
	m.reg.MustRegister(m.workerFramesBuffered, m.workerFramesDropped, m.workerDetached, m.workerAttaches)
}

// workerHealth exports what a worker's health reply says of its
// detachable requests.
func (m *metrics) workerHealth(instanceID string, h *wire.HealthReply) {
	m.workerFramesBuffered.WithLabelValues(instanceID).Set(float64(h.FramesBuffered))
	m.workerFramesDropped.WithLabelValues(instanceID).Set(float64(h.FramesDropped))
	m.workerDetached.WithLabelValues(instanceID).Set(float64(h.Detached))
	m.workerAttaches.WithLabelValues(instanceID).Set(float64(h.Attaches))
}

func (m *metrics) registerDrain() {
	m.drains = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_agent_drains_total", Help: "Drains begun, by trigger (nodectl, SIGTERM)."}, []string{"trigger"})
	m.drainDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lifeline_agent_drain_duration_seconds",
		Help: "From a drain's first step (budget taken) to its workers stopped.", Buckets: prometheus.ExponentialBuckets(0.25, 2, 10)})
	m.drainActive = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lifeline_agent_drain_active_requests",
		Help: "Requests in flight at the last drain's start (not ready) and end (workers stopping)."}, []string{"at"})
	m.drainRoutedAfterNotReady = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_agent_drain_routed_after_not_ready_total",
		Help: "Requests a draining node's workers started after its registrations were marked draining."})
	m.drainForced = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_agent_drain_requests_forced_total",
		Help: "Requests a drain ended by its deadline with a retryable draining error (moved early or ended at the deadline)."})
	m.drainOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_agent_drain_requests_total",
		Help: "Requests in flight during a drain, by outcome (finished_in_place, moved_early, ended_at_deadline)."}, []string{"outcome"})
	for _, o := range []string{outcomeFinishedInPlace, outcomeMovedEarly, outcomeEndedAtDeadline} {
		m.drainOutcomes.WithLabelValues(o)
	}
	m.reg.MustRegister(m.drains, m.drainDuration, m.drainActive, m.drainRoutedAfterNotReady, m.drainForced, m.drainOutcomes)
}

// serveMetrics serves /metrics, /livez and /readyz until ctx is done.
func (a *Agent) serveMetrics(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.opts.Metrics)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	// The debug pages (pprof, traces) are on the control socket alone:
	// every local user reaches this port.
	mux.HandleFunc("/livez", a.handleLivez)
	mux.HandleFunc("/readyz", a.handleReadyz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}
	a.track(func() {
		<-ctx.Done()
		srv.Close()
	})
	a.track(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server", "err", err)
		}
	})
	return nil
}
