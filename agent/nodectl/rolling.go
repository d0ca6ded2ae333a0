package nodectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// RollingOptions configure a rolling upgrade.
type RollingOptions struct {
	// Sockets are the nodes' control sockets, upgraded in this order.
	Sockets []string
	// Deadline and HardDeadline are each drain's ("60s"; empty: the
	// agent's defaults).
	Deadline, HardDeadline string
	// ReadyTimeout bounds how long a restarted node may take until every
	// instance it had is ready again (default 2 min).
	ReadyTimeout time.Duration
}

// RollingUpgrade restarts the nodes' agents and workers one node at a
// time: the node drains (waiting for the disruption budget: requests in
// flight finish or move), its agent stops, its supervisor (systemd, or
// lifeline up) starts it again — running whatever binary is installed by
// then, which comes back drained (a drain outlives its agent) and is
// undrained — and every instance the node had is ready again at a higher
// generation before the next node starts. It stops at the first node
// that does not come back.
func RollingUpgrade(ctx context.Context, opts RollingOptions, out io.Writer) error {
	if len(opts.Sockets) == 0 {
		return errors.New("upgrade: no nodes: give their control sockets")
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 2 * time.Minute
	}
	start := time.Now()
	for i, sock := range opts.Sockets {
		fmt.Fprintf(out, "[%d/%d] %s\n", i+1, len(opts.Sockets), sock)
		if err := upgradeNode(ctx, sock, opts, out); err != nil {
			return fmt.Errorf("upgrade: %s: %w", sock, err)
		}
	}
	fmt.Fprintf(out, "upgraded %d nodes in %v\n", len(opts.Sockets), time.Since(start).Round(time.Millisecond))
	return nil
}

// upgradeNode drains one node, restarts its agent and waits for it.
func upgradeNode(ctx context.Context, sock string, opts RollingOptions, out io.Writer) error {
	before, err := GetStatus(ctx, sock)
	if err != nil {
		return err
	}
	d, err := Drain(ctx, sock, controlapi.DrainRequest{Deadline: opts.Deadline, HardDeadline: opts.HardDeadline})
	if err != nil {
		return err
	}
	printDrain(out, d)
	if err := followDrain(ctx, out, sock, d); err != nil {
		return err
	}
	fmt.Fprintf(out, "node %s: stopping agent %d\n", before.NodeID, before.PID)
	if err := syscall.Kill(before.PID, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop agent %d: %w", before.PID, err)
	}
	after, err := waitRestarted(ctx, out, sock, before, opts.ReadyTimeout)
	if err != nil {
		return err
	}
	for _, w := range after.Instances {
		fmt.Fprintf(out, "node %s: %s ready at generation %d (agent %d)\n", after.NodeID, w.InstanceID, w.Generation, after.PID)
	}
	return nil
}

// waitRestarted waits until a new agent answers on sock, undrains it
// if it came back drained, and every instance the node had before is
// ready at a higher generation.
func waitRestarted(ctx context.Context, out io.Writer, sock string, before controlapi.Status, timeout time.Duration) (controlapi.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		st, err := GetStatus(ctx, sock)
		switch ok, why := restarted(before, st); {
		case err != nil:
			last = err.Error()
		case st.PID != before.PID && st.Drain != nil && st.Drain.Phase == controlapi.DrainDrained:
			last = "agent back drained"
			if _, err := Undrain(ctx, sock); err != nil {
				last += ": " + err.Error()
			} else {
				fmt.Fprintf(out, "node %s: agent %d back, drained: undraining\n", st.NodeID, st.PID)
			}
		case ok:
			return st, nil
		default:
			last = why
		}
		select {
		case <-ctx.Done():
			return controlapi.Status{}, fmt.Errorf("not back within %v (last: %s)", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// restarted reports whether st is a new agent with every instance of
// before ready at a higher generation, and if not, why.
func restarted(before, st controlapi.Status) (bool, string) {
	if st.PID == before.PID {
		return false, fmt.Sprintf("agent %d still running", st.PID)
	}
	now := map[string]controlapi.Worker{}
	for _, w := range st.Instances {
		now[w.InstanceID] = w
	}
	for _, w := range before.Instances {
		n, ok := now[w.InstanceID]
		switch {
		case !ok:
			return false, fmt.Sprintf("%s not supervised yet", w.InstanceID)
		case !n.Ready || n.Generation <= w.Generation:
			return false, fmt.Sprintf("%s at generation %d, ready %v (was %d)", w.InstanceID, n.Generation, n.Ready, w.Generation)
		}
	}
	return true, ""
}
