package e2e

import (
	"testing"

	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestMain removes the binaries the process tests built.
func TestMain(m *testing.M) { proctest.Main(m) }
