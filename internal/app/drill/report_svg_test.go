package drill

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/tracing"
)

// TestTraceEventLabelsDoNotOverlap: events a millisecond apart on a
// 100 ms trace get their names on two staggered lines, never one over
// another; a name with no room is kept in its tick's tooltip.
func TestTraceEventLabelsDoNotOverlap(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	s := tracing.Span{Name: "lifeline.decode", Start: t0, End: t0.Add(100 * time.Millisecond), Attrs: map[string]string{"request_id": "r"}}
	names := []string{"failure_detected", "routed", "dispatched", "first_token", "migrated"}
	for i, n := range names {
		s.Events = append(s.Events, tracing.Event{Name: n, At: t0.Add(time.Duration(40+i) * time.Millisecond)})
	}
	svg := string(traceSVG([]tracing.Span{s}))
	type label struct {
		x    float64
		name string
	}
	rows := map[string][]label{}
	for _, m := range regexp.MustCompile(`<text x="([0-9.]+)" y="([0-9.]+)" class="evn">([^<]+)</text>`).FindAllStringSubmatch(svg, -1) {
		x, _ := strconv.ParseFloat(m[1], 64)
		rows[m[2]] = append(rows[m[2]], label{x, m[3]})
	}
	shown := 0
	for y, ls := range rows {
		sort.Slice(ls, func(i, j int) bool { return ls[i].x < ls[j].x })
		for i := 1; i < len(ls); i++ {
			if ls[i].x < ls[i-1].x+labelWidth(ls[i-1].name) {
				t.Errorf("line %s: %q at %.1f runs into %q at %.1f", y, ls[i-1].name, ls[i-1].x, ls[i].name, ls[i].x)
			}
		}
		shown += len(ls)
	}
	if len(rows) != 2 || shown < 2 {
		t.Errorf("%d label lines, %d labels: want two staggered lines", len(rows), shown)
	}
	for _, n := range names {
		if !strings.Contains(svg, "<title>"+n+"</title>") {
			t.Errorf("event %s has no tooltip", n)
		}
	}
}

// TestHistogramHasACountAxis: a histogram says how many samples its
// tallest bin holds, and where 0 is.
func TestHistogramHasACountAxis(t *testing.T) {
	svg := string(histogramSVG("rto_ms", []float64{10, 11, 11, 12, 40}))
	if !strings.Contains(svg, `class="tick count" text-anchor="end">0</text>`) || !regexp.MustCompile(`class="tick count" text-anchor="end">[1-9][0-9]*</text>`).MatchString(svg) {
		t.Fatalf("no count axis: %s", svg)
	}
}
