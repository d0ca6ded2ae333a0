package frontend

import (
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestOwnedWaitsAndCounts: wait returns once every goroutine returned,
// and names how many are still running when one outlives the bound.
func TestOwnedWaitsAndCounts(t *testing.T) {
	var o owned
	release := make(chan struct{})
	for range 3 {
		o.Go(func() { <-release })
	}
	o.Go(func() {})
	if left := o.wait(20 * time.Millisecond); left != 3 {
		t.Fatalf("wait with three stuck: %d left, want 3", left)
	}
	close(release)
	if left := o.wait(5 * time.Second); left != 0 || o.Running() != 0 {
		t.Fatalf("after release: %d left, %d running", left, o.Running())
	}
}

// TestLeakMarkerIsTheError: the process tests' leak check reads the text
// Run's error carries.
func TestLeakMarkerIsTheError(t *testing.T) {
	if !strings.Contains(ErrGoroutinesOutlived.Error(), clustertest.FrontendLeak) {
		t.Fatalf("%q does not contain the marker %q", ErrGoroutinesOutlived, clustertest.FrontendLeak)
	}
}
