package frontend

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// startFailover readies what lets any frontend resume any stream: the
// cluster's resume key ring (unless a static secret was configured), the
// advertised URL, request records and the watch of their owners. rev is
// a revision the watches start after.
func (s *Server) startFailover(ctx context.Context, addr net.Addr, rev int64) error {
	if s.opts.AdvertiseURL == "" {
		scheme := "http"
		if s.opts.TLS {
			scheme = "https"
		}
		s.opts.AdvertiseURL = scheme + "://" + addr.String()
	}
	if !s.keys.static {
		deadline := time.Now().Add(30 * time.Second)
		for {
			gctx, cancel := context.WithTimeout(ctx, syncTimeout)
			r, err := s.loadKeyRing(gctx)
			cancel()
			if err == nil {
				s.goes.Go(func() { s.watchKeyRing(ctx, r) })
				break
			}
			if !time.Now().Before(deadline) {
				return fmt.Errorf("frontend: %w", err)
			}
			if err := sleep(ctx, syncRetry); err != nil {
				return err
			}
		}
	}
	if s.opts.NoFailoverRecords {
		return nil
	}
	budget := s.opts.RecordBytesMax
	if budget <= 0 {
		budget = DefaultRecordBytesMax
	}
	s.recs = &records{goes: &s.goes, etcd: s.etcd, window: s.resumeWindow(), m: s.metrics, log: s.log, owner: s.opts.ID, url: s.opts.AdvertiseURL,
		budget: newRecordBudget(budget, s.resumeWindow()), queue: newAdmitQueue()}
	for range admitWriters {
		s.goes.Go(func() { s.recs.queue.write(ctx, s.etcd) })
	}
	// The first records' lease, granted before serving: the first
	// admission after a start would otherwise wait for a grant and a put
	// (two raft writes) within recordTimeout, and under load run without
	// a record, not resumable elsewhere. A failure here costs nothing:
	// the admission grants one itself.
	s.recs.warm(ctx)
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifeline_frontend_request_record_bytes_live",
		Help: "Bytes of request records this frontend wrote that may still be live in etcd (bounded by --record-bytes-max)."},
		func() float64 { return float64(s.recs.budget.live(time.Now())) }))
	s.recs.lost = func(id string) {
		rctx, cancel := context.WithTimeout(ctx, takeoverTimeout)
		defer cancel()
		if rec, _, err := s.recs.read(rctx, id); err == nil {
			s.checkRecord(rec)
		}
	}
	s.goes.Go(func() { s.watchRequests(ctx, rev) })
	// Before serving: what this id owned in a former life is not this
	// life's (orphans.go).
	s.adoptOrphans(ctx, func(owner string) bool { return owner == s.opts.ID })
	s.goes.Go(func() { s.watchOrphans(ctx, rev) })
	return nil
}
