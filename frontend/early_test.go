package frontend

import (
	"net/http/httptest"
	"testing"
)

// TestEarlySafe: only reads that change nothing may be answered from 0-RTT
// early data.
func TestEarlySafe(t *testing.T) {
	for _, c := range []struct {
		method, path string
		safe         bool
	}{
		{"GET", "/v1/streams/cmpl-1", true},
		{"HEAD", "/v1/streams/cmpl-1", true},
		{"GET", "/v1/models", true},
		{"GET", "/healthz", true},
		{"GET", "/readyz", true},
		{"POST", "/v1/completions", false},
		{"POST", "/v1/chat/completions", false},
		{"DELETE", "/v1/streams/cmpl-1", false},
		{"GET", "/v1/streams/", false},
		{"GET", "/v1/streams/a/b", false},
		{"GET", "/metrics", false},
		{"POST", "/healthz", false},
	} {
		if got := earlySafe(httptest.NewRequest(c.method, c.path, nil)); got != c.safe {
			t.Errorf("%s %s: safe %v, want %v", c.method, c.path, got, c.safe)
		}
	}
}
