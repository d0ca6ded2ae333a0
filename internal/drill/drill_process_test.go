package drill_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/drill"
	"github.com/lifeline-llm/lifeline/internal/proctest"
)

func TestMain(m *testing.M) { proctest.Main(m) }

// shortConfig is a short pass: a few streams of few tokens.
var shortConfig = drill.Config{Streams: 3, MaxTokens: 24, Seed: 7}

// TestShortPass runs every drill on a local cluster it starts (one, as
// the implemented drills share a shape) with a small load, and asserts
// each drill's outcome and its key figures.
func TestShortPass(t *testing.T) {
	bin := proctest.Lifeline(t)
	ds, err := drill.Select([]string{"all"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reports, err := drill.Run(ctx, drill.Options{Drills: ds, Config: shortConfig,
		Local: drill.LocalOptions{Dir: t.TempDir(), Binary: bin, Preset: "small"}}, &out)
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
	for _, n := range []int{1, 2, 3, 10, 11} {
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
	figure(t, by[3], "prefill_failures", within(1, 100))
	figure(t, by[3], "leaked_slots", eq(0))
	for _, k := range []string{"leaked_slots", "leaked_leases", "leaked_pulls", "leaked_in_flight"} {
		figure(t, by[10], k, eq(0))
	}
	figure(t, by[10], "cancelled", within(1, 3))
	figure(t, by[11], "nodes_drained", eq(2))
	figure(t, by[11], "max_unavailable", eq(1))
	figure(t, by[11], "routed_after_not_ready", eq(0))
	if r := by[5]; r.Result != drill.NotAvailable || !strings.Contains(r.Detail, "tensor-parallel") {
		t.Errorf("drill 5: %s: %s", r.Result, r.Detail)
	}
	for _, n := range []int{4, 6, 7, 8, 9} {
		if r := by[n]; r.Result != drill.NotAvailable || r.Detail != "not implemented yet" {
			t.Errorf("drill %d: %s: %s", n, r.Result, r.Detail)
		}
	}
}

// TestAgainstExistingCluster acts on a running cluster only through its
// frontend, its agents' sockets and the certificates (no etcd): drill 1
// judges routing from the agents' view and passes; a drill whose shape
// the named part of the cluster lacks is not_available with why.
func TestAgainstExistingCluster(t *testing.T) {
	bin := proctest.Lifeline(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := drill.StartLocal(ctx, drill.Standard, drill.LocalOptions{Dir: t.TempDir(), Binary: bin, Preset: "small"})
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
