package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/lifeline-llm/lifeline/ebpf"
)

// startDetector opens the failure detector the configuration asks for:
// eBPF, else pidfd.
func (a *Agent) startDetector() error {
	var err error
	switch a.opts.Detector {
	case "ebpf":
		a.detector, err = ebpf.NewEBPF()
	case "pidfd":
		a.detector, err = ebpf.NewPidfd()
		a.detectorFallback = errors.New("pidfd chosen by configuration")
	default:
		a.detector, a.detectorFallback = ebpf.NewDetector()
	}
	if a.detector == nil {
		return fmt.Errorf("agent: no failure detector: %w", errors.Join(err, a.detectorFallback))
	}
	if a.detectorFallback != nil {
		a.log.Warn("eBPF failure detection unavailable; using pidfd", "reason", a.detectorFallback)
	}
	a.log.Info("failure detector", "detector", a.detector.Name())
	return nil
}

// dispatchExits routes detector events to the instance that owns the pid.
func (a *Agent) dispatchExits(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ex, ok := <-a.detector.Exits():
			if !ok {
				return
			}
			a.mu.Lock()
			ch := a.byPID[ex.PID]
			a.mu.Unlock()
			if ch != nil {
				select {
				case ch <- ex:
				default:
				}
			}
		}
	}
}
