package frontend

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// Request records are bounded twice, so that no client can fill etcd
// (its no-space alarm stops every write of the cluster: leases, fencing,
// registrations):
//
//   - one record's bytes: a streamed request whose admission record would
//     be over maxAdmissionRecordBytes is refused with a 400 naming the
//     parameter that weighs most (stop strings, tools, a schema, the
//     prompt), before anything is run: never served without a record;
//   - the bytes of the records a frontend has written that may still be
//     live in etcd (written within the records' lease TTL and rotation):
//     at most Options.RecordBytesMax. A streamed request that would go
//     over it is refused with a retryable 503 records_full. Records'
//     rewrites (output, refreshes) count too, but are never refused.
//
// With etcd's history compacted (lifeline etcd compacts every minute),
// what the records take in etcd stays below the sum of the frontends'
// budgets and what a compaction period writes.

// maxAdmissionRecordBytes bounds an admission record.
const maxAdmissionRecordBytes = 256 << 10

// DefaultRecordBytesMax is a frontend's default record budget.
const DefaultRecordBytesMax = 256 << 20

// Codes of the record bounds' refusals.
const CodeRecordTooLarge = "request_record_too_large"

// recordBudget counts the record bytes a frontend wrote in buckets of a
// lease rotation (window/4); a bucket counts until every record written
// in it has expired (its lease's TTL after the lease's grant, which is
// at most a rotation earlier).
type recordBudget struct {
	max   int64
	width time.Duration
	span  time.Duration

	mu      sync.Mutex
	buckets []recordBucket
	total   int64
}

type recordBucket struct {
	start time.Time
	bytes int64
}

func newRecordBudget(limit int64, window time.Duration) *recordBudget {
	w := max(window/4, time.Second)
	return &recordBudget{max: limit, width: w, span: window + window/4 + 2*w}
}

// expire drops the buckets whose records have all expired. b.mu held.
func (b *recordBudget) expire(now time.Time) {
	for len(b.buckets) > 0 && now.Sub(b.buckets[0].start) >= b.span {
		b.total -= b.buckets[0].bytes
		b.buckets = b.buckets[1:]
	}
}

func (b *recordBudget) add(n int64, now time.Time) {
	if k := len(b.buckets); k == 0 || now.Sub(b.buckets[k-1].start) >= b.width {
		b.buckets = append(b.buckets, recordBucket{start: now})
	}
	b.buckets[len(b.buckets)-1].bytes += n
	b.total += n
}

// take charges n bytes if they fit; otherwise it says when the oldest
// bytes expire.
func (b *recordBudget) take(n int64, now time.Time) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	if b.total+n > b.max {
		retry := b.width
		if len(b.buckets) > 0 {
			retry = b.buckets[0].start.Add(b.span).Sub(now)
		}
		return false, max(retry, time.Second)
	}
	b.add(n, now)
	return true, 0
}

// charge counts n bytes whether or not they fit (a rewrite of a record
// already admitted).
func (b *recordBudget) charge(n int64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	b.add(n, now)
}

// live is the bytes that count now.
func (b *recordBudget) live(now time.Time) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	return b.total
}

// recordRefusal is a streamed request refused for its record's bytes.
type recordRefusal struct {
	status     int
	typ        openai.ErrorType
	code       string
	param, msg string
	retry      time.Duration
}

func (e *recordRefusal) Error() string { return e.msg }

func (e *recordRefusal) write(w http.ResponseWriter) {
	if e.retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((e.retry+time.Second-1)/time.Second)))
	}
	writeErrorBody(w, e.status, e.typ, e.code, e.param, e.msg)
}

// reserveRecord charges the admission records of a streamed request of
// count choices to the budget, or says why it is refused.
func (s *Server) reserveRecord(body *CompletionRequest, count int) *recordRefusal {
	if s.recs == nil || !body.recorded() {
		return nil
	}
	b, _ := json.Marshal(body)
	one := int64(len(b)) + recordOverhead
	if one > maxAdmissionRecordBytes {
		param := heaviestParam(body)
		s.metrics.refused.WithLabelValues(CodeRecordTooLarge).Inc()
		return &recordRefusal{status: http.StatusBadRequest, typ: openai.ErrInvalidRequest, code: CodeRecordTooLarge, param: param,
			msg: fmt.Sprintf("the request's failover record would be %d bytes, over the %d this cluster stores (so that any frontend can resume the stream); %s weighs most: shorten it", one, maxAdmissionRecordBytes, param)}
	}
	if ok, retry := s.recs.budget.take(one*int64(count), time.Now()); !ok {
		s.metrics.refused.WithLabelValues(string(openai.ErrRecordsFull)).Inc()
		return &recordRefusal{status: http.StatusServiceUnavailable, typ: openai.ErrRecordsFull, code: string(openai.ErrRecordsFull), retry: retry,
			msg: fmt.Sprintf("this frontend's request records hold their bound of %d bytes (they keep streams resumable through a frontend's death); retry after %v, or at another frontend", s.recs.budget.max, retry.Round(time.Second))}
	}
	s.metrics.recordBytes.Add(float64(one * int64(count)))
	return nil
}

// recordOverhead is what a record holds besides its body: ids, owner,
// times (a generous bound).
const recordOverhead = 1 << 10

// heaviestParam names the parameter of body that weighs most in its
// record.
func heaviestParam(body *CompletionRequest) string {
	size := func(v any) int { b, _ := json.Marshal(v); return len(b) }
	best, most := "prompt", size(body.Prompt)+size(body.PromptTokens)+size(body.Batch)
	if len(body.Messages) > 0 {
		best, most = "messages", most+size(body.Messages)
	}
	for _, c := range []struct {
		param string
		n     int
	}{
		{"stop", size(body.Stop)},
		{"tools", size(body.Tools) + size(body.ToolCalls)},
		{"response_format", size(body.Structured)},
		{"logit_bias", size(body.LogitBias)},
	} {
		if c.n > most {
			best, most = c.param, c.n
		}
	}
	return best
}
