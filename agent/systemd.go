package agent

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// startSystemd tells systemd when the agent is ready and, when the unit
// has a watchdog, keeps answering it.
func (a *Agent) startSystemd(ctx context.Context) {
	a.track(func() { a.notifyReady(ctx) })
	if interval, err := daemon.SdWatchdogEnabled(false); err == nil && interval > 0 {
		a.track(func() { a.petWatchdog(ctx, interval) })
	}
}

// notifyReady sends READY=1 once registered: a lease is held and an
// instance is ready (or none is configured), or after a minute with the
// reason in STATUS.
func (a *Agent) notifyReady(ctx context.Context) {
	deadline := time.Now().Add(time.Minute)
	for ctx.Err() == nil {
		a.mu.Lock()
		ok := a.lease != 0 && (len(a.instances) == 0 || slices.ContainsFunc(slices.Collect(maps.Values(a.instances)), func(i *instance) bool { return i.ready }))
		a.mu.Unlock()
		if ok {
			daemon.SdNotify(false, daemon.SdNotifyReady)
			return
		}
		if time.Now().After(deadline) {
			daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS=no instance ready or no etcd lease after 1m")
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// petWatchdog answers systemd's watchdog twice per interval.
func (a *Agent) petWatchdog(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// The agent's own loops answer: the control socket and the
			// lease loop share a.mu; taking it proves no deadlock.
			a.mu.Lock()
			a.mu.Unlock()
			daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		}
	}
}
