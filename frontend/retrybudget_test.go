package frontend

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestPriorityFromHeaderOrBody: the body's priority wins over the
// Lifeline-Priority header; anything but interactive or batch is a 400
// naming priority.
func TestPriorityFromHeaderOrBody(t *testing.T) {
	for _, c := range []struct{ header, body, want, err string }{
		{"", `,"priority":"batch"`, "batch", ""},
		{"batch", "", "batch", ""},
		{"batch", `,"priority":"interactive"`, "interactive", ""},
		{"", "", "", ""},
		{"urgent", "", "", "priority"},
		{"", `,"priority":"low"`, "", "priority"},
	} {
		data := []byte(`{"model":"m","prompt":"x"` + c.body + `}`)
		req := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(data))
		if c.header != "" {
			req.Header.Set("Lifeline-Priority", c.header)
		}
		body, err := decodeCompletion(data, req, false)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%+v: err %v", c, err)
		case c.err == "" && (err != nil || body.Priority != c.want):
			t.Errorf("%+v: %q %v", c, body.Priority, err)
		}
	}
}
