package schema

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestDecodeRequestRecord(t *testing.T) {
	good := RequestRecord{ID: "r1", Body: json.RawMessage(`{"model":"m"}`), Owner: "a", OwnerURL: "http://a", Term: 1}
	b, _ := json.Marshal(good)
	if r, err := DecodeRequestRecord(RequestsPrefix+"r1", b); err != nil || r.Term != 1 || r.Owner != "a" {
		t.Fatalf("%+v %v", r, err)
	}
	done := good
	done.Done, done.FinishReason, done.Output = true, "length", []RecordToken{{ID: 3, Text: "x"}}
	db, _ := json.Marshal(done)
	if r, err := DecodeRequestRecord(RequestsPrefix+"r1", db); err != nil || len(r.Output) != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	for name, c := range map[string]struct{ key, val string }{
		"garbage":      {RequestsPrefix + "r1", "{"},
		"not object":   {RequestsPrefix + "r1", "[1]"},
		"other key":    {RequestsPrefix + "r2", string(b)},
		"no body":      {RequestsPrefix + "r1", `{"id":"r1","owner":"a","term":1}`},
		"no owner":     {RequestsPrefix + "r1", `{"id":"r1","body":{},"term":1}`},
		"term 0":       {RequestsPrefix + "r1", `{"id":"r1","body":{},"owner":"a"}`},
		"term too big": {RequestsPrefix + "r1", `{"id":"r1","body":{},"owner":"a","term":4294967296}`},
		"done, no end": {RequestsPrefix + "r1", `{"id":"r1","body":{},"owner":"a","term":1,"done":true}`},
		"empty":        {RequestsPrefix + "r1", ""},
	} {
		if _, err := DecodeRequestRecord(c.key, []byte(c.val)); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDecodeResumeKeyRing(t *testing.T) {
	good := `{"keys":[{"id":"k1","secret":"MDEyMzQ1Njc4OWFiY2RlZg=="}]}`
	if r, err := DecodeResumeKeyRing([]byte(good)); err != nil || r.Keys[0].ID != "k1" {
		t.Fatalf("%+v %v", r, err)
	}
	for name, v := range map[string]string{
		"garbage":    "}",
		"no keys":    `{"keys":[]}`,
		"three keys": `{"keys":[{"id":"a","secret":"MDEyMzQ1Njc4OWFiY2RlZg=="},{"id":"b","secret":"MDEyMzQ1Njc4OWFiY2RlZg=="},{"id":"c","secret":"MDEyMzQ1Njc4OWFiY2RlZg=="}]}`,
		"short key":  `{"keys":[{"id":"a","secret":"MDEy"}]}`,
		"no id":      `{"keys":[{"secret":"MDEyMzQ1Njc4OWFiY2RlZg=="}]}`,
		"bad base64": `{"keys":[{"id":"a","secret":"!!"}]}`,
		"not object": `7`,
	} {
		if _, err := DecodeResumeKeyRing([]byte(v)); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
