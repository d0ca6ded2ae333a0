package drill

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestStartLocalRefusesNegativeThreads: a negative thread count is
// refused, by name, before anything starts (no directory written).
func TestStartLocalRefusesNegativeThreads(t *testing.T) {
	dir := t.TempDir()
	_, err := StartLocal(context.Background(), Standard, LocalOptions{Dir: dir, Binary: "/nonexistent", Preset: "tiny", Threads: -1})
	if err == nil || !strings.Contains(err.Error(), "threads -1") {
		t.Fatalf("StartLocal with threads -1: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("StartLocal wrote %d entries before refusing", len(left))
	}
}
