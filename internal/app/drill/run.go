package drill

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// Options are a run of drills.
type Options struct {
	Drills []Drill
	Config Config
	// Against, when it names frontends, is the existing cluster to act
	// on; otherwise each shape's cluster is started under Local.
	Against AgainstOptions
	Local   LocalOptions
	// Timeout bounds each drill (default 3 min).
	Timeout time.Duration
}

// Run runs the drills in number order, printing each one's result and
// figures to out as it ends, and returns their reports. Locally, drills of
// the same shape share one cluster, started before the first of them and
// stopped after the last.
func Run(ctx context.Context, o Options, out io.Writer) ([]Report, error) {
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	if len(o.Against.URLs) > 0 {
		c, err := Connect(ctx, o.Against)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		var reports []Report
		for _, d := range o.Drills {
			reports = append(reports, runOne(ctx, c, d, o, out))
		}
		return reports, nil
	}
	byNumber := map[int]Report{}
	for _, group := range byShape(o.Drills) {
		runnable := slices.ContainsFunc(group, func(d Drill) bool { return d.Unavailable == "" })
		var c *Cluster
		if runnable {
			var err error
			if c, err = startLocal(ctx, group[0].Shape, o.Local, out); err != nil {
				for _, d := range group {
					byNumber[d.Number] = failed(d, fmt.Sprintf("the local cluster did not start: %v", err))
					printReport(out, byNumber[d.Number])
				}
				continue
			}
		}
		for _, d := range group {
			byNumber[d.Number] = runOne(ctx, c, d, o, out)
		}
		if c != nil {
			fmt.Fprintf(out, "stopping the cluster (%v)…\n", group[0].Shape)
			c.Close()
		}
	}
	var reports []Report
	for _, d := range o.Drills {
		reports = append(reports, byNumber[d.Number])
	}
	return reports, ctx.Err()
}

// byShape groups drills by the shape they need (not_available drills in
// a group of their own, started nothing), each group in number order, the
// groups in the order of their first drill.
func byShape(ds []Drill) [][]Drill {
	idx := map[Shape]int{}
	var groups [][]Drill
	for _, d := range ds {
		key := d.Shape
		if d.Unavailable != "" {
			key = Shape{Nodes: -1}
		}
		i, ok := idx[key]
		if !ok {
			i = len(groups)
			idx[key] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], d)
	}
	sort.SliceStable(groups, func(i, j int) bool { return groups[i][0].Number < groups[j][0].Number })
	return groups
}

// startLocal starts a cluster of shape s in a directory of its own under
// o.Dir (a temporary one when empty).
func startLocal(ctx context.Context, s Shape, o LocalOptions, out io.Writer) (*Cluster, error) {
	dir, err := os.MkdirTemp(o.Dir, "lifeline-drill-")
	if err != nil {
		return nil, err
	}
	o.Dir = dir
	if o.Preset == "" {
		o.Preset = "small"
	}
	fmt.Fprintf(out, "starting a local cluster: %v, preset %s, in %s…\n", s, o.Preset, dir)
	start := time.Now()
	c, err := StartLocal(ctx, s, o)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.closers = append([]func(){func() { os.RemoveAll(dir) }}, c.closers...)
	fmt.Fprintf(out, "cluster up in %v\n", time.Since(start).Round(time.Millisecond))
	return c, nil
}

// runOne runs one drill, unless it cannot run here.
func runOne(ctx context.Context, c *Cluster, d Drill, o Options, out io.Writer) Report {
	rep := func() Report {
		switch {
		case d.Unavailable != "":
			return unavailable(d, d.Unavailable)
		case !c.Local && d.LocalOnly != "":
			return unavailable(d, "against an existing cluster: "+d.LocalOnly)
		case c.Etcd == nil && d.NeedsEtcd != "":
			return unavailable(d, "without --etcd: "+d.NeedsEtcd)
		}
		if !c.Local {
			have, err := c.Shape(ctx)
			if err != nil {
				return failed(d, err.Error())
			}
			if why := have.Lacks(d.Shape); why != "" {
				return unavailable(d, why)
			}
		}
		if err := c.WaitReady(ctx, 2*time.Minute); err != nil {
			return failed(d, err.Error())
		}
		// What an earlier drill left being released (sweepers, cancels)
		// settles first, bounded: a drill's baseline is a quiet cluster.
		if _, err := waitNoOrphans(ctx, c, 30*time.Second); err != nil {
			return failed(d, err.Error())
		}
		dctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		r := newRecorder(d)
		if err := d.Run(dctx, c, o.Config, r); err != nil {
			r.Verdict(Fail, "%v", err)
		}
		r.Event(time.Now(), EvEnd, "")
		rep := r.report()
		if rep.Result == "" {
			rep.Result, rep.Detail = Fail, "the drill gave no verdict"
		}
		return rep
	}()
	printReport(out, rep)
	return rep
}

func unavailable(d Drill, why string) Report {
	return Report{Number: d.Number, Name: d.Name, Expect: d.Expect, Result: NotAvailable, Detail: why, Figures: map[string]float64{}}
}

func failed(d Drill, why string) Report {
	return Report{Number: d.Number, Name: d.Name, Expect: d.Expect, Result: Fail, Detail: why, Figures: map[string]float64{}}
}

// printReport prints a drill's result line and its figures.
func printReport(out io.Writer, r Report) {
	fmt.Fprintf(out, "drill %2d %-24s %-13s %s\n", r.Number, r.Name, strings.ToUpper(string(r.Result)), r.Detail)
	if len(r.Figures) == 0 {
		return
	}
	var parts []string
	for _, k := range sortedKeys(r.Figures) {
		parts = append(parts, fmt.Sprintf("%s=%s", k, FigureText(k, r.Figures[k])))
	}
	fmt.Fprintf(out, "         %s\n", strings.Join(parts, " "))
}

// Failed reports whether any drill failed.
func Failed(rs []Report) bool {
	return slices.ContainsFunc(rs, func(r Report) bool { return r.Result == Fail })
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// FigureText is figure name's value v as a report shows it: a fraction
// of streams (identical) as a percentage, so that a yes for every stream
// does not read as a count of one; anything else by FormatFigure.
func FigureText(name string, v float64) string {
	if name == "identical" {
		return fmt.Sprintf("%.0f%%", v*100)
	}
	return FormatFigure(v)
}

// FormatFigure prints a figure: integers as such, others with two decimals.
func FormatFigure(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.2f", v)
}
