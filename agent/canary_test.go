package agent

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
)

// TestCanaryAllowance: an idle worker's canary gets canary_timeout alone;
// a busy one's gets the step it queues behind and one step per token on
// top, bounded whatever the worker reports.
func TestCanaryAllowance(t *testing.T) {
	for _, c := range []struct {
		h    *wire.HealthReply
		want time.Duration
	}{
		{&wire.HealthReply{StepTimeUs: 1_500_000}, 0},
		{&wire.HealthReply{Running: 3, StepTimeUs: 1_500_000}, time.Duration(canaryTokens+1) * 1500 * time.Millisecond},
		{&wire.HealthReply{Queued: 1, StepTimeUs: 2000}, time.Duration(canaryTokens+1) * 2 * time.Millisecond},
		{&wire.HealthReply{Running: 1, StepTimeUs: 1 << 50}, maxCanaryAllowance},
		{&wire.HealthReply{Running: 1, StepTimeUs: 1<<64 - 1}, maxCanaryAllowance},
	} {
		if got := canaryAllowance(c.h); got != c.want {
			t.Errorf("%+v: %v, want %v", c.h, got, c.want)
		}
	}
}

// TestWaitedBehindWork: only a slow or refused canary can be excused by
// the worker's progress; wrong frames never are.
func TestWaitedBehindWork(t *testing.T) {
	for _, c := range []struct {
		reason string
		err    error
		want   bool
	}{
		{controlapi.ReasonCanaryTimeout, errors.New("canary timed out"), true},
		{controlapi.ReasonCanaryError, fmt.Errorf("%w: canary limit", errCanaryRefused), true},
		{controlapi.ReasonCanaryError, errors.New("canary frame 2: sequence 3 generation 1"), false},
		{controlapi.ReasonCanaryError, errors.New("canary: internal"), false},
	} {
		if got := waitedBehindWork(c.reason, c.err); got != c.want {
			t.Errorf("%s %v: %v, want %v", c.reason, c.err, got, c.want)
		}
	}
}
