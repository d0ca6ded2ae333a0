package frontend

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// TestPoolRefusesAnEndpointAnnouncedDead: a request that picked an
// endpoint just before its death was announced, and dials it just after
// (no dial of it under way for the announcement to end), fails at once
// instead of waiting out the dial timeout on a dead worker's port
// (TestFrontendWaitsForRestartedWorkers once migrated to the second of
// two workers killed together and lost 5 s there). A newer generation
// of the instance is dialled as ever.
func TestPoolRefusesAnEndpointAnnouncedDead(t *testing.T) {
	t.Parallel()
	p := newClientPool(&tls.Config{})
	p.fail("n1-decode-tiny-1", 3)
	for _, gen := range []uint64{2, 3} {
		start := time.Now()
		_, err := p.get(t.Context(), reqfsm.Endpoint{InstanceID: "n1-decode-tiny-1", Generation: gen}, "127.0.0.1:9")
		if !errors.Is(err, errEndpointFailed) || time.Since(start) > time.Second {
			t.Fatalf("dial of generation %d after generation 3 was announced dead: %v after %v", gen, err, time.Since(start))
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := p.get(ctx, reqfsm.Endpoint{InstanceID: "n1-decode-tiny-1", Generation: 4}, "127.0.0.1:9"); err == nil || errors.Is(err, errEndpointFailed) {
		t.Fatalf("dial of the next generation: %v (want the dial's own error)", err)
	}
}
