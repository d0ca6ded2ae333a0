package frontend

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// With thousands of requests a second across frontends, every frontend
// sees every record write; those of requests it does not run must cost a
// lookup, not a decode of the record (its body and output).
func TestCheckOwnerIgnoresOtherFrontendsRecordsWithoutDecoding(t *testing.T) {
	s := &Server{streams: map[string]*stream{"mine": {id: "mine"}}}
	rec := schema.RequestRecord{ID: "theirs", Owner: "fe-2", Term: 2, Body: json.RawMessage(`{"prompt":"` + strings.Repeat("x", 4096) + `"}`)}
	val, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	key := schema.RequestsPrefix + rec.ID
	if n := testing.AllocsPerRun(100, func() { s.checkOwner(key, val) }); n != 0 {
		t.Fatalf("checkOwner of another frontend's record: %.0f allocations, want 0", n)
	}
	// A key outside the prefix, or a stream without a record, is not decoded either.
	if n := testing.AllocsPerRun(100, func() { s.checkOwner("mine", val); s.checkOwner(schema.RequestsPrefix+"mine", val) }); n != 0 {
		t.Fatalf("checkOwner of a record-less stream: %.0f allocations, want 0", n)
	}
}
