package frontend

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// doneRecord is a done record of n tokens of text, each with logprobs of
// lp bytes (none if 0), and a summary naming a tool call.
func doneRecord(n int, text string, lp int) schema.RequestRecord {
	body, _ := json.Marshal(CompletionRequest{Model: "m", Logprobs: lp > 0, TopLogprobs: 20})
	end := json.RawMessage(`{"request_id":"r","tool_calls":["call_x"]}`)
	rec := schema.RequestRecord{ID: "r", Body: body, Done: true, FinishReason: "stop", End: &end}
	for i := range n {
		t := schema.RecordToken{ID: i, Text: text}
		if lp > 0 {
			t.Logprobs = json.RawMessage(`{"pad":"` + strings.Repeat("x", lp) + `"}`)
		}
		rec.Output = append(rec.Output, t)
	}
	return rec
}

func recordBytes(rec schema.RequestRecord) int {
	b, _ := json.Marshal(rec)
	return len(b)
}

// TestRecordFitsEtcd: a done record stays under maxRecordBytes: its
// logprobs are dropped first (and marked, a replay has none), then its
// output; the summary with the tool calls' ids is kept either way.
func TestRecordFitsEtcd(t *testing.T) {
	small := doneRecord(10, "a", 700)
	if got := fitOutput(small); !reflect.DeepEqual(got, small) {
		t.Fatalf("a record that fits was changed: %+v", got)
	}

	// 2,000 tokens at top_logprobs 20 (~700 bytes each): over etcd's limit.
	rec := doneRecord(2000, "tok", 700)
	if recordBytes(rec) <= maxRecordBytes {
		t.Fatalf("test record of %d bytes fits", recordBytes(rec))
	}
	got := fitOutput(rec)
	if recordBytes(got) > maxRecordBytes || !got.LogprobsOmitted || len(got.Output) != 2000 || got.Output[1999].Text != "tok" ||
		got.Output[0].Logprobs != nil || got.ErrorType != "" || string(*got.End) != string(*rec.End) {
		t.Fatalf("%d bytes, logprobs omitted %v, %d tokens, error %q", recordBytes(got), got.LogprobsOmitted, len(got.Output), got.ErrorType)
	}
	st, err := recordStream(got)
	if err != nil {
		t.Fatal(err)
	}
	if st.body.Logprobs {
		t.Fatal("a replay renders logprobs the record does not hold")
	}

	// An output too large even without logprobs.
	rec = doneRecord(40000, strings.Repeat("y", 30), 0)
	got = fitOutput(rec)
	if recordBytes(got) > maxRecordBytes || got.Output != nil || got.ErrorType != string(openai.ErrOutputNotKept) || string(*got.End) != string(*rec.End) {
		t.Fatalf("%d bytes, %d tokens, error %q", recordBytes(got), len(got.Output), got.ErrorType)
	}
}

// TestAdmissionRecordTooLarge: a request whose body cannot fit a record
// is served without one (the gate opens), counted as skipped.
func TestAdmissionRecordTooLarge(t *testing.T) {
	rc := &records{m: newMetrics(), log: slog.New(slog.NewTextHandler(io.Discard, nil))} // no etcd: it must not be asked
	body := CompletionRequest{Model: "m", Prompt: strings.Repeat("p", maxRecordBytes)}
	st := newStream("r", body, false, true, func(error) {})
	st.rec = &recordState{stored: make(chan struct{})}
	rc.admit(context.Background(), st, rc.newRecord(st, st.rec.expiry, st.rec.expiry))
	select {
	case <-st.rec.stored:
	default:
		t.Fatal("the gate stayed closed")
	}
	skipped := -1.0
	mfs, _ := rc.m.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "lifeline_frontend_request_records_skipped_total" {
			skipped = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if st.rec.rev != 0 || skipped != 1 {
		t.Fatalf("rev %d, skipped %v", st.rec.rev, skipped)
	}
}
