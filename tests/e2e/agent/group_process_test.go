package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// alive says whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// TestAgentRestartsATPGroupAsAWhole: an instance with tp 2 is two worker
// processes, one registration (its numerics id says tp=2). SIGKILL rank 1:
// the instance is deregistered and its failure announced, rank 0 is gone
// within a second (no rank of the old generation left), and both ranks
// come back together at a higher generation, ready after their canary.
// SIGSTOP rank 1 of the new group: its canary fails (rank 0's collectives
// wait for it), and the whole group is restarted again.
func TestAgentRestartsATPGroupAsAWhole(t *testing.T) {
	t.Parallel()
	metricsAddr := proctest.FreeTCPAddr(t)
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.Metrics = metricsAddr
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1, TP: 2}}
		o.CanaryIdle, o.CanaryTimeout = agent.Duration(500*time.Millisecond), agent.Duration(time.Second)
	})
	const id = "n1-decode-tiny-tp2-0"
	reg := n.WaitRegistration(t, id, 0)
	if !strings.Contains(reg.NumericsID, ";tp=2;") {
		t.Fatalf("a tp=2 group registered numerics %q", reg.NumericsID)
	}
	ranks := func() []controlapi.RankProc {
		for _, w := range n.NodectlWorkers(t) {
			if w.InstanceID == id && w.TP == 2 {
				return w.Ranks
			}
		}
		return nil
	}
	rs := ranks()
	if len(rs) != 2 || rs[0].PID == 0 || rs[1].PID == 0 {
		t.Fatalf("ranks of %s: %+v", id, rs)
	}
	failures := n.Env.Client.Watch(context.Background(), schema.FailuresPrefix+id)
	if err := syscall.Kill(rs[1].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case fr := <-failures:
		if len(fr.Events) == 0 || fr.Events[0].Type != clientv3.EventTypePut {
			t.Fatalf("failure watch: %+v", fr)
		}
		t.Logf("failure announced %v after rank 1's kill", time.Since(killed))
	case <-time.After(10 * time.Second):
		t.Fatalf("no failure announced 10 s after rank 1's death; log:\n%s", n.Log.String())
	}
	proctest.WaitFor(t, time.Second, "rank 0 of the old generation gone", func() (bool, string) {
		return !alive(rs[0].PID), fmt.Sprint(rs[0].PID, " still runs")
	})
	t.Logf("rank 0 gone %v after rank 1's kill", time.Since(killed))
	back := n.WaitRegistration(t, id, reg.Generation)
	rs2 := ranks()
	if len(rs2) != 2 || rs2[0].PID == rs[0].PID || rs2[1].PID == rs[1].PID {
		t.Fatalf("after the restart, ranks %+v (before %+v)", rs2, rs)
	}
	t.Logf("back at generation %d (was %d) %v after the kill", back.Generation, reg.Generation, time.Since(killed))
	if strings.Contains(fmt.Sprint(procfs.Mentioning(n.Dir+"/")), fmt.Sprintf("--group-generation=%d ", reg.Generation)) {
		t.Fatalf("a rank of generation %d still runs", reg.Generation)
	}

	// SIGSTOP rank 1: rank 0 cannot compute the canary; the group goes.
	if err := syscall.Kill(rs2[1].PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(rs2[1].PID, syscall.SIGCONT)
	third := n.WaitRegistration(t, id, back.Generation)
	if alive(rs2[0].PID) {
		t.Fatalf("rank 0 of generation %d runs on after its group was restarted", back.Generation)
	}
	proctest.WaitFor(t, 5*time.Second, "the stopped rank gone", func() (bool, string) {
		return !alive(rs2[1].PID), fmt.Sprint(rs2[1].PID, " still there")
	})
	t.Logf("a stopped rank: the group was restarted at generation %d", third.Generation)
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := string(page)
	if !strings.Contains(m, "lifeline_agent_group_aborts_total 2") {
		t.Fatalf("group aborts not counted:\n%s", grep(m, "lifeline_agent_group"))
	}
}

func grep(page, prefix string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestGroupsShareKVByLayout: one node runs a tp=1 instance and two tp=2
// groups of the same model over one arena. A long prompt computed by one
// group is published (every rank wrote its heads' part of each block) and
// reused by the other group, which then generates exactly what the first
// did; the tp=1 worker reuses none of the groups' blocks, nor they its
// (no block crosses between layouts), while it reuses its own.
func TestGroupsShareKVByLayout(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1}, {Role: "decode", Preset: "tiny", Count: 2, TP: 2}}
		o.ArenaSlotBytes = 131072
		o.CanaryIdle = agent.Duration(time.Hour)
	})
	one := n.DialWorker(t, "n1-decode-tiny-0")
	a, b := n.DialWorker(t, "n1-decode-tiny-tp2-0"), n.DialWorker(t, "n1-decode-tiny-tp2-1")
	run := func(c *workerclient.Client, id, prompt string) (uint32, []int32) {
		s, err := c.Generate(t.Context(), &wire.Generate{RequestId: id, Prompt: prompt, MaxTokens: 8, IgnoreEos: true, Temperature: 0.8, Seed: 5})
		if err != nil {
			t.Fatal(err)
		}
		var r uint32
		fs := clustertest.CollectFrames(t, s)
		for _, f := range fs {
			r = max(r, f.ReusedPositions)
		}
		toks, _, err := clustertest.Generated(fs)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		return r, toks
	}
	p := strings.Repeat("the quick brown fox jumps over the lazy dog ", 12)
	if r, _ := run(a, "a", p); r != 0 {
		t.Fatalf("group a reused %d positions of a prompt nobody computed", r)
	}
	r, toksB := run(b, "b", p)
	_, toksA := run(a, "a2", p)
	if r == 0 {
		t.Fatal("group b reused nothing of the prompt group a had published")
	}
	if !slices.Equal(toksA, toksB) {
		t.Fatalf("group b on a's blocks generated %v, group a %v", toksB, toksA)
	}
	if r, _ := run(one, "one", p); r != 0 {
		t.Fatalf("the tp=1 worker reused %d positions of the groups' blocks", r)
	}
	q := strings.Repeat("a stitch in time saves nine ", 16)
	run(one, "one-q", q)
	if r, _ := run(one, "one-q2", q); r == 0 {
		t.Fatal("the tp=1 worker reused nothing of a prompt it had just computed: the test proves nothing")
	}
	if r, _ := run(a, "a-q", q); r != 0 {
		t.Fatalf("group a reused %d positions of the tp=1 worker's blocks", r)
	}
}

// TestAgentRestartEndsItsOldGroup: the agent is SIGKILLed while its tp=2
// group runs (workers outlive their agent). The restarted agent does not
// adopt a group: it aborts the old group's segment, ends every one of its
// processes and starts a fresh group at a higher generation; no process
// of the old group is left.
func TestAgentRestartEndsItsOldGroup(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1, TP: 2}}
	})
	const id = "n1-decode-tiny-tp2-0"
	reg := n.WaitRegistration(t, id, 0)
	var old []controlapi.RankProc
	for _, w := range n.NodectlWorkers(t) {
		if w.InstanceID == id {
			old = w.Ranks
		}
	}
	if len(old) != 2 {
		t.Fatalf("ranks %+v", old)
	}
	n.Process().Kill()
	<-n.Exited()
	for _, r := range old {
		if !alive(r.PID) {
			t.Fatalf("rank %d (pid %d) died with its agent", r.Rank, r.PID)
		}
	}
	// A segment an earlier agent process left with no record of it (it
	// was SIGKILLed before it could end that group), and a file that only
	// looks like one of this instance's.
	prefix := n.Options.ArenaPath + ".group-" + id + "-"
	stale := prefix + "7"
	other := prefix + "7-not-a-generation"
	for _, p := range []string{stale, other} {
		if err := os.WriteFile(p, []byte("left behind"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(stale); os.Remove(other) })
	n.Restart(t)
	back := n.WaitRegistration(t, id, reg.Generation)
	proctest.WaitFor(t, 5*time.Second, "the old group's processes gone", func() (bool, string) {
		for _, r := range old {
			if alive(r.PID) {
				return false, fmt.Sprintf("rank %d (pid %d) still runs", r.Rank, r.PID)
			}
		}
		return true, ""
	})
	segs, _ := filepath.Glob(prefix + "*")
	want := []string{fmt.Sprintf("%s%d", prefix, back.Generation), other}
	slices.Sort(segs)
	slices.Sort(want)
	if !slices.Equal(segs, want) {
		t.Fatalf("segments after the restart: %v, want the new group's and the look-alike only: %v", segs, want)
	}
	t.Logf("a fresh group at generation %d (was %d)", back.Generation, reg.Generation)
}
