// Package nvmlgpu is the agent's GPU watcher on NVIDIA's management
// library (NVML, through cgo): XID critical errors a GPU causes and
// double-bit ECC errors. The lifeline binary links it into the agent
// (agent.Options.GPU); nothing else does, so every other program and
// test binary that links the agent links without cgo.
package nvmlgpu

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/lifeline-llm/lifeline/agent"
)

// applicationXIDs are XIDs an application causes (bad kernel, page fault,
// preemption); they do not mean the GPU is unhealthy.
var applicationXIDs = []uint64{13, 31, 43, 45, 68, 109}

// Watcher is an NVML event set registered for critical events on every
// device.
type Watcher struct {
	set     nvml.EventSet
	devices int
	mu      sync.Mutex
	closed  bool
}

// nvmlMu serialises Init: without a GPU, any NVML call after a failed Init
// kills the process (symbol lookup error), so nothing but Init runs until
// Init succeeded.
var nvmlMu sync.Mutex

// Open initialises NVML and registers for critical events on every
// device. Any failure is agent.ErrNoGPU.
func Open() (agent.GPUWatcher, error) {
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: NVML init: %v", agent.ErrNoGPU, ret)
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		nvml.Shutdown()
		return nil, fmt.Errorf("%w: %d devices (%v)", agent.ErrNoGPU, n, ret)
	}
	set, ret := nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		nvml.Shutdown()
		return nil, fmt.Errorf("%w: event set: %v", agent.ErrNoGPU, ret)
	}
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		dev.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError, set)
	}
	return &Watcher{set: set, devices: n}, nil
}

// Devices is how many devices are watched.
func (g *Watcher) Devices() int { return g.devices }

// Run delivers critical events until ctx is done.
func (g *Watcher) Run(ctx context.Context, out func(agent.GPUEvent)) {
	for ctx.Err() == nil {
		data, ret := g.set.Wait(500)
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			// The GPU may be gone; do not spin.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		idx := -1
		if data.Device != nil {
			if i, r := data.Device.GetIndex(); r == nvml.SUCCESS {
				idx = i
			}
		}
		switch {
		case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
			out(agent.GPUEvent{Device: idx, Kind: "ecc_dbe"})
		case data.EventType&nvml.EventTypeXidCriticalError != 0 && !slices.Contains(applicationXIDs, data.EventData):
			out(agent.GPUEvent{Device: idx, Kind: "xid", XID: data.EventData})
		}
	}
}

// Close frees the event set and shuts NVML down, once.
func (g *Watcher) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	g.set.Free()
	nvml.Shutdown()
}
