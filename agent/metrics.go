package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	m.reg.MustRegister(m.detection, m.exits, m.restarts, m.canary, m.leaseLost, m.reregisters, m.orphans, m.slots, m.staleGen)
	return m
}

func (a *Agent) serveMetrics(ctx context.Context, wg *sync.WaitGroup) error {
	ln, err := net.Listen("tcp", a.opts.Metrics)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/livez", a.handleLivez)
	mux.HandleFunc("/readyz", a.handleReadyz)
	srv := &http.Server{Handler: mux}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server", "err", err)
		}
	}()
	return nil
}
