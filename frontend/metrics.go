package frontend

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

type metrics struct {
	reg             *prometheus.Registry
	migrations      *prometheus.CounterVec // result: attempt, success, failure
	migrationFail   *prometheus.CounterVec // by error type
	migrationTime   prometheus.Histogram
	replayedPrefill prometheus.Counter
	duplicates      prometheus.Counter
	gaps            prometheus.Counter
	staleEpoch      prometheus.Counter
	resumes         *prometheus.CounterVec
	shed            *prometheus.CounterVec
	notReadyRouted  prometheus.Counter
	notReadyAvoided prometheus.Counter
	drainMigrations prometheus.Counter
	pd              *prometheus.CounterVec // P/D hand-offs by path
	staleTransfers  prometheus.Counter
	prefillFailures prometheus.Counter
	transferBytes   prometheus.Counter
	cacheRoutes     *prometheus.CounterVec
	capacityWaits   *prometheus.CounterVec // served, timed_out
	// Failover: takeovers by result, resumes answered from a record by
	// result, request records owned and running, record writes by kind,
	// records given up (etcd slow or down).
	takeovers          *prometheus.CounterVec
	takeoverStarts     *prometheus.CounterVec
	detachedOnStop     prometheus.Counter
	crossResumes       *prometheus.CounterVec
	recordsOutstanding prometheus.Gauge
	recordWrites       *prometheus.CounterVec
	recordsSkipped     prometheus.Counter
	recordBytes        prometheus.Counter
	zeroRTTResumes     prometheus.Counter
	tooEarly           prometheus.Counter
	// Limits: requests refused before they ran, connections refused at
	// the cap.
	refused      *prometheus.CounterVec
	connsRefused prometheus.Counter
	// Streams: tokens committed to the logs, clients whose connection
	// was closed for not reading (slowClientTimeout).
	tokens      prometheus.Counter
	slowClients prometheus.Counter
	// frameBatches counts hand-offs of worker frames to run loops.
	frameBatches prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	// The frontend process itself: Go runtime (goroutines, heap, GC) and
	// process (CPU, memory, descriptors) series. go_gc_heap_live_bytes is
	// the heap the last collection found live: what the frontend holds,
	// without the garbage allocated since or the allocator's partly used
	// spans that go_memstats_heap_inuse_bytes counts (which swing by a
	// megabyte with the traffic at the moment of the scrape).
	m.reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.migrations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_migrations_total", Help: "Migrations by result."}, []string{"result"})
	m.migrationFail = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_migration_failures_total", Help: "Requests that could not be migrated, by error type."}, []string{"reason"})
	m.migrationTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lifeline_frontend_migration_seconds", Help: "From a worker failure to the next committed token.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)})
	m.replayedPrefill = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_replayed_prefill_tokens_total", Help: "Output tokens re-prefilled by migrations."})
	m.duplicates = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_duplicate_frames_total", Help: "Repeated frames suppressed."})
	m.gaps = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_sequence_gaps_total", Help: "Frames that skipped a sequence number (must stay 0 in delivery: they migrate)."})
	m.staleEpoch = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_stale_epoch_frames_total", Help: "Frames of an older request epoch dropped."})
	m.resumes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_resumes_total", Help: "Resume attempts by result."}, []string{"result"})
	m.shed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_requests_shed_total", Help: "Requests refused, by reason."}, []string{"reason"})
	m.notReadyRouted = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_routed_to_not_ready_total",
		Help: "Requests sent to an instance whose newest registration this frontend had seen as not ready or draining (must stay 0: a dispatch checks the view last and routes such a request elsewhere, counted in lifeline_frontend_not_ready_rerouted_total)."})
	m.notReadyAvoided = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_not_ready_rerouted_total",
		Help: "Requests routed to an instance that became not ready or draining before the send, and routed elsewhere instead."})
	m.drainMigrations = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_drain_migrations_total",
		Help: "Migrations caused by a draining worker (a DRAINING error: the drain's deadline ended the stream, or a worker refused a new request)."})
	m.pd = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_pd_handoffs_total",
		Help: "Prefill-to-decode hand-offs by path: same_node (read in place), transfer (pulled), transfer_failed (decode recomputed), no_prefill (decode prefilled by itself)."}, []string{"path"})
	m.staleTransfers = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_stale_transfer_completions_total", Help: "KV transfer completions of a binding that was no longer current, dropped."})
	m.prefillFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_prefill_failures_total", Help: "Prefill instances that failed a request before handing off."})
	m.transferBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_kv_transfer_bytes_total", Help: "KV payload bytes pulled between nodes for P/D hand-offs."})
	m.cacheRoutes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_cache_aware_routes_total",
		Help: "Routing decisions: hit (the chosen node holds a prefix of the request), miss (fresh summaries, no prefix), load_only (no usable summary or identity)."}, []string{"result"})
	m.capacityWaits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_capacity_waits_total",
		Help: "Requests that found no routable instance of their model and waited for one: served (one registered in time), timed_out (no_capacity)."}, []string{"result"})
	m.failoverMetrics()
	m.zeroRTTResumes = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_zero_rtt_resumes_total",
		Help: "Resume reads served from HTTP/3 0-RTT early data (before the handshake completed, or as the first request of a connection whose early data was accepted)."})
	m.tooEarly = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_too_early_total",
		Help: "Requests other than idempotent reads that arrived as 0-RTT early data, refused with 425 Too Early (replay-safe: they reached no handler)."})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_requests_refused_total",
		Help: "Requests refused before they ran, by code: request_too_large (413), request_timeout (408: a body slower than the body timeout), context_length_exceeded (a prompt that cannot fit its model's context)."}, []string{"code"})
	m.connsRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_connections_refused_total",
		Help: "TCP connections refused at the connection cap (cleartext: a 503 with Retry-After; TLS: closed)."})
	m.reg.MustRegister(m.refused, m.connsRefused)
	m.tokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_tokens_total", Help: "Tokens committed to the requests' logs (relayed to their clients)."})
	m.slowClients = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_slow_clients_closed_total",
		Help: "Streams whose client read nothing for the write timeout: the connection was closed (a resumable stream is resumed by Last-Event-ID)."})
	m.frameBatches = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_frame_batches_total",
		Help: "Hand-offs of worker frames to their requests' run loops, each every frame already received: tokens_total ÷ this is the frames per hand-off (1 while the relay keeps up with its workers, more when it falls behind)."})
	m.reg.MustRegister(m.tokens, m.slowClients, m.frameBatches)
	m.reg.MustRegister(m.capacityWaits, m.notReadyAvoided, m.drainMigrations, m.zeroRTTResumes, m.tooEarly)
	m.reg.MustRegister(m.pd, m.staleTransfers, m.prefillFailures, m.transferBytes, m.cacheRoutes)
	m.reg.MustRegister(m.migrations, m.migrationFail, m.migrationTime, m.replayedPrefill, m.duplicates, m.gaps, m.staleEpoch, m.resumes, m.shed, m.notReadyRouted)
	return m
}

// gaugeConns exports the number of open worker connections.
func (m *metrics) gaugeConns(open func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifeline_frontend_worker_connections",
		Help: "Open connections to workers (one per endpoint in use; a retired generation's closes with its last stream)."},
		func() float64 { return float64(open()) }))
}

// gaugeOpen exports the number of open client connections (TCP).
func (m *metrics) gaugeOpen(open func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifeline_frontend_client_connections",
		Help: "Open client TCP connections of the API listener (at most the connection cap)."},
		func() float64 { return float64(open()) }))
}

// settle adds a finished request's counters.
func (m *metrics) settle(r *reqfsm.Request) {
	m.duplicates.Add(float64(r.DuplicateFrames))
	m.gaps.Add(float64(r.Gaps))
	m.staleEpoch.Add(float64(r.StaleEpochFrames))
	m.staleTransfers.Add(float64(r.StaleTransfers))
	if r.Err != nil {
		switch r.Err.Type {
		case openai.ErrMigrationExhausted, openai.ErrDeadlineExceeded, openai.ErrNoCapacity:
			if r.Migrations > 0 {
				m.migrationFail.WithLabelValues(string(r.Err.Type)).Inc()
			}
		}
		if r.Err.Type == openai.ErrNoCapacity {
			m.capacityWaits.WithLabelValues("timed_out").Inc()
		}
		if r.Migrations == 0 && (r.Err.Type == openai.ErrNoCapacity || r.Err.Type == openai.ErrOverloaded) {
			m.shed.WithLabelValues(string(r.Err.Type)).Inc()
		}
	}
}

// failoverMetrics registers the request records' and takeovers' metrics.
func (m *metrics) failoverMetrics() {
	m.takeovers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_takeovers_total",
		Help: "Resumes of a stream this frontend held no log of, by result: ok (taken over, driven here), lost (another frontend won), unavailable (etcd did not answer), not_found (no record), done_replay (a finished stream replayed)."}, []string{"result"})
	m.crossResumes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_cross_resumes_total",
		Help: "Resumes answered from a request record, by result: taken_over, replayed, conflict (409), unavailable (503), not_found, bad_record."}, []string{"result"})
	m.recordsOutstanding = prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifeline_frontend_request_records_outstanding",
		Help: "Running requests whose record this frontend owns."})
	m.recordWrites = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_request_record_writes_total",
		Help: "Request record writes to etcd by kind: admit, complete, refresh, takeover."}, []string{"kind"})
	m.recordsSkipped = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_request_records_skipped_total",
		Help: "Streamed requests served without a record: etcd did not store it within a second."})
	m.takeoverStarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_frontend_takeover_starts_total",
		Help: "How requests taken over started here: attached (to the sequence still running, or just finished, on its worker) or regenerated (no worker held it)."}, []string{"how"})
	m.detachedOnStop = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_streams_detached_total",
		Help: "Worker streams handed over (detached, not cancelled) because this frontend stopped: their workers keep generating for a takeover."})
	m.recordBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_frontend_request_record_bytes_total",
		Help: "Bytes of request records written to etcd (admissions, rewrites)."})
	m.reg.MustRegister(m.takeovers, m.crossResumes, m.recordsOutstanding, m.recordWrites, m.recordsSkipped, m.takeoverStarts, m.detachedOnStop, m.recordBytes)
}
