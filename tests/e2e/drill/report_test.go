package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/app/drill"
	"github.com/lifeline-llm/lifeline/internal/tracing"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// t0 is the sample trace's start.
var t0 = time.Unix(1700000000, 0)

// sampleDoc is a report of every outcome, with timelines, samples and a
// trace.
func sampleDoc() drill.Document {
	return drill.Document{Generated: time.Unix(1700000000, 0), Cluster: "test", Drills: []drill.Report{
		{Number: 2, Name: "kill-generating-decode", Result: drill.Pass, Detail: "3 streams recovered <b>fine</b>",
			Figures: map[string]float64{"rto_p50_ms": 39.2, "gaps": 0, "identical": 1},
			Timeline: []drill.Event{{AtMs: 0, Kind: drill.EvLoadStart}, {AtMs: 120, Kind: drill.EvFault, Detail: "SIGKILL"},
				{AtMs: 121, Kind: drill.EvDetected}, {AtMs: 160, Kind: drill.EvRecovered}, {AtMs: 900, Kind: drill.EvEnd}},
			Latencies: map[string][]float64{"rto_ms": {39, 40, 41}, "ttft_ms": {10, 12, 30, 55, 11}},
			Traces: [][]tracing.Span{{
				{Name: "lifeline.request", Start: t0, End: t0.Add(900 * time.Millisecond), Attrs: map[string]string{"request_id": "cmpl-7"}},
				{Name: "lifeline.decode", Start: t0.Add(5 * time.Millisecond), End: t0.Add(120 * time.Millisecond), Attrs: map[string]string{"instance_id": "n1-decode-small-0"}, Error: "stream broke"},
				{Name: "lifeline.migration", Start: t0.Add(121 * time.Millisecond), End: t0.Add(160 * time.Millisecond),
					Events: []tracing.Event{{Name: "failure_detected", At: t0.Add(121 * time.Millisecond)}, {Name: "first_token", At: t0.Add(160 * time.Millisecond)}}},
				{Name: "lifeline.decode", Start: t0.Add(125 * time.Millisecond), End: t0.Add(900 * time.Millisecond), Attrs: map[string]string{"instance_id": "n2-decode-small-0"}},
			}}},
		{Number: 3, Name: "kill-prefill", Result: drill.Fail, Detail: "1 of 3 streams bit-identical",
			Figures: map[string]float64{"prefill_failures": 1}, Timeline: []drill.Event{{AtMs: 5, Kind: drill.EvFault}}},
		{Number: 5, Name: "kill-tp-rank", Result: drill.NotAvailable, Detail: "tensor-parallel groups do not exist yet", Figures: map[string]float64{}},
	}}
}

// TestReportJSON: report.json has the drills with number, name, result
// and figures.
func TestReportJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := drill.WriteReport(dir, sampleDoc()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Drills []struct {
			Number  int
			Name    string
			Result  string
			Figures map[string]float64
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Drills) != 3 || doc.Drills[0].Number != 2 || doc.Drills[0].Result != "pass" || doc.Drills[0].Figures["rto_p50_ms"] != 39.2 ||
		doc.Drills[2].Result != "not_available" {
		t.Fatalf("report.json: %s", b)
	}
}

// TestReportHTMLInChromium loads report.html in Debian's headless
// chromium and checks the rendered DOM: every drill's name, its result, an
// <svg> timeline and histograms, the detail escaped, and nothing fetched
// from elsewhere. It skips only where chromium is not installed (CI
// installs it, and sets LIFELINE_CI, which makes its absence a failure).
func TestReportHTMLInChromium(t *testing.T) {
	proctest.Processes(t) // chromium is a process, seconds to start
	t.Parallel()
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatal("chromium is missing in CI: report.html is not checked in a browser")
		}
		t.Skip("chromium is not installed on this machine")
	}
	dir := t.TempDir()
	doc := sampleDoc()
	if err := drill.WriteReport(dir, doc); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "report.html"))
	for _, bad := range []string{"<script", "http://", "https://", "@import", "url("} {
		if strings.Contains(string(raw), bad) {
			t.Errorf("report.html is not self-contained: it contains %q", bad)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--dump-dom", "file://"+filepath.Join(dir, "report.html"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	dom := string(out)
	for _, r := range doc.Drills {
		if !strings.Contains(dom, r.Name) || !strings.Contains(dom, `id="drill-`) {
			t.Errorf("the rendered page lacks drill %d %s", r.Number, r.Name)
		}
	}
	for _, want := range []string{`class="card pass"`, `class="card fail"`, `class="card not_available"`, "<svg", `class="timeline"`,
		`class="histogram"`, "rto_ms", "&lt;b&gt;fine&lt;/b&gt;", "1 pass", "1 fail", "1 not available",
		`class="trace"`, `class="span err"`, "decode n1-decode-small-0", "failure_detected", "first_token", "stream broke",
		"100%" /* identical: every stream, not a count of 1 */} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if n := strings.Count(dom, "<svg"); n != 5 { // drill 2: timeline + 2 histograms + a trace; drill 3: timeline
		t.Errorf("%d <svg> elements rendered, want 5", n)
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}
	// The page fits the window at 1280 and 800 px, charts included (they
	// scale down): measured by a copy of it with a script that writes
	// the document's scroll width into the DOM, and kept as screenshots.
	for _, width := range []int{1280, 800} {
		probe := filepath.Join(dir, fmt.Sprintf("probe-%d.html", width))
		html := strings.Replace(string(raw), "</body>", "<script>document.body.dataset.sw=document.documentElement.scrollWidth</script></body>", 1)
		os.WriteFile(probe, []byte(html), 0o644)
		size := fmt.Sprintf("--window-size=%d,1000", width)
		args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir=" + filepath.Join(dir, "profile"), size}
		out, err := exec.CommandContext(ctx, browser, append(args, "--dump-dom", "file://"+probe)...).Output()
		m := regexp.MustCompile(`data-sw="(\d+)"`).FindSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("chromium at %d px: %v (no scroll width in the DOM)", width, err)
		}
		if sw, _ := strconv.Atoi(string(m[1])); sw > width {
			t.Errorf("at %d px the page is %d px wide: it overflows", width, sw)
		}
		shot := filepath.Join(dir, fmt.Sprintf("report-%d.png", width))
		if err := exec.CommandContext(ctx, browser, append(args, "--screenshot="+shot, "file://"+filepath.Join(dir, "report.html"))...).Run(); err != nil {
			t.Errorf("screenshot at %d px: %v", width, err)
		} else if st, err := os.Stat(shot); err != nil || st.Size() < 10<<10 {
			t.Errorf("screenshot at %d px: %v (%v)", width, err, st)
		}
	}
}
