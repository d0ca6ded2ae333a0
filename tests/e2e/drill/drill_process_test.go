package e2e

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/app/drill"
	"github.com/lifeline-llm/lifeline/internal/netns"
	"github.com/lifeline-llm/lifeline/internal/tracing"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

func TestMain(m *testing.M) { proctest.Main(m) }

// localOptions is a local cluster of tiny workers paced to a step every
// clustertest.PacedStep: streams last as long as small's, so that each
// drill's fault lands mid-stream as it does on small, at a fraction of
// small's CPU. No drill checks small's numerics.
func localOptions(t *testing.T, bin string) drill.LocalOptions {
	return drill.LocalOptions{Dir: t.TempDir(), Binary: bin, Preset: "tiny", Threads: 1, StepInterval: clustertest.PacedStep}
}

// shortConfig is a short pass: a few streams of few tokens.
var shortConfig = drill.Config{Streams: 3, MaxTokens: 24, Seed: 7}

// TestShortPass runs every drill on the local clusters it starts (one
// per shape) with a small load, and asserts each drill's outcome and its
// key figures.
func TestShortPass(t *testing.T) {
	t.Parallel()
	bin := proctest.Lifeline(t)
	ds, err := drill.Select([]string{"all"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	reports, err := drill.Run(ctx, drill.Options{Drills: ds, Config: shortConfig,
		Local: localOptions(t, bin)}, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 11 {
		t.Fatalf("%d reports, want 11", len(reports))
	}
	by := map[int]drill.Report{}
	for _, r := range reports {
		by[r.Number] = r
	}
	for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 8, 10, 11} {
		if by[n].Result != drill.Pass {
			t.Errorf("drill %d %s: %s: %s", n, by[n].Name, by[n].Result, by[n].Detail)
		}
		figure(t, by[n], "failed", eq(0))
		figure(t, by[n], "identical", eq(1))
		figure(t, by[n], "gaps", eq(0))
		figure(t, by[n], "duplicates", eq(0))
		if len(by[n].Timeline) < 3 {
			t.Errorf("drill %d: timeline %v", n, by[n].Timeline)
		}
	}
	figure(t, by[1], "removed_ms", within(0, float64(drill.RemovalTarget.Milliseconds())))
	figure(t, by[1], "reached_dead_worker", eq(0))
	figure(t, by[1], "streams_after_removal", within(1, 1e9))
	figure(t, by[2], "migrated_streams", within(1, 3))
	figure(t, by[2], "rto_p99_ms", within(0.001, 30000))
	figure(t, by[2], "detection_ms", within(0, 2000))
	// The report carries a migrated request's trace: its migration span.
	if tr := by[2].Traces; len(tr) == 0 || !slices.ContainsFunc(tr[0], func(s tracing.Span) bool { return s.Name == "lifeline.migration" }) {
		t.Errorf("drill 2: traces %+v", tr)
	}
	figure(t, by[5], "tp", eq(2))
	figure(t, by[5], "migrated_streams", within(1, 3))
	figure(t, by[5], "survivors_gone_ms", within(0.001, float64(drill.RankExitTarget.Milliseconds())))
	figure(t, by[5], "lost_streams", eq(0))
	figure(t, by[5], "removed_ms", within(0, float64(drill.RemovalTarget.Milliseconds())))
	figure(t, by[3], "prefill_failures", within(1, 100))
	figure(t, by[3], "leaked_slots", eq(0))
	for _, k := range []string{"leaked_slots", "leaked_leases", "leaked_pulls", "leaked_in_flight"} {
		figure(t, by[10], k, eq(0))
	}
	figure(t, by[10], "cancelled", within(1, 3))
	figure(t, by[4], "transfers_cut", within(1, 100))
	figure(t, by[4], "transfers_completed", eq(0))
	if len(by[4].Traces) == 0 || len(by[4].Latencies["cut_transfer_ms"]) == 0 {
		t.Errorf("drill 4: no trace of a cut transfer: %d traces", len(by[4].Traces))
	}
	figure(t, by[4], "blocks_committed_by_pulls", eq(0))
	figure(t, by[4], "staged_aborted", within(1, 1e9))
	for _, k := range []string{"leaked_slots", "leaked_leases", "leaked_pulls"} {
		figure(t, by[4], k, eq(0))
	}
	figure(t, by[8], "in_flight_at_outage", within(1, 1e9))
	figure(t, by[8], "kept_through_outage", eq(by[8].Figures["in_flight_at_outage"]))
	figure(t, by[8], "started_during_outage", within(1, 1e9))
	figure(t, by[8], "outage_ms", within(by[8].Figures["lease_ttl_ms"], 1e9))
	figure(t, by[8], "etcd_members", eq(3))
	figure(t, by[8], "leader_election_ms", within(0.001, 30000))
	figure(t, by[8], "leader_kill_streams", within(1, 1e9))
	figure(t, by[8], "leader_kill_migrations", eq(0))
	figure(t, by[8], "leader_kill_generations_bumped", eq(0))
	figure(t, by[6], "reached_isolated_worker", eq(0))
	figure(t, by[6], "routed_to_not_ready", eq(0))
	figure(t, by[6], "streams_while_isolated", within(1, 1e9))
	// Lease expiry, not detection (which removes in ~25 ms): at least half
	// the TTL (the last renewal came up to a third of it and more before
	// the freeze; 1,954 ms was seen with a 3 s TTL).
	figure(t, by[6], "deregistered_ms", within(by[6].Figures["lease_ttl_ms"]/2, by[6].Figures["lease_ttl_ms"]+5000))
	figure(t, by[6], "lease_ttl_ms", within(1000, 1e9))
	// As root (CI) the node is cut off for real: its link down in its own
	// network namespace; the streams it served move elsewhere.
	if netns.Available() == nil {
		figure(t, by[6], "partitioned", eq(1))
		figure(t, by[6], "moved_off_cut_node", within(1, 1e9))
	} else if os.Getenv("LIFELINE_CI") != "" {
		t.Errorf("CI runs as root with iproute2, drill 6 must cut a link: %v", netns.Available())
	}
	figure(t, by[7], "reused_positions_warm", within(1, 1e9))
	figure(t, by[7], "reused_positions_paused", eq(0))
	figure(t, by[7], "reused_positions_after", within(1, 1e9))
	figure(t, by[7], "checksum_failures", eq(0))
	figure(t, by[7], "leaked_slots", eq(0))
	figure(t, by[7], "leaked_leases", eq(0))
	figure(t, by[11], "nodes_drained", eq(2))
	figure(t, by[11], "max_unavailable", eq(1))
	figure(t, by[11], "routed_after_not_ready", eq(0))
	burst(t, by[9])
}

// burst asserts drill 9: the queues held (exactly the capacity served,
// the rest refused before any 200, nothing cut after its 200) and retries
// did not amplify. Its throughput and latency ratios (goodput ≥ 90 % of
// capacity, interactive TTFT p99 ≤ 2× under a batch flood) compare two
// runs a few seconds apart on the CPUs the other packages' tests share
// under `go test ./...`: they decide the verdict in the load tier
// (LIFELINE_LOAD_TESTS=1); otherwise a fail must be theirs alone. The
// same bounds are asserted on a single worker by the frontend's
// TestBatchFloodLeavesInteractiveAlone (≤ 10× always, 2× in the load tier)
// and TestBurstDoesNotAmplify.
func burst(t *testing.T, r drill.Report) {
	t.Helper()
	if r.Result != drill.Pass {
		ratiosOnly := r.Result == drill.Fail
		for _, f := range strings.Split(r.Detail, "; ") {
			ratiosOnly = ratiosOnly && (strings.HasPrefix(f, "goodput ") || strings.HasPrefix(f, "interactive TTFT p99 "))
		}
		if !ratiosOnly || os.Getenv("LIFELINE_LOAD_TESTS") != "" {
			t.Errorf("drill 9 %s: %s: %s", r.Name, r.Result, r.Detail)
		} else {
			t.Logf("drill 9 failed on its ratios only, on a shared machine: %s", r.Detail)
		}
	}
	c := r.Figures["capacity"]
	figure(t, r, "capacity", within(1, 1e9))
	figure(t, r, "offered", eq(3*c))
	figure(t, r, "served", eq(c))
	figure(t, r, "refused", eq(2*c))
	figure(t, r, "failed", eq(0))
	figure(t, r, "retry_amplification", within(1, 1.1))
	figure(t, r, "goodput_ratio", within(0.01, 1e9))
	figure(t, r, "interactive_slowdown", within(0.01, 1e9))
	if len(r.Timeline) < 8 || len(r.Latencies["ttft_ms"]) != int(c) {
		t.Errorf("drill 9: timeline %v, %d TTFT samples", r.Timeline, len(r.Latencies["ttft_ms"]))
	}
}

// TestAgainstExistingCluster acts on a running cluster only through its
// frontend, its agents' sockets and the certificates (no etcd): drill 1
// judges routing from the agents' view and passes; a drill whose shape
// the named part of the cluster lacks is not_available with why.
func TestAgainstExistingCluster(t *testing.T) {
	t.Parallel()
	bin := proctest.Lifeline(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := drill.StartLocal(ctx, drill.Standard, localOptions(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ds, err := drill.Select([]string{"1", "kill-generating-decode"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	run := func(sockets []string) []drill.Report {
		rs, err := drill.Run(ctx, drill.Options{Drills: ds, Config: shortConfig,
			Against: drill.AgainstOptions{URLs: c.URLs, MetricsURLs: c.MetricsURLs, Sockets: sockets, Certs: c.Certs}}, &out)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	rs := run(c.Sockets)
	if rs[0].Result != drill.Pass || rs[0].Figures["reached_dead_worker"] != 0 {
		t.Errorf("drill 1 against the cluster: %s: %s %v\n%s", rs[0].Result, rs[0].Detail, rs[0].Figures, out.String())
	}
	rs = run(c.Sockets[:1])
	if rs[1].Result != drill.NotAvailable || !strings.Contains(rs[1].Detail, "needs 2 nodes") {
		t.Errorf("drill 2 against one node: %s: %s", rs[1].Result, rs[1].Detail)
	}
}

func TestSelect(t *testing.T) {
	t.Parallel()
	ds, err := drill.Select([]string{"11", "kill-prefill", "2", "11"})
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, d := range ds {
		got = append(got, d.Number)
	}
	if len(got) != 3 || got[0] != 2 || got[1] != 3 || got[2] != 11 {
		t.Fatalf("selected %v, want [2 3 11]", got)
	}
	var unknown *drill.ErrUnknownDrill
	if _, err := drill.Select([]string{"12"}); !errors.As(err, &unknown) || unknown.Name != "12" {
		t.Fatalf("Select(12): %v", err)
	}
	if all, _ := drill.Select(nil); len(all) != 11 {
		t.Fatalf("all: %d drills", len(all))
	}
}

type cond struct {
	ok   func(float64) bool
	what string
}

func eq(v float64) cond {
	return cond{func(x float64) bool { return x == v }, "== " + drill.FormatFigure(v)}
}

func within(lo, hi float64) cond {
	return cond{func(x float64) bool { return x >= lo && x <= hi }, "in [" + drill.FormatFigure(lo) + ", " + drill.FormatFigure(hi) + "]"}
}

func figure(t *testing.T, r drill.Report, name string, c cond) {
	t.Helper()
	v, ok := r.Figures[name]
	if !ok || !c.ok(v) {
		t.Errorf("drill %d %s: figure %s = %v (present %v), want %s", r.Number, r.Name, name, v, ok, c.what)
	}
}

// TestSoakShort is `lifeline drill soak` in brief: 2 nodes, 4 streams,
// a fault every 2 s for 30 s, every kind in turn: decode and prefill
// worker, agent, frontend and etcd leader SIGKILLs, a SIGSTOP held past
// the frontends' stall timeout, a drain. Nothing may be lost, duplicated
// or leaked, and every stream is bit-identical.
func TestSoakShort(t *testing.T) {
	t.Parallel()
	bin := proctest.Lifeline(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := drill.Soak(ctx, drill.SoakOptions{Duration: 30 * time.Second, KillEvery: 2 * time.Second, StopFor: 11 * time.Second,
		Nodes: 2, Config: drill.Config{Streams: 4, MaxTokens: 32, Seed: 3},
		Local: localOptions(t, bin)}, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if r.Result != drill.Pass {
		t.Errorf("soak: %s: %s", r.Result, r.Detail)
	}
	for _, k := range drill.SoakFaults {
		figure(t, r, "faults_"+strings.ReplaceAll(k, "-", "_"), within(1, 15))
	}
	for _, k := range []string{"failed", "gaps", "duplicates", "leaked_slots", "leaked_leases", "leaked_pulls", "leaked_in_flight", "leaked_processes", "leaked_segments"} {
		figure(t, r, k, eq(0))
	}
	figure(t, r, "identical", eq(1))
	figure(t, r, "leaked_goroutines", within(-1e9, 0))
	figure(t, r, "leaked_fds", within(-1e9, 0))
	figure(t, r, "rss_growth", within(0.01, drill.MaxRSSGrowth))
}
