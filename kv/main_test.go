package kv

import (
	"testing"

	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestMain removes the binaries the process tests built; 4 of the
// parallel tests run at once (they wait on leases, graces and timers).
func TestMain(m *testing.M) { proctest.MainParallel(m, 4) }
