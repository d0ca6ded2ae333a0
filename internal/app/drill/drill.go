// Package drill is `lifeline drill`: the fault-injection matrix run as a
// command. Each Drill injects one fault (a SIGKILLed worker, clients that
// leave, a rolling drain, …) into a cluster under a steady Load of seeded
// streams whose outputs are compared token by token with fault-free
// references, and returns a Report: pass, fail or not_available, its
// figures (detection ms, RTO percentiles, gaps, duplicates, leaks, …), a
// timeline and latency samples. The cluster is one this package starts
// (StartLocal) or an existing one reached only through its frontends'
// APIs and its agents' control sockets (Connect).
//
// A drill lives in a file of its own, drill_<n>_<name>.go, and registers
// itself from an init function with Register; numbers 1..11 that no file
// registers are reported not_available ("not implemented yet").
package drill

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/internal/tracing"
)

// Result is a drill's outcome.
type Result string

const (
	Pass         Result = "pass"
	Fail         Result = "fail"
	NotAvailable Result = "not_available"
)

// Shape is the cluster a drill needs: a local run starts one of it (drills
// of equal shapes share it), and against an existing cluster a drill
// whose shape the cluster lacks is not_available.
type Shape struct {
	Nodes         int `json:"nodes"`
	DecodePerNode int `json:"decode_per_node"`
	// Prefill is the number of prefill instances, spread over the nodes
	// from the last one backwards.
	Prefill   int `json:"prefill"`
	Frontends int `json:"frontends"`
	// MaxRunning and MaxQueued, when set, are every decode worker's
	// scheduler limits (slots and queue places): a drill that overloads
	// the cluster sizes its burst from them. 0: the workers' defaults.
	MaxRunning int `json:"max_running,omitempty"`
	MaxQueued  int `json:"max_queued,omitempty"`
	// Threads, when set, bounds each decode worker's compute threads
	// (GOMAXPROCS): on a small machine, workers that would each take every
	// CPU slow each other down, as workers on GPUs of their own do not.
	Threads int `json:"threads,omitempty"`
	// LeaseTTL, when set, is every agent's etcd lease TTL (default 3 s in
	// a local cluster): a drill that pauses an agent for less than its
	// lease lengthens it.
	LeaseTTL time.Duration `json:"lease_ttl,omitempty"`
	// CutTransfers, when set, makes the last node's agent stop sending
	// halfway through every KV fetch it serves, for CutFor (its failpoint
	// rdma.source-midway: the blocks stop coming, as over a cut link).
	CutTransfers bool `json:"cut_transfers,omitempty"`
	// CanaryIdle, when set, is how often the agents' canaries look at an
	// idle worker (default an hour: drills kill workers themselves; a soak
	// that stops workers needs them found).
	CanaryIdle time.Duration `json:"canary_idle,omitempty"`
	// EtcdMembers, when set, runs etcd as that many member processes
	// (else one member inside the drill's process).
	EtcdMembers int `json:"etcd_members,omitempty"`
	// NetNS, when set, runs every node in a network namespace of its own
	// on a bridge, where this process may make them (root): drill 6 then
	// cuts a node's link instead of freezing its agent. Without root the
	// nodes share this namespace.
	NetNS bool `json:"netns,omitempty"`
	// TP, above 1, makes every decode instance a tensor-parallel group of
	// TP worker processes.
	TP int `json:"tp,omitempty"`
}

// Capacity is how many requests the shape's decode workers hold at once
// (running and queued), 0 when its limits are the defaults.
func (s Shape) Capacity() int {
	return s.Nodes * s.DecodePerNode * (s.MaxRunning + s.MaxQueued)
}

func (s Shape) String() string {
	out := fmt.Sprintf("%d nodes × %d decode, %d prefill, %d frontend(s)", s.Nodes, s.DecodePerNode, s.Prefill, s.Frontends)
	if s.MaxRunning > 0 || s.MaxQueued > 0 {
		out += fmt.Sprintf(", %d slots + %d queue places per decode worker", s.MaxRunning, s.MaxQueued)
	}
	if s.EtcdMembers > 0 {
		out += fmt.Sprintf(", etcd of %d member processes", s.EtcdMembers)
	}
	if s.NetNS {
		out += ", a network namespace per node"
	}
	if s.TP > 1 {
		out += fmt.Sprintf(", each decode instance %d ranks", s.TP)
	}
	return out
}

// Standard is the shape of the first drills: two nodes, each with a
// decode and a prefill instance, and one frontend. Drills that can run on
// it should use it, so that a local run starts a single cluster.
var Standard = Shape{Nodes: 2, DecodePerNode: 1, Prefill: 2, Frontends: 1, NetNS: true}

// Drill is one entry of the matrix.
type Drill struct {
	Number int
	Name   string
	// Expect is the outcome the drill checks, in a line.
	Expect string
	Shape  Shape
	// LocalOnly, when set, says why the drill cannot act against an
	// existing cluster (it is not_available there).
	LocalOnly string
	// NeedsEtcd, when set, says why the drill needs the cluster's etcd
	// (it is not_available against a cluster given without --etcd).
	NeedsEtcd string
	// Unavailable, when set, says why the drill cannot run at all.
	Unavailable string
	// Run injects the fault under load and reports. It fills r (Number,
	// Name and the timeline's origin are set) and returns an error only
	// when the drill could not be carried out (the cluster did not
	// answer): that is a fail with the error as detail.
	Run func(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error
}

// Config sizes the load every drill runs.
type Config struct {
	// Streams is how many concurrent streams a drill's load runs.
	Streams int
	// MaxTokens is each stream's length.
	MaxTokens int
	// Seed seeds the streams' sampling.
	Seed uint64
}

// DefaultConfig is what `lifeline drill` runs without flags.
func DefaultConfig() Config { return Config{Streams: 8, MaxTokens: 64, Seed: 1} }

// Report is what a drill found.
type Report struct {
	Number int    `json:"number"`
	Name   string `json:"name"`
	Expect string `json:"expect,omitempty"`
	Result Result `json:"result"`
	// Detail says in a line why it passed, failed or could not run.
	Detail  string             `json:"detail"`
	Figures map[string]float64 `json:"figures"`
	// Timeline is what happened, in ms since the drill started.
	Timeline []Event `json:"timeline,omitempty"`
	// Latencies are samples in ms by name (ttft_ms, rto_ms, stream_ms…),
	// drawn as histograms.
	Latencies map[string][]float64 `json:"latencies,omitempty"`
	// Traces are the spans of requests the fault hit, as the frontends
	// traced them (the recovery's steps), grouped by request.
	Traces     [][]tracing.Span `json:"traces,omitempty"`
	DurationMs float64          `json:"duration_ms"`
}

// Event is one point of a drill's timeline.
type Event struct {
	AtMs   float64 `json:"at_ms"`
	Kind   string  `json:"kind"`
	Detail string  `json:"detail,omitempty"`
}

// Event kinds the timeline draws apart.
const (
	EvLoadStart = "load_start"
	EvFault     = "fault"
	EvDetected  = "detected"
	EvRemoved   = "removed"
	EvRecovered = "recovered"
	EvPhase     = "phase"
	EvLoadEnd   = "load_end"
	EvEnd       = "end"
)

// Recorder collects a running drill's report; its methods are safe for
// concurrent use (token callbacks record from the load's goroutines).
type Recorder struct {
	mu    sync.Mutex
	start time.Time
	r     Report
}

func newRecorder(d Drill) *Recorder {
	return &Recorder{start: time.Now(), r: Report{Number: d.Number, Name: d.Name, Expect: d.Expect,
		Figures: map[string]float64{}, Latencies: map[string][]float64{}}}
}

// Start is the timeline's origin.
func (r *Recorder) Start() time.Time { return r.start }

// Ms is t in ms since the drill started.
func (r *Recorder) Ms(t time.Time) float64 { return ms(t.Sub(r.start)) }

// Event adds an event at t.
func (r *Recorder) Event(t time.Time, kind, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.r.Timeline = append(r.r.Timeline, Event{AtMs: r.Ms(t), Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// Figure sets a figure.
func (r *Recorder) Figure(name string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.r.Figures[name] = v
}

// Sample adds latency samples (ms) under name.
func (r *Recorder) Sample(name string, v ...float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.r.Latencies[name] = append(r.r.Latencies[name], v...)
}

// Trace adds one request's spans.
func (r *Recorder) Trace(spans []tracing.Span) {
	if len(spans) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.r.Traces = append(r.r.Traces, spans)
}

// Verdict sets the result and its line.
func (r *Recorder) Verdict(res Result, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.r.Result, r.r.Detail = res, fmt.Sprintf(format, args...)
}

// Check collects a drill's pass conditions: every failed one is named in
// the detail line.
type Check struct{ failed []string }

// That records a condition; what names it when it does not hold.
func (c *Check) That(ok bool, format string, args ...any) {
	if !ok {
		c.failed = append(c.failed, fmt.Sprintf(format, args...))
	}
}

// Verdict sets r's result: pass with passLine, or fail naming what did
// not hold.
func (c *Check) Verdict(r *Recorder, passLine string) {
	if len(c.failed) == 0 {
		r.Verdict(Pass, "%s", passLine)
		return
	}
	r.Verdict(Fail, "%s", strings.Join(c.failed, "; "))
}

func (r *Recorder) report() Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.r
	out.DurationMs = ms(time.Since(r.start))
	sort.SliceStable(out.Timeline, func(i, j int) bool { return out.Timeline[i].AtMs < out.Timeline[j].AtMs })
	return out
}

// seedNames are the matrix's eleven drills, by number: what a number no
// file registers is reported as.
var seedNames = map[int][2]string{
	1:  {"kill-idle-decode", "an idle decode worker killed leaves routing within the target; no new request reaches it"},
	2:  {"kill-generating-decode", "migratable requests recover; no gap or duplicate; outputs bit-identical"},
	3:  {"kill-prefill", "unpublished KV never visible; the prompt is prefilled on another prefill worker"},
	4:  {"cut-kv-transfer", "blocks never ready; retransmit, another source or recompute"},
	5:  {"kill-tp-rank", "the whole tensor-parallel group leaves routing; no collective hangs"},
	6:  {"isolate-worker", "after the lease expires it takes no traffic; it comes back at a new generation"},
	7:  {"pause-kv-owner", "the cache degrades to a miss, never reads an unverified block"},
	8:  {"pause-control-plane", "requests in flight continue; routing uses the last safe snapshot"},
	9:  {"burst-traffic", "bounded queues hold; retries do not amplify"},
	10: {"clients-leave", "cancel reaches prefill, transfer, decode and KV leases; nothing leaks"},
	11: {"rolling-upgrade", "drain first; the disruption budget holds; no failed stream"},
}

var (
	regMu    sync.Mutex
	registry = map[int]Drill{}
)

// Register adds a drill; a number registered twice panics (at init).
func Register(d Drill) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[d.Number]; dup {
		panic(fmt.Sprintf("drill: drill %d registered twice", d.Number))
	}
	registry[d.Number] = d
}

// All is every drill by number: the registered ones and, for the
// matrix's numbers no file registers, a not_available placeholder.
func All() []Drill {
	regMu.Lock()
	defer regMu.Unlock()
	var out []Drill
	for _, d := range registry {
		out = append(out, d)
	}
	for n, nm := range seedNames {
		if _, ok := registry[n]; !ok {
			out = append(out, Drill{Number: n, Name: nm[0], Expect: nm[1], Unavailable: "not implemented yet"})
		}
	}
	slices.SortFunc(out, func(a, b Drill) int { return a.Number - b.Number })
	return out
}

// ErrUnknownDrill is returned by Select for a name that is no drill.
type ErrUnknownDrill struct{ Name string }

func (e *ErrUnknownDrill) Error() string {
	var names []string
	for _, d := range All() {
		names = append(names, fmt.Sprintf("%d/%s", d.Number, d.Name))
	}
	return fmt.Sprintf("drill: unknown drill %q (have all, %s)", e.Name, strings.Join(names, ", "))
}

// Select picks drills by number or name ("all" or none: every drill), in
// number order, each once.
func Select(names []string) ([]Drill, error) {
	all := All()
	if len(names) == 0 || slices.Contains(names, "all") {
		return all, nil
	}
	pick := map[int]bool{}
	for _, n := range names {
		i := slices.IndexFunc(all, func(d Drill) bool { return d.Name == n || strconv.Itoa(d.Number) == n })
		if i < 0 {
			return nil, &ErrUnknownDrill{Name: n}
		}
		pick[all[i].Number] = true
	}
	return slices.DeleteFunc(all, func(d Drill) bool { return !pick[d.Number] }), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
