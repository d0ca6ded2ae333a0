package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// Every streamed request has a record at schema.RequestsPrefix+id: its
// body as admitted and its owner, written at admission and once more when
// it ends (with its output), so that any frontend can take over a running
// request or replay a finished one. Records live under a few shared
// leases: a new one every window/4 with a TTL of window+window/4, so a
// record written under the current lease lives at least the resume
// window. A running record is re-put before it has less than 3/4 of the
// window left (long requests only). The data plane does not wait on etcd:
// an admission write that takes longer than recordTimeout is given up
// and the request served without a record.

// maxRecordBytes bounds a record, below etcd's default request limit
// (1.5 MiB) with room for the transaction around it. Admission records
// are bounded tighter before the request runs (maxAdmissionRecordBytes,
// recordbudget.go), so one over this is not expected (it would not be
// written, counted as skipped); a done record's output drops its logprobs to fit
// (LogprobsOmitted: a replay has none), and an output that does not fit
// even so is left out, the record ending with openai.ErrOutputNotKept. The
// summary (End, with the tool calls' ids) is always kept.
const maxRecordBytes = 1 << 20

// recordTimeout bounds the admission write; tokens wait for it.
const recordTimeout = time.Second

// leaseWarmTimeout bounds the grant of the records' first lease at start.
const leaseWarmTimeout = 5 * time.Second

// takeoverTimeout bounds each etcd call of a takeover.
const takeoverTimeout = 2 * time.Second

var errNoRecord = errors.New("frontend: no request record")

// records writes and reads request records.
type records struct {
	goes   *owned // the server's
	etcd   *clientv3.Client
	window time.Duration
	m      *metrics
	log    *slog.Logger
	// owner and url name this frontend in the records it owns.
	owner, url string
	// lost is told of a record whose compare-and-swap failed: another
	// frontend may own it now (the ownership watch says so too, unless
	// it is cut off).
	lost func(id string)

	mu        sync.Mutex
	lease     clientv3.LeaseID
	granted   time.Time
	leaseUses int // writes under lease
	// outage is set while admission writes fail: logged once per outage.
	outage atomic.Bool
	// budget bounds the record bytes this frontend may have live in etcd
	// (recordbudget.go).
	budget *recordBudget
	// queue groups admission writes into transactions (nil: each alone).
	queue *admitQueue
}

// recordState is a stream's record as its owner last wrote it.
type recordState struct {
	// stored is closed once the admission write ended (stored or given
	// up): no token goes to a client before.
	stored chan struct{}
	// wmu serializes this record's compare-and-swaps (a refresh and the
	// completion), each on the revision the one before wrote.
	wmu    sync.Mutex
	mu     sync.Mutex
	rec    schema.RequestRecord
	rev    int64 // the record's ModRevision; 0: no record
	expiry time.Time
	busy   bool // a refresh is under way
	// counted: the record is in the outstanding gauge.
	counted bool
	// movedTo is the owner URL of the frontend that took the request over.
	movedTo string
	// completed is closed once the request's end is written to its
	// record, or given up (completion).
	completed     chan struct{}
	completedOnce sync.Once
}

// completion is closed once complete has written the request's end to
// its record (or given up): a response's end reaches its client after
// that, so that any frontend it asks next finds it done.
func (rs *recordState) completion() chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.completed == nil {
		rs.completed = make(chan struct{})
	}
	return rs.completed
}

func (rs *recordState) term() uint64 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.rec.Term
}

// recordsPerLease bounds the record writes under one lease. etcd checks,
// for a put with a lease by a user that is not root, that the user may
// write every key the lease holds: a put's cost grows with its lease's
// keys. A lease per window/4 alone held every record admitted in it
// (15,000 at 1,000 requests/s with the one-minute window), and etcd's
// apply loop spent its time in those checks: admission writes missed
// recordTimeout and most requests ran without a record. A new lease
// every recordsPerLease writes costs a grant per that many.
const recordsPerLease = 64

// warm grants the lease the first records are written under, before
// any is (bounded by leaseWarmTimeout; a failure leaves it to them). It
// does nothing once a lease was granted.
func (rc *records) warm(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, leaseWarmTimeout)
	defer cancel()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.lease == 0 {
		rc.grantLocked(ctx, 0) // granted, not yet written under
	}
}

// leaseFor is the shared lease for a record written now, and when it
// expires.
func (rc *records) leaseFor(ctx context.Context) (clientv3.LeaseID, time.Time, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.lease != 0 && time.Since(rc.granted) < rc.window/4 && rc.leaseUses < recordsPerLease {
		rc.leaseUses++
		return rc.lease, rc.granted.Add(rc.leaseTTL()), nil
	}
	return rc.grantLocked(ctx, 1)
}

// leaseTTL is a records lease's time to live: a record written under it
// up to window/4 after the grant still lives its whole window.
func (rc *records) leaseTTL() time.Duration { return rc.window + rc.window/4 }

// grantLocked grants a new records lease, written under uses times so
// far, and returns it with its expiry; rc.mu is held.
func (rc *records) grantLocked(ctx context.Context, uses int) (clientv3.LeaseID, time.Time, error) {
	ttl := rc.leaseTTL()
	now := time.Now()
	g, err := rc.etcd.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return 0, time.Time{}, err
	}
	rc.lease, rc.granted, rc.leaseUses = g.ID, now, uses
	return g.ID, now.Add(ttl), nil
}

// newRecord is the admission record of a request.
func (rc *records) newRecord(st *stream, deadline, now time.Time) schema.RequestRecord {
	body, _ := json.Marshal(st.body)
	rec := schema.RequestRecord{ID: st.id, Body: body, Chat: st.chat, Resumable: st.resumable, AdmittedUnixNano: now.UnixNano(),
		ResumeExpiryUnixNano: now.Add(rc.window).UnixNano(), Owner: rc.owner, OwnerURL: rc.url, Term: 1}
	if !deadline.IsZero() {
		rec.DeadlineUnixNano = deadline.UnixNano()
	}
	return rec
}

// admit writes st's admission record, bounded by recordTimeout, and
// opens the stream's gate either way.
func (rc *records) admit(ctx context.Context, st *stream, rec schema.RequestRecord) {
	rs := st.rec
	defer close(rs.stored)
	b, _ := json.Marshal(rec)
	if len(b) > maxRecordBytes {
		rc.m.recordsSkipped.Inc()
		rc.log.Warn("frontend: serving without a request record: its body is too large for one (another frontend cannot resume this stream)",
			"request_id", st.id, "bytes", len(b), "max", maxRecordBytes)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	lease, expiry, err := rc.leaseFor(ctx)
	var rev int64
	if err == nil {
		rev, err = rc.put(ctx, schema.RequestsPrefix+st.id, string(b), lease)
	}
	if err != nil {
		rc.m.recordsSkipped.Inc()
		if !rc.outage.Swap(true) {
			rc.log.Warn("frontend: serving without request records: etcd does not answer in time (another frontend cannot resume these streams)",
				"request_id", st.id, "err", err)
		}
		return
	}
	rc.outage.Store(false)
	rc.m.recordWrites.WithLabelValues("admit").Inc()
	rs.mu.Lock()
	rs.rec, rs.rev, rs.expiry = rec, rev, expiry
	rs.mu.Unlock()
	rc.count(rs)
}

// put writes an admission record: through the admission queue
// (recordbatch.go) when its writers run, else alone.
func (rc *records) put(ctx context.Context, key, val string, lease clientv3.LeaseID) (int64, error) {
	if rc.queue != nil {
		return rc.queue.put(ctx, key, val, lease)
	}
	resp, err := rc.etcd.Put(ctx, key, val, clientv3.WithLease(lease))
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// count puts a record this frontend owns in the outstanding gauge;
// release takes it out (once).
func (rc *records) count(rs *recordState) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rs.counted {
		rs.counted = true
		rc.m.recordsOutstanding.Inc()
	}
}

func (rc *records) release(rs *recordState) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.counted {
		rs.counted = false
		rc.m.recordsOutstanding.Dec()
	}
}

// cas rewrites st's record as rec if it is still the one this frontend
// wrote last; false when another frontend took it over (or it is gone).
func (rc *records) cas(ctx context.Context, rs *recordState, rec schema.RequestRecord, kind string) (bool, error) {
	rs.wmu.Lock()
	defer rs.wmu.Unlock()
	return rc.casLocked(ctx, rs, rec, kind)
}

// casLocked is cas with rs.wmu held.
func (rc *records) casLocked(ctx context.Context, rs *recordState, rec schema.RequestRecord, kind string) (bool, error) {
	rs.mu.Lock()
	rev := rs.rev
	rs.mu.Unlock()
	if rev == 0 {
		return false, nil
	}
	lease, expiry, err := rc.leaseFor(ctx)
	if err != nil {
		return false, err
	}
	b, _ := json.Marshal(rec)
	rc.budget.charge(int64(len(b)), time.Now())
	rc.m.recordBytes.Add(float64(len(b)))
	key := schema.RequestsPrefix + rec.ID
	resp, err := rc.etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, string(b), clientv3.WithLease(lease))).Commit()
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		if rc.lost != nil {
			rc.goes.Go(func() { rc.lost(rec.ID) })
		}
		return false, nil
	}
	rc.m.recordWrites.WithLabelValues(kind).Inc()
	rs.mu.Lock()
	rs.rec, rs.rev, rs.expiry = rec, resp.Header.Revision, expiry
	rs.mu.Unlock()
	return true, nil
}

// recordTokens is the first n tokens of l as a record keeps them.
func recordTokens(l *reqfsm.TokenLog, n int) []schema.RecordToken {
	out := make([]schema.RecordToken, 0, n)
	for t := range l.From(0) {
		if len(out) == n {
			break
		}
		out = append(out, schema.RecordToken{ID: t.ID, Text: t.Text, Logprobs: logprobsRecord(t.Logprobs)})
	}
	return out
}

// addRecordTokens appends a record's tokens to l, from sequence 1.
func addRecordTokens(l *reqfsm.TokenLog, toks []schema.RecordToken) {
	for i, t := range toks {
		l.Add(reqfsm.Token{SequenceNo: i + 1, ID: t.ID, Text: t.Text, Logprobs: recordLogprobs(t.Logprobs)})
	}
}

// migrated writes the output delivered before a migration (prefix, the
// continuation's first sequence minus one) into st's running record, so
// that a frontend taking the request over attaches to the continuation
// instead of regenerating it. A done record, one with as long a prefix,
// or one that would grow past maxRecordBytes is left as it is (a
// takeover then regenerates, bit-identically, as before).
func (rc *records) migrated(ctx context.Context, st *stream, prefix []schema.RecordToken) {
	rs := st.rec
	defer rs.completedOnce.Do(func() { close(rs.completion()) })
	<-rs.stored
	rs.wmu.Lock()
	defer rs.wmu.Unlock()
	rs.mu.Lock()
	rec, rev := rs.rec, rs.rev
	rs.mu.Unlock()
	if rev == 0 || rec.Done || len(prefix) <= len(rec.Prefix) {
		return
	}
	rec.Prefix = prefix
	if b, _ := json.Marshal(rec); len(b) > maxRecordBytes {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := rc.casLocked(cctx, rs, rec, "migrate"); err != nil {
		rc.log.Warn("frontend: request record's prefix not written (a takeover would regenerate)", "request_id", st.id, "err", err)
	}
}

// refresh re-puts a running record that has less than 3/4 of the resume
// window left, in the background.
func (rc *records) refresh(ctx context.Context, rs *recordState) {
	rs.mu.Lock()
	due := rs.rev != 0 && !rs.busy && time.Until(rs.expiry) < rc.window*3/4
	rs.busy = rs.busy || due
	rec := rs.rec
	rs.mu.Unlock()
	if !due {
		return
	}
	rc.goes.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, takeoverTimeout)
		defer cancel()
		rc.cas(cctx, rs, rec, "refresh")
		rs.mu.Lock()
		rs.busy = false
		rs.mu.Unlock()
	})
}

// complete writes a finished request's record: done, its end and output.
// A request that ended because this frontend stops or lost it stays as it
// is: another frontend takes it over.
func (rc *records) complete(ctx context.Context, st *stream, r *reqfsm.Request, end sse.Lifeline) {
	rs := st.rec
	<-rs.stored
	rs.mu.Lock()
	owned, rec := rs.rev != 0, rs.rec
	rs.mu.Unlock()
	if !owned {
		return
	}
	defer rc.release(rs)
	if r.Err != nil && (r.Err.Type == openai.ErrFrontendStopping || r.Err.Type == openai.ErrTakenOver) {
		return
	}
	rec.Done, rec.FinishReason = true, r.FinishReason
	if r.Err != nil {
		rec.ErrorType, rec.ErrorMessage = string(r.Err.Type), r.Err.Message
	}
	rec.Output = recordTokens(&r.Output, r.Output.Len())
	rec.PromptTokens = st.usage(0).PromptTokens
	if b, err := json.Marshal(end); err == nil {
		raw := json.RawMessage(b)
		rec.End = &raw
	}
	rec = fitOutput(rec)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := rc.cas(cctx, rs, rec, "complete"); err != nil {
		rc.log.Warn("frontend: request record not completed", "request_id", st.id, "err", err)
	}
	// A done record is written no more, and its output is the stream's
	// log: not held twice while the stream's readers finish.
	rs.mu.Lock()
	rs.rec.Output, rs.rec.End = nil, nil
	rs.mu.Unlock()
}

// fitOutput is a done record within maxRecordBytes: without the output's
// logprobs, else without its output (see maxRecordBytes).
func fitOutput(rec schema.RequestRecord) schema.RequestRecord {
	fits := func() bool {
		b, _ := json.Marshal(rec)
		return len(b) <= maxRecordBytes
	}
	if fits() {
		return rec
	}
	out := make([]schema.RecordToken, len(rec.Output))
	for i, t := range rec.Output {
		out[i] = schema.RecordToken{ID: t.ID, Text: t.Text}
		rec.LogprobsOmitted = rec.LogprobsOmitted || len(t.Logprobs) > 0
	}
	rec.Output = out
	if fits() {
		return rec
	}
	rec.Output, rec.LogprobsOmitted = nil, false
	rec.ErrorType = string(openai.ErrOutputNotKept)
	rec.ErrorMessage = "the output is too large to keep for a replay"
	return rec
}

// read returns the record of request id and its ModRevision.
func (rc *records) read(ctx context.Context, id string) (schema.RequestRecord, int64, error) {
	resp, err := rc.etcd.Get(ctx, schema.RequestsPrefix+id)
	if err != nil {
		return schema.RequestRecord{}, 0, err
	}
	if len(resp.Kvs) == 0 {
		return schema.RequestRecord{}, 0, errNoRecord
	}
	rec, err := schema.DecodeRequestRecord(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
	return rec, resp.Kvs[0].ModRevision, err
}

// takeover makes this frontend the owner of rec, read at rev, at the next
// term: one transaction on the ModRevision, so that of racing frontends
// exactly one wins. It returns the new state, or ok false if another
// frontend changed the record first.
func (rc *records) takeover(ctx context.Context, rec schema.RequestRecord, rev int64) (*recordState, bool, error) {
	if rec.Term >= schema.MaxRecordTerm {
		return nil, false, fmt.Errorf("%w: %s: term %d exhausted", schema.ErrBadRecord, rec.ID, rec.Term)
	}
	rec.Owner, rec.OwnerURL, rec.Term = rc.owner, rc.url, rec.Term+1
	rs := &recordState{stored: make(chan struct{}), rev: rev}
	close(rs.stored)
	ok, err := rc.cas(ctx, rs, rec, "takeover")
	if !ok || err != nil {
		return nil, false, err
	}
	rc.count(rs)
	return rs, true, nil
}
