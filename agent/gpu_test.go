package agent

import (
	"errors"
	"os"
	"testing"
)

// TestGPUCheckerWithoutGPU: on a machine without an NVIDIA GPU the checker
// reports ErrNoGPU after a guarded Init, and the process survives (an NVML
// call after a failed Init would kill it). With a GPU it must start.
func TestGPUCheckerWithoutGPU(t *testing.T) {
	_, statErr := os.Stat("/dev/nvidia0")
	g, err := newGPUChecker()
	if statErr == nil {
		if err != nil {
			t.Fatalf("a GPU is present but the checker failed: %v", err)
		}
		g.close()
		return
	}
	if !errors.Is(err, ErrNoGPU) {
		t.Fatalf("without a GPU: %v, want ErrNoGPU", err)
	}
	t.Logf("no GPU: %v", err)
}
