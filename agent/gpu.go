package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// ErrNoGPU matches every reason the GPU checker cannot run (no library, no
// device). The agent then runs without GPU checks and says so.
var ErrNoGPU = errors.New("agent: GPU health checks not supported")

// applicationXIDs are XIDs an application causes (bad kernel, page fault,
// preemption); they do not mean the GPU is unhealthy.
var applicationXIDs = []uint64{13, 31, 43, 45, 68, 109}

// gpuEvent is one critical GPU event.
type gpuEvent struct {
	Device int
	Kind   string // "xid" or "ecc_dbe"
	XID    uint64
}

// gpuChecker watches XID critical errors and double-bit ECC errors.
type gpuChecker struct {
	set     nvml.EventSet
	devices int
	mu      sync.Mutex
	closed  bool
}

// nvmlMu serialises Init: without a GPU, any NVML call after a failed Init
// kills the process (symbol lookup error), so nothing but Init runs until
// Init succeeded.
var nvmlMu sync.Mutex

// newGPUChecker initialises NVML and registers for critical events on every
// device. Any failure is ErrNoGPU.
func newGPUChecker() (*gpuChecker, error) {
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: NVML init: %v", ErrNoGPU, ret)
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		nvml.Shutdown()
		return nil, fmt.Errorf("%w: %d devices (%v)", ErrNoGPU, n, ret)
	}
	set, ret := nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		nvml.Shutdown()
		return nil, fmt.Errorf("%w: event set: %v", ErrNoGPU, ret)
	}
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		dev.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError, set)
	}
	return &gpuChecker{set: set, devices: n}, nil
}

// run delivers critical events until ctx is done.
func (g *gpuChecker) run(ctx context.Context, out func(gpuEvent)) {
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
			out(gpuEvent{Device: idx, Kind: "ecc_dbe"})
		case data.EventType&nvml.EventTypeXidCriticalError != 0 && !slices.Contains(applicationXIDs, data.EventData):
			out(gpuEvent{Device: idx, Kind: "xid", XID: data.EventData})
		}
	}
}

func (g *gpuChecker) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	g.set.Free()
	nvml.Shutdown()
}

// startGPU watches the node's GPUs for critical errors, when it has any;
// without, the agent runs without GPU checks and says why.
func (a *Agent) startGPU(ctx context.Context) {
	if a.gpu, a.gpuErr = newGPUChecker(); a.gpuErr != nil {
		a.log.Info("GPU health checks off", "reason", a.gpuErr)
		return
	}
	a.track(func() {
		a.gpu.run(ctx, a.onGPUEvent)
		a.gpu.close()
	})
}

// onGPUEvent marks the instances on the faulted device not ready — those
// pinned to it and every unpinned one — until the agent restarts.
func (a *Agent) onGPUEvent(e gpuEvent) {
	a.mu.Lock()
	if a.gpuFaults == nil {
		a.gpuFaults = map[int]bool{}
	}
	a.gpuFaults[e.Device] = true
	for _, inst := range a.instances {
		if inst.spec.onFaultedGPU(a.gpuFaults) {
			inst.ready, inst.notReady = false, controlapi.ReasonGPUXid
		}
	}
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventNotReady, Reason: controlapi.ReasonGPUXid, Detail: fmt.Sprintf("device %d: %s %d", e.Device, e.Kind, e.XID)})
	a.log.Error("critical GPU error", "failure_reason", controlapi.ReasonGPUXid, "device", e.Device, "kind", e.Kind, "xid", e.XID, "recovery_action", "not ready")
	a.registerAll(context.Background())
}

// onFaultedGPU says whether the instance may compute on a device of
// faults: the one it is pinned to, or any when unpinned.
func (in InstanceSpec) onFaultedGPU(faults map[int]bool) bool {
	if in.GPU != nil {
		return faults[*in.GPU]
	}
	return len(faults) > 0
}

// gpuEnv is what pins a worker to its instance's device: nothing when
// unpinned.
func (in InstanceSpec) gpuEnv() []string {
	if in.GPU == nil {
		return nil
	}
	return []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", fmt.Sprintf("CUDA_VISIBLE_DEVICES=%d", *in.GPU)}
}

// workerEnv is the environment of an instance's worker processes: the
// agent's, its thread bound and its device.
func (in InstanceSpec) workerEnv() []string {
	env := in.gpuEnv()
	if in.Threads > 0 {
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", in.Threads))
	}
	if env == nil {
		return nil // the agent's own
	}
	return append(os.Environ(), env...)
}
