package agent

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestDrainDeadlines: a drain request's durations, their defaults, and
// typed errors for bad ones.
func TestDrainDeadlines(t *testing.T) {
	const def, defHard = 60 * time.Second, 90 * time.Second
	for _, c := range []struct {
		req            controlapi.DrainRequest
		deadline, hard time.Duration
		bad            bool
	}{
		{controlapi.DrainRequest{}, def, defHard, false},
		{controlapi.DrainRequest{Deadline: "5s", HardDeadline: "20s"}, 5 * time.Second, 20 * time.Second, false},
		// A deadline past the default hard deadline keeps the default gap.
		{controlapi.DrainRequest{Deadline: "2m"}, 2 * time.Minute, 2*time.Minute + 30*time.Second, false},
		{controlapi.DrainRequest{Deadline: "soon"}, 0, 0, true},
		{controlapi.DrainRequest{Deadline: "-1s"}, 0, 0, true},
		{controlapi.DrainRequest{HardDeadline: "0s"}, 0, 0, true},
		{controlapi.DrainRequest{Deadline: "30s", HardDeadline: "20s"}, 0, 0, true},
	} {
		d, h, err := drainDeadlines(c.req, def, defHard)
		if c.bad {
			if !errors.Is(err, controlapi.ErrBadRequest) {
				t.Errorf("%+v: %v, want a bad_request error", c.req, err)
			}
			continue
		}
		if err != nil || d != c.deadline || h != c.hard {
			t.Errorf("%+v: %v %v %v, want %v %v", c.req, d, h, err, c.deadline, c.hard)
		}
	}
}

// TestRunDrainUndrain drives a drain and an undrain through an in-process
// agent (so that the race detector sees them): the worker is stopped and
// its registration removed, then the instance comes back at a new
// generation, and Run still stops every goroutine.
func TestRunDrainUndrain(t *testing.T) {
	opts, cli := runOptions(t)
	opts.WorkerBinary = proctest.Lifeline(t)
	opts.Instances = []InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1}}
	opts.CanaryIdle, opts.CanaryTimeout, opts.DrainSettle = Duration(100*time.Millisecond), Duration(2*time.Second), Duration(50*time.Millisecond)
	worker := func() (controlapi.Worker, string) {
		ws, err := nodectl.Workers(context.Background(), opts.Socket)
		if err != nil || len(ws) != 1 {
			return controlapi.Worker{}, fmt.Sprint(ws, err)
		}
		return ws[0], fmt.Sprintf("%+v", ws[0])
	}
	var first controlapi.Worker
	runUntil(t, opts, func() (bool, string) {
		w, last := worker()
		if !w.Ready {
			return false, last
		}
		first = w
		if _, err := nodectl.Drain(context.Background(), opts.Socket, controlapi.DrainRequest{Deadline: "1s", HardDeadline: "20s"}); err != nil {
			t.Fatal(err)
		}
		proctest.WaitFor(t, 30*time.Second, "the node drained", func() (bool, string) {
			st, err := nodectl.GetStatus(context.Background(), opts.Socket)
			return err == nil && st.Drain != nil && st.Drain.Phase == controlapi.DrainDrained, fmt.Sprintf("%+v %v", st.Drain, err)
		})
		if resp, err := cli.Get(context.Background(), schema.InstancesPrefix, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
			t.Fatalf("registrations of a drained node: %v %v", resp, err)
		}
		if err := syscall.Kill(first.PID, 0); !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("worker %d still there once drained: %v", first.PID, err)
		}
		if _, err := nodectl.Undrain(context.Background(), opts.Socket); err != nil {
			t.Fatal(err)
		}
		proctest.WaitFor(t, 30*time.Second, "the instance back", func() (bool, string) {
			w, last := worker()
			return w.Ready && w.Generation > first.Generation, last
		})
		return true, ""
	})
}
