package drill

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/internal/tracing"
)

// Document is report.json.
type Document struct {
	Generated time.Time `json:"generated"`
	// Cluster says what the drills ran on.
	Cluster string   `json:"cluster"`
	Drills  []Report `json:"drills"`
}

// WriteReport writes report.json and report.html into dir.
func WriteReport(dir string, doc Document) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.html"))
	if err != nil {
		return err
	}
	if err := RenderHTML(f, doc); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Summary writes the drills as a Markdown table: one row per drill, its
// result and key figures.
func Summary(w io.Writer, rs []Report) {
	fmt.Fprintln(w, "| # | drill | result | key figures | detail |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, r := range rs {
		var fs []string
		for _, k := range keyFigures {
			if v, ok := r.Figures[k]; ok {
				fs = append(fs, fmt.Sprintf("%s %s", k, FigureText(k, v)))
			}
		}
		fmt.Fprintf(w, "| %d | %s | **%s** | %s | %s |\n", r.Number, r.Name, r.Result, strings.Join(fs, ", "), r.Detail)
	}
}

// keyFigures are shown in summaries, in this order, when a drill has
// them.
var keyFigures = []string{"detection_ms", "removed_ms", "rto_p50_ms", "rto_p99_ms", "gaps", "duplicates", "identical",
	"failed", "leaked_slots", "leaked_leases", "leaked_pulls", "leaked_in_flight", "max_unavailable", "reached_dead_worker",
	"prefill_failures", "retry_amplification", "goodput_ratio", "interactive_slowdown"}

// RenderHTML writes a self-contained page: a card per drill with its
// verdict, figures, a timeline and latency histograms, all inline SVG and
// CSS.
func RenderHTML(w io.Writer, doc Document) error {
	type card struct {
		Report
		Keys      []string
		Figs      map[string]string
		Timeline  template.HTML
		Histogram []template.HTML
		Traces    []template.HTML
	}
	var cards []card
	counts := map[Result]int{}
	for _, r := range doc.Drills {
		counts[r.Result]++
		c := card{Report: r, Keys: sortedKeys(r.Figures), Figs: map[string]string{}, Timeline: timelineSVG(r)}
		for k, v := range r.Figures {
			c.Figs[k] = FigureText(k, v)
		}
		for _, name := range sortedKeys(r.Latencies) {
			c.Histogram = append(c.Histogram, histogramSVG(name, r.Latencies[name]))
		}
		for _, t := range r.Traces {
			c.Traces = append(c.Traces, traceSVG(t))
		}
		cards = append(cards, c)
	}
	return page.Execute(w, map[string]any{"Doc": doc, "Cards": cards, "Pass": counts[Pass], "Fail": counts[Fail], "NA": counts[NotAvailable],
		"When": doc.Generated.Format(time.RFC1123)})
}

// eventColors draw event kinds apart on a timeline.
var eventColors = map[string]string{EvLoadStart: "#64748b", EvFault: "#dc2626", EvDetected: "#f59e0b", EvRemoved: "#d97706",
	EvRecovered: "#16a34a", EvPhase: "#2563eb", EvLoadEnd: "#64748b", EvEnd: "#0f172a"}

// timelineSVG draws a drill's events on a time axis, one lane per kind.
func timelineSVG(r Report) template.HTML {
	if len(r.Timeline) == 0 {
		return ""
	}
	const width, left, right, lane = 760.0, 110.0, 40.0, 22.0
	var lanes []string
	laneOf := map[string]int{}
	end := 0.0
	for _, e := range r.Timeline {
		if _, ok := laneOf[e.Kind]; !ok {
			laneOf[e.Kind] = len(lanes)
			lanes = append(lanes, e.Kind)
		}
		end = math.Max(end, e.AtMs)
	}
	end = math.Max(end, 1)
	x := func(t float64) float64 { return left + (width-left-right)*t/end }
	height := lane*float64(len(lanes)) + 36
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="timeline" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="timeline of drill %d">`, width, height, width, height, r.Number)
	for i, k := range lanes {
		y := 14 + lane*float64(i)
		fmt.Fprintf(&b, `<text x="4" y="%.1f" class="lane">%s</text><line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" class="grid"/>`, y+4, k, left, width-right, y, y)
	}
	for _, e := range r.Timeline {
		y := 14 + lane*float64(laneOf[e.Kind])
		color := eventColors[e.Kind]
		if color == "" {
			color = "#7c3aed"
		}
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="5" fill="%s"><title>%.1f ms — %s: %s</title></circle>`,
			x(e.AtMs), y, color, e.AtMs, e.Kind, template.HTMLEscapeString(e.Detail))
	}
	axisY := height - 14
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" class="axis"/>`, left, width-right, axisY-8, axisY-8)
	for i := 0; i <= 4; i++ {
		t := end * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="tick" text-anchor="middle">%s</text>`, x(t), axisY+4, msLabel(t))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// traceSVG draws one request's spans as a waterfall: a bar per span on
// the request's time axis (red when it ended with an error), its events
// as ticks with their names.
func traceSVG(spans []tracing.Span) template.HTML {
	if len(spans) == 0 {
		return ""
	}
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].Start.Before(spans[j].Start) })
	t0, t1 := spans[0].Start, spans[0].End
	for _, s := range spans {
		if s.End.After(t1) {
			t1 = s.End
		}
	}
	total := math.Max(ms(t1.Sub(t0)), 1)
	const width, left, right, row = 760.0, 190.0, 20.0, 46.0
	height := row*float64(len(spans)) + 30
	x := func(t time.Time) float64 { return left + (width-left-right)*ms(t.Sub(t0))/total }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="trace" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="trace of request %s">`,
		width, height, width, height, template.HTMLEscapeString(spans[0].Attrs["request_id"]))
	for i, s := range spans {
		y := 8 + row*float64(i)
		label := strings.TrimPrefix(s.Name, "lifeline.")
		if in := s.Attrs["instance_id"]; in != "" {
			label += " " + in
		}
		class := "span"
		if s.Error != "" {
			class = "span err"
		}
		fmt.Fprintf(&b, `<text x="4" y="%.1f" class="lane">%s</text>`, y+11, template.HTMLEscapeString(label))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="12" class="%s"><title>%s: %s%s</title></rect>`,
			x(s.Start), y+2, math.Max(x(s.End)-x(s.Start), 1.5), class, template.HTMLEscapeString(s.Name), msLabel(ms(s.End.Sub(s.Start))),
			template.HTMLEscapeString(errSuffix(s.Error)))
		// Event names on two staggered lines: a name that would run into
		// the one before it on its line goes to the other, or (both
		// taken) stays in the tick's tooltip only.
		var ends [2]float64
		for _, e := range s.Events {
			at := x(e.At)
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" class="ev"><title>%s</title></line>`,
				at, at, y, y+16, template.HTMLEscapeString(e.Name))
			for line := range ends {
				if at+2 >= ends[line] {
					fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="evn">%s</text>`, at+2, y+26+11*float64(line), template.HTMLEscapeString(e.Name))
					ends[line] = at + 2 + labelWidth(e.Name) + 4
					break
				}
			}
		}
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" class="tick">0</text><text x="%.0f" y="%.0f" class="tick" text-anchor="end">%s</text></svg>`,
		left, height-6, width-right, height-6, msLabel(total))
	return template.HTML(b.String())
}

// labelWidth is about how wide name is in an event label (10 px
// system-ui): for keeping labels apart.
func labelWidth(name string) float64 { return 5.6 * float64(len(name)) }

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " — " + e
}

// histogramSVG draws samples (ms) in up to 12 bins.
func histogramSVG(name string, v []float64) template.HTML {
	if len(v) == 0 {
		return ""
	}
	const width, height, pad = 360.0, 150.0, 28.0
	lo, hi := v[0], v[0]
	for _, s := range v {
		lo, hi = math.Min(lo, s), math.Max(hi, s)
	}
	bins := min(12, max(1, len(v)))
	span := math.Max(hi-lo, 1e-9)
	counts := make([]int, bins)
	top := 0
	for _, s := range v {
		i := min(int((s-lo)/span*float64(bins)), bins-1)
		counts[i]++
		top = max(top, counts[i])
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="histogram" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="%s histogram">`, width, height, width, height, name)
	fmt.Fprintf(&b, `<text x="%.0f" y="14" class="hname">%s — %d samples, p50 %s, p99 %s</text>`, pad, name, len(v), msLabel(Percentile(v, 50)), msLabel(Percentile(v, 99)))
	bw := (width - 2*pad) / float64(bins)
	for i, n := range counts {
		h := (height - 2*pad - 10) * float64(n) / float64(top)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" class="bar"><title>%s – %s: %d</title></rect>`,
			pad+bw*float64(i)+1, height-pad-h, bw-2, h, msLabel(lo+span*float64(i)/float64(bins)), msLabel(lo+span*float64(i+1)/float64(bins)), n)
	}
	// The count axis: 0 at the base, the tallest bin's count at its top.
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" class="axis"/>`, pad, pad, height-pad, pad+10)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" class="tick count" text-anchor="end">%d</text><text x="%.0f" y="%.1f" class="tick count" text-anchor="end">0</text>`,
		pad-3, pad+14, top, pad-3, height-pad)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" class="tick">%s</text><text x="%.0f" y="%.0f" class="tick" text-anchor="end">%s</text></svg>`,
		pad, height-10, msLabel(lo), width-pad, height-10, msLabel(hi))
	return template.HTML(b.String())
}

func msLabel(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2f s", v/1000)
	}
	return fmt.Sprintf("%.1f ms", v)
}
