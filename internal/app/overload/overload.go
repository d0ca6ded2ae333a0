// Package overload measures how a Lifeline frontend behaves under a burst
// of streamed requests: which are served and how fast their first token
// comes, which are refused (and whether before any 200), the goodput and
// the retry amplification the frontend reports. It speaks only HTTP to the
// frontend (its API and /metrics), so that a drill (drill 9: a burst of 3×
// capacity, bounded queues hold, retries do not amplify) and process tests
// use the same measurement against any cluster.
package overload

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/internal/debugsock"
)

// Load is one kind of request of a burst.
type Load struct {
	// URL is the frontend's base URL, MetricsURL its metrics listener's
	// (`lifeline frontend --metrics-addr`: the API port serves none);
	// Model and Prompt the request's.
	URL, MetricsURL, Model, Prompt string
	// MaxTokens is each request's output (ignore_eos: exactly this many).
	MaxTokens int
	// Priority is "interactive" ("") or "batch" (the Lifeline-Priority
	// header).
	Priority string
	// Client makes the requests (nil: a client without a timeout).
	Client *http.Client
}

// Result is one streamed request's outcome.
type Result struct {
	// Status is the HTTP status (0: the request did not get one).
	Status int
	// RetryAfter is the Retry-After header of a refusal.
	RetryAfter string
	// ErrType is the error's type: of the body of a refusal, or of an SSE
	// error event after a 200.
	ErrType string
	// TTFT is the time to the first token; Took to the end.
	TTFT, Took time.Duration
	// Tokens counts the tokens received; Done says the stream ended with
	// [DONE].
	Tokens int
	Done   bool
}

// OK reports a served request: 200, every token, a clean end.
func (r Result) OK() bool { return r.Status == http.StatusOK && r.Done && r.ErrType == "" }

// Refused reports a request refused before anything was streamed: 429 or
// 503 with Retry-After.
func (r Result) Refused() bool {
	return (r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable) && r.RetryAfter != ""
}

// Stream makes one streamed request of l with seed and reads it to its end.
func Stream(ctx context.Context, l Load, seed int) Result {
	body, _ := json.Marshal(map[string]any{"model": l.Model, "prompt": l.Prompt, "max_tokens": l.MaxTokens,
		"seed": seed, "stream": true, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.URL+"/v1/completions", strings.NewReader(string(body)))
	if err != nil {
		return Result{ErrType: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if l.Priority != "" {
		req.Header.Set("Lifeline-Priority", l.Priority)
	}
	c := l.Client
	if c == nil {
		c = &http.Client{}
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return Result{ErrType: err.Error(), Took: time.Since(start)}
	}
	defer resp.Body.Close()
	res := Result{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error struct{ Type string } }
		raw, _ := io.ReadAll(resp.Body)
		json.Unmarshal(raw, &e)
		res.ErrType, res.Took = e.Error.Type, time.Since(start)
		return res
	}
	for rd := sse.NewReader(resp.Body); ; {
		ev, err := rd.Next()
		switch {
		case err == io.EOF:
			res.Done = true
		case err != nil:
			res.ErrType = err.Error()
		case ev.Error != nil:
			res.ErrType = ev.Error.Type
		case ev.Chunk != nil && ev.Chunk.Lifeline.SequenceNo > 0:
			if res.Tokens++; res.Tokens == 1 {
				res.TTFT = time.Since(start)
			}
			continue
		default:
			continue
		}
		res.Took = time.Since(start)
		return res
	}
}

// Burst makes n requests of l at once (seeds from seed0) and returns their
// results in order.
func Burst(ctx context.Context, l Load, n, seed0 int) []Result {
	out := make([]Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = Stream(ctx, l, seed0+i)
		}()
	}
	wg.Wait()
	return out
}

// Figures summarise a burst.
type Figures struct {
	Offered, Served, Refused, Failed int
	// Start is when the burst began (set by Measure), Wall its duration;
	// Goodput is served requests per second.
	Start   time.Time
	Wall    time.Duration
	Goodput float64
	// TTFTp50 and TTFTp99 are over the served requests.
	TTFTp50, TTFTp99 time.Duration
	// Amplification is the frontend's worker attempts ÷ requests over the
	// burst (its lifeline_frontend_attempts_total series), NaN-free: 1
	// when nothing was attempted.
	Amplification float64
}

func (f Figures) String() string {
	return fmt.Sprintf("offered %d: served %d, refused %d, failed %d in %v (goodput %.1f/s), TTFT p50 %v p99 %v, amplification %.3f",
		f.Offered, f.Served, f.Refused, f.Failed, f.Wall.Round(time.Millisecond), f.Goodput, f.TTFTp50.Round(time.Millisecond),
		f.TTFTp99.Round(time.Millisecond), f.Amplification)
}

// Summarise computes the figures of results that took wall.
func Summarise(results []Result, wall time.Duration) Figures {
	f := Figures{Offered: len(results), Wall: wall, Amplification: 1}
	var ttft []time.Duration
	for _, r := range results {
		switch {
		case r.OK():
			f.Served++
			ttft = append(ttft, r.TTFT)
		case r.Refused():
			f.Refused++
		default:
			f.Failed++
		}
	}
	if wall > 0 {
		f.Goodput = float64(f.Served) / wall.Seconds()
	}
	f.TTFTp50, f.TTFTp99 = Percentile(ttft, 50), Percentile(ttft, 99)
	return f
}

// Percentile is the p-th percentile (nearest rank) of ds; 0 when empty.
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

// Scrape reads a Prometheus text page (metricsURL + /metrics) into its
// series' values, summed by series (name and labels as printed). A page
// that does not answer 200 is an error.
func Scrape(ctx context.Context, metricsURL string) (map[string]float64, error) {
	if metricsURL == "" {
		return nil, fmt.Errorf("overload: no metrics URL")
	}
	page, err := Get(ctx, metricsURL+"/metrics", 16<<20)
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(page), "\n") {
		i := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] += v
		}
	}
	return m, nil
}

// ScrapeAfterGC collects the garbage of a process (its pprof heap profile
// with gc=1, from its debug socket: debug is its base, debugsock), then
// scrapes its metrics listener: its memory series are what that
// collection left. It collects twice, since what the last scrape left in
// a sync.Pool (the Prometheus handler's gzip writer, about 800 KB)
// survives one collection as the pool's victim, and reads each profile to
// the end, since a handler still writing one (a megabyte of builder and
// gzip state) while the next collection marks would count as live.
func ScrapeAfterGC(ctx context.Context, debug, metricsURL string) (map[string]float64, error) {
	for range 2 {
		if _, err := debugsock.Get(ctx, debug, "/debug/pprof/heap?gc=1", 64<<20); err != nil {
			return nil, fmt.Errorf("overload: %w", err)
		}
	}
	return Scrape(ctx, metricsURL)
}

// Get reads a page of a metrics listener, at most limit bytes of it; any status but 200 is an error.
func Get(ctx context.Context, url string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("overload: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("overload: %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("overload: %s: %w", url, err)
	}
	return body, nil
}

// Attempts reads the frontend's decode worker attempts so far (first
// attempts and further ones, every priority) from its metrics listener.
// Amplification is never taken as 1 unmeasured: a page that cannot be
// read is an error.
func Attempts(ctx context.Context, metricsURL string) (first, retry float64, err error) {
	m, err := Scrape(ctx, metricsURL)
	if err != nil {
		return 0, 0, err
	}
	for series, v := range m {
		switch {
		case !strings.HasPrefix(series, "lifeline_frontend_attempts_total{"):
		case strings.Contains(series, `attempt="first"`):
			first += v
		default:
			retry += v
		}
	}
	return first, retry, nil
}

// Measure makes a burst of n requests of l and returns its figures, with
// the amplification the frontend counted over it.
func Measure(ctx context.Context, l Load, n, seed0 int) (Figures, []Result, error) {
	f0, r0, err := Attempts(ctx, l.MetricsURL)
	if err != nil {
		return Figures{}, nil, err
	}
	start := time.Now()
	results := Burst(ctx, l, n, seed0)
	f := Summarise(results, time.Since(start))
	f.Start = start
	f1, r1, err := Attempts(ctx, l.MetricsURL)
	if err != nil {
		return f, results, err
	}
	switch {
	case f1 > f0:
		f.Amplification = (f1 - f0 + r1 - r0) / (f1 - f0)
	case f.Served > 0:
		return f, results, fmt.Errorf("overload: %d requests served but no worker attempt counted at %s", f.Served, l.MetricsURL)
	}
	return f, results, nil
}

// Verdict is drill 9's judgement of a burst of factor × capacity against
// the capacity measured just before (a burst of capacity requests).
type Verdict struct {
	// Capacity and After are the capacity runs before and after Burst.
	Capacity, Burst, After Figures
	// BurstResults are the burst's requests.
	BurstResults []Result
	// GoodputRatio is Burst.Goodput ÷ the mean goodput of the capacity
	// runs that bracket it (a machine whose load drifts moves both).
	GoodputRatio float64
	// Failures lists what failed: requests that neither finished nor were
	// refused cleanly (a stream cut after its 200), amplification above
	// MaxAmplification, goodput below MinGoodput of capacity.
	Failures []string
}

// The drill's bounds: retries do not amplify, and an overloaded cluster
// still serves what it can.
const (
	MaxAmplification = 1.1
	MinGoodput       = 0.9
)

// Drill measures capacity (capacity requests at once, all expected to be
// served), a burst of factor × capacity, and capacity again, and judges
// the burst. A first capacity run, not measured, warms connections and
// workers up.
func Drill(ctx context.Context, l Load, capacity, factor int) (Verdict, error) {
	var v Verdict
	var err error
	Burst(ctx, l, capacity, -capacity)
	if v.Capacity, _, err = Measure(ctx, l, capacity, 0); err != nil {
		return v, err
	}
	if v.Burst, v.BurstResults, err = Measure(ctx, l, factor*capacity, capacity); err != nil {
		return v, err
	}
	if v.After, _, err = Measure(ctx, l, capacity, (factor+1)*capacity); err != nil {
		return v, err
	}
	if g := (v.Capacity.Goodput + v.After.Goodput) / 2; g > 0 {
		v.GoodputRatio = v.Burst.Goodput / g
	}
	for _, c := range []Figures{v.Capacity, v.After} {
		if c.Served != capacity {
			v.Failures = append(v.Failures, fmt.Sprintf("a capacity run served %d of %d", c.Served, capacity))
		}
	}
	if v.Burst.Failed > 0 {
		v.Failures = append(v.Failures, fmt.Sprintf("%d requests of the burst failed after a 200 or without a clean refusal", v.Burst.Failed))
	}
	if v.Burst.Amplification > MaxAmplification {
		v.Failures = append(v.Failures, fmt.Sprintf("retry amplification %.3f > %.1f", v.Burst.Amplification, MaxAmplification))
	}
	if v.GoodputRatio < MinGoodput {
		v.Failures = append(v.Failures, fmt.Sprintf("goodput %.2f of capacity < %.2f", v.GoodputRatio, MinGoodput))
	}
	return v, nil
}

// MaxInteractiveSlowdown bounds interactive TTFT p99 under a batch flood
// against its unloaded value.
const MaxInteractiveSlowdown = 2.0

// Isolation is how interactive requests fare under a flood of batch ones.
type Isolation struct {
	// Unloaded and Loaded are interactive TTFT p99 before and under the
	// flood; Slowdown is Loaded ÷ Unloaded.
	Unloaded, Loaded time.Duration
	Slowdown         float64
	// Filled is when the flood held the workers.
	Filled time.Time
	// Flood is the flood's requests' figures once they all ended (its
	// Start when it began).
	Flood Figures
	// Failures lists what failed: an interactive request not served, the
	// slowdown above MaxInteractiveSlowdown, a flood request cut after its
	// 200 or not refused cleanly.
	Failures []string
}

// InteractiveUnderFlood measures interactive TTFT p99 over probes
// sequential requests of inter (after as many to warm up), starts flood
// requests of batch at once, waits until filled reports that the flood
// holds the workers (polled every 50 ms for up to 30 s), and measures
// interactive TTFT p99 again while the flood runs.
func InteractiveUnderFlood(ctx context.Context, inter, batch Load, probes, flood int, filled func(context.Context) (bool, error)) (Isolation, error) {
	var v Isolation
	ttfts := func(seed0 int) time.Duration {
		var out []time.Duration
		for i := range probes {
			r := Stream(ctx, inter, seed0+i)
			if !r.OK() {
				v.Failures = append(v.Failures, fmt.Sprintf("interactive request %d: status %d %s", seed0+i, r.Status, r.ErrType))
				continue
			}
			out = append(out, r.TTFT)
		}
		return Percentile(out, 99)
	}
	ttfts(0)
	v.Unloaded = ttfts(100)
	floodStart := time.Now()
	done := make(chan []Result, 1)
	go func() { done <- Burst(ctx, batch, flood, 1000) }()
	wait := time.Now().Add(30 * time.Second)
	for {
		ok, err := filled(ctx)
		if err != nil {
			<-done
			return v, err
		}
		if ok {
			break
		}
		if time.Now().After(wait) {
			<-done
			return v, fmt.Errorf("overload: the batch flood of %d requests never filled the workers", flood)
		}
		select {
		case <-ctx.Done():
			<-done
			return v, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	v.Filled = time.Now()
	v.Loaded = ttfts(200)
	res := <-done
	v.Flood = Summarise(res, time.Since(floodStart))
	v.Flood.Start = floodStart
	if v.Unloaded > 0 {
		v.Slowdown = float64(v.Loaded) / float64(v.Unloaded)
	}
	if v.Slowdown > MaxInteractiveSlowdown {
		v.Failures = append(v.Failures, fmt.Sprintf("interactive TTFT p99 %v under the batch flood, %.2f× the unloaded %v (bound %.1f×)",
			v.Loaded.Round(time.Microsecond), v.Slowdown, v.Unloaded.Round(time.Microsecond), MaxInteractiveSlowdown))
	}
	if v.Flood.Failed > 0 {
		v.Failures = append(v.Failures, fmt.Sprintf("%d batch requests failed after a 200 or without a clean refusal", v.Flood.Failed))
	}
	return v, nil
}
