package agent

import (
	"errors"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
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
