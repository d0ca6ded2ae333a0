package nvmlgpu

import (
	"errors"
	"os"
	"testing"

	"github.com/lifeline-llm/lifeline/agent"
)

// TestOpenWithoutGPU: on a machine without an NVIDIA GPU the watcher
// reports agent.ErrNoGPU after a guarded Init, and the process survives
// (an NVML call after a failed Init would kill it). With a GPU it must
// start.
func TestOpenWithoutGPU(t *testing.T) {
	_, statErr := os.Stat("/dev/nvidia0")
	g, err := Open()
	if statErr == nil {
		if err != nil {
			t.Fatalf("a GPU is present but the watcher failed: %v", err)
		}
		if g.Devices() == 0 {
			t.Fatal("a GPU is present but no device is watched")
		}
		g.Close()
		return
	}
	if !errors.Is(err, agent.ErrNoGPU) {
		t.Fatalf("without a GPU: %v, want ErrNoGPU", err)
	}
	t.Logf("no GPU: %v", err)
}
