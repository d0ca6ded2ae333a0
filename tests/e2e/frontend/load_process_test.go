package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestLoadCommand runs `lifeline load` against a frontend in front of a
// synthetic worker (the agent's synthetic_tokens_per_second): every
// stream is read to its end, its tokens counted, and the frontend's CPU
// per relayed token read from its metrics; a run that cannot be made, or
// whose streams fail, exits non-zero naming why.
func TestLoadCommand(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(c *clustertest.Config) {
		c.CanaryIdle = agent.Duration(time.Hour)
		c.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1, SyntheticRate: 200}}
	})
	n.WaitWorkerReady(t)
	fe := clustertest.StartFrontendProc(t, n)
	load := func(args ...string) (string, string, error) {
		cmd := exec.Command(proctest.Lifeline(t), append([]string{"load", "--url", fe.URL}, args...)...)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		return out.String(), errOut.String(), err
	}
	out, errOut, err := load("--metrics", fe.MetricsURL, "--model", "synthetic-tiny", "--requests", "12", "--rate", "40", "--max-tokens", "20", "--json")
	if err != nil {
		t.Fatalf("lifeline load: %v\n%s%s", err, out, errOut)
	}
	var r struct {
		Requests, Completed, Failed int
		Tokens                      int64
		PeakOpen                    int64   `json:"peak_open"`
		TTFT                        float64 `json:"ttft_p50_ms"`
		Gap                         float64 `json:"gap_p50_ms"`
		Relayed                     float64 `json:"relayed_tokens"`
		CPU                         float64 `json:"frontend_cpu_us_per_token"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.Requests != 12 || r.Completed != 12 || r.Failed != 0 || r.Tokens != 12*20 || r.PeakOpen < 1 || r.TTFT <= 0 || r.Gap <= 0 {
		t.Fatalf("report %+v, want 12 streams of 20 tokens completed", r)
	}
	// The frontend counted what it relayed (each stream's tokens; its
	// finish is no token) and spent some CPU on it.
	if r.Relayed < 12*20 || r.CPU <= 0 {
		t.Fatalf("frontend figures: %.0f tokens relayed, %.1f µs a token", r.Relayed, r.CPU)
	}
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"no streams":    {[]string{"--model", "synthetic-tiny", "--requests", "0"}, "requests 0"},
		"unknown model": {[]string{"--model", "no-such-model", "--requests", "2", "--max-tokens", "2"}, "no-such-model"},
	} {
		out, errOut, err := load(c.args...)
		if err == nil || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: err %v, stderr %q, stdout %q; want a failure naming %q", name, err, errOut, out, c.want)
		}
	}
}
