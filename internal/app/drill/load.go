package drill

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/client"
)

// LoadSpec says what streams a Load runs. Stream i always sends the same
// request (prompt i, seed Seed+i), so a fault-free reference of it can be
// compared token by token with any run of it.
type LoadSpec struct {
	// Streams is how many streams run at once.
	Streams int
	// MaxTokens is each stream's length (EOS ignored: every complete
	// stream has exactly MaxTokens tokens).
	MaxTokens int
	// PromptWords lengthens each prompt by about this many words (a long
	// prefill); 0: a short prompt.
	PromptWords int
	Seed        uint64
	// Tag makes the prompts distinct from other loads' (no shared KV
	// prefixes between drills).
	Tag string
}

// Tok is one token a stream received, stamped on arrival.
type Tok struct {
	Seq      int
	ID       int
	Text     string
	Instance string
	At       time.Time
}

// Stream is one run of request Index.
type Stream struct {
	Index   int
	Tokens  []Tok
	Result  client.Result
	Err     error
	Started time.Time
	Ended   time.Time
	// Cancelled is set when the drill cancelled it (a client that left).
	Cancelled bool

	mu     sync.Mutex
	runCtx context.Context
	cancel context.CancelFunc
}

// Cancel makes the stream's client leave (its context ends).
func (s *Stream) Cancel() {
	s.mu.Lock()
	s.Cancelled = true
	s.mu.Unlock()
	s.cancel()
}

// ErrType names how a stream failed: a frontend's typed error, cancelled
// (the drill left), or transport; "" when it completed.
func (s *Stream) ErrType() string {
	var typed *client.Error
	switch {
	case s.Err == nil:
		return ""
	case errors.As(s.Err, &typed):
		return typed.Type
	case s.Cancelled || errors.Is(s.Err, context.Canceled):
		return "cancelled"
	case strings.Contains(s.Err.Error(), "sequence gap"):
		return "sequence_gap"
	}
	return "transport"
}

// Load runs seeded streams through the frontends' Go client (resumable,
// de-duplicated, failing over between frontends).
type Load struct {
	c    *Cluster
	spec LoadSpec
	cli  *client.Client
	// OnToken, when set, is called for every token of every stream as it
	// arrives (before the stream goes on): drills inject faults from it.
	OnToken func(s *Stream, t Tok)
	// OnStart, when set, is called as each stream starts (before its
	// request is sent); OnEnd as it ends.
	OnStart func(s *Stream)
	OnEnd   func(s *Stream)

	refs [][]Tok
}

// NewLoad returns a load of spec on c.
func NewLoad(c *Cluster, spec LoadSpec) *Load {
	if spec.Streams < 1 {
		spec.Streams = 1
	}
	if spec.MaxTokens < 2 {
		spec.MaxTokens = 2
	}
	return &Load{c: c, spec: spec, cli: client.New(c.URLs...)}
}

// Close releases the load's connections.
func (l *Load) Close() { l.cli.Close() }

// Spec is the load's spec.
func (l *Load) Spec() LoadSpec { return l.spec }

// Request is stream i's request.
func (l *Load) Request(i int) client.Request {
	temp, topP := 0.9, 1.0
	var b strings.Builder
	fmt.Fprintf(&b, "Drill %s, stream %d: once upon a time, in a small town by the river,", l.spec.Tag, i)
	for w := 0; w < l.spec.PromptWords; w += 16 {
		b.WriteString(" the river ran past the old mill and the children watched the boats go by,")
	}
	return client.Request{Model: l.c.Model, Prompt: b.String(), MaxTokens: l.spec.MaxTokens, Temperature: &temp, TopP: &topP,
		Seed: l.spec.Seed + uint64(i), IgnoreEOS: true}
}

// Reference runs every stream once, without OnToken, and keeps its
// tokens as the reference every later run is compared with. Call it
// before the fault (or after, when a fault-free run first would leave the
// prompts cached and change the path the drill exercises).
func (l *Load) Reference(ctx context.Context) error {
	onToken, onStart, onEnd := l.OnToken, l.OnStart, l.OnEnd
	l.OnToken, l.OnStart, l.OnEnd = nil, nil, nil
	defer func() { l.OnToken, l.OnStart, l.OnEnd = onToken, onStart, onEnd }()
	l.refs = make([][]Tok, l.spec.Streams)
	for _, s := range l.Run(ctx) {
		if s.Err != nil {
			return fmt.Errorf("drill: fault-free run of stream %d: %w", s.Index, s.Err)
		}
		l.refs[s.Index] = s.Tokens
	}
	return nil
}

// Run runs every stream once, concurrently, and returns them when all
// ended.
func (l *Load) Run(ctx context.Context) []*Stream {
	out := make([]*Stream, l.spec.Streams)
	var wg sync.WaitGroup
	for i := range out {
		out[i] = l.newStream(ctx, i)
		wg.Go(func() { l.run(out[i]) })
	}
	wg.Wait()
	return out
}

// refusedBackoff is the pause before the next run after one that was
// refused (or not): 10 ms doubling to half a second, none after a run
// that got tokens.
func refusedBackoff(prev time.Duration, refused bool) time.Duration {
	if !refused {
		return 0
	}
	return min(max(2*prev, 10*time.Millisecond), 500*time.Millisecond)
}

// Steady keeps every stream running, each starting again as soon as it
// ends, until stop is called; stop waits for the runs in progress and
// returns every run, in the order they ended.
func (l *Load) Steady(ctx context.Context) (stop func() []*Stream) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu   sync.Mutex
		done []*Stream
		wg   sync.WaitGroup
	)
	for i := 0; i < l.spec.Streams; i++ {
		wg.Go(func() {
			wait := time.Duration(0)
			for ctx.Err() == nil {
				s := l.newStream(context.WithoutCancel(ctx), i)
				l.run(s)
				mu.Lock()
				done = append(done, s)
				mu.Unlock()
				// A run refused at once (no frontend up, a 429) is tried
				// again after a pause that doubles, not in a hot loop.
				if wait = refusedBackoff(wait, s.Err != nil && len(s.Tokens) == 0); wait > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(wait):
					}
				}
			}
		})
	}
	return func() []*Stream {
		cancel()
		wg.Wait()
		return done
	}
}

func (l *Load) newStream(ctx context.Context, i int) *Stream {
	s := &Stream{Index: i}
	ctx, s.cancel = context.WithCancel(ctx)

	s.runCtx, s.Started = ctx, time.Now()
	return s
}

func (l *Load) run(s *Stream) {
	defer s.cancel()
	if l.OnStart != nil {
		l.OnStart(s)
	}
	res, err := l.cli.Stream(s.runCtx, l.Request(s.Index), func(t client.Token) {
		tok := Tok{Seq: t.SequenceNo, ID: t.TokenID, Text: t.Text, Instance: t.Instance, At: time.Now()}
		s.mu.Lock()
		s.Tokens = append(s.Tokens, tok)
		s.mu.Unlock()
		if l.OnToken != nil {
			l.OnToken(s, tok)
		}
	})
	s.mu.Lock()
	s.Result, s.Err, s.Ended = res, err, time.Now()
	s.mu.Unlock()
	if l.OnEnd != nil {
		l.OnEnd(s)
	}
}

// Outcome is a set of streams compared with their references.
type Outcome struct {
	Streams   int
	Completed int
	Cancelled int
	Failed    int
	// Identical counts completed streams equal to their reference token
	// by token (and cancelled ones whose tokens are a prefix of it).
	Identical int
	// Gaps counts sequence numbers skipped (or missing from the end of a
	// completed stream); Duplicates those delivered twice.
	Gaps, Duplicates int
	Migrations       int
	// Errors counts failed streams by error type.
	Errors map[string]int
	// FirstError is one failure, for the detail line; FirstDiff one
	// stream that completed differently from its reference, Diverged
	// every such stream.
	FirstError error
	FirstDiff  string
	Diverged   []*Stream
}

// IdenticalFraction is Identical over the streams that were compared.
func (o Outcome) IdenticalFraction() float64 {
	if o.Streams == 0 {
		return 0
	}
	return float64(o.Identical) / float64(o.Streams)
}

// Compare checks streams against the references (Reference must have
// run).
func (l *Load) Compare(streams []*Stream) Outcome {
	o := Outcome{Streams: len(streams), Errors: map[string]int{}}
	for _, s := range streams {
		o.Migrations += s.Result.Migrations
		gaps, dups := seqFaults(s.Tokens)
		o.Gaps, o.Duplicates = o.Gaps+gaps, o.Duplicates+dups
		var ref []Tok
		if s.Index < len(l.refs) {
			ref = l.refs[s.Index]
		}
		switch t := s.ErrType(); {
		case t == "cancelled" && s.Cancelled:
			o.Cancelled++
			if samePrefix(s.Tokens, ref) {
				o.Identical++
			}
			continue
		case t != "":
			o.Failed++
			o.Errors[t]++
			if o.FirstError == nil {
				o.FirstError = fmt.Errorf("stream %d: %w", s.Index, s.Err)
			}
			if t == "sequence_gap" {
				o.Gaps++
			}
			continue
		}
		o.Completed++
		if len(s.Tokens) < len(ref) {
			o.Gaps += len(ref) - len(s.Tokens)
		}
		if len(s.Tokens) == len(ref) && samePrefix(s.Tokens, ref) {
			o.Identical++
		} else {
			o.Diverged = append(o.Diverged, s)
			if o.FirstDiff == "" {
				o.FirstDiff = diff(s, ref)
			}
		}
	}
	return o
}

// diff says where a completed stream left its reference.
func diff(s *Stream, ref []Tok) string {
	for i, t := range s.Tokens {
		if i >= len(ref) {
			return fmt.Sprintf("stream %d: %d tokens, its reference %d", s.Index, len(s.Tokens), len(ref))
		}
		if t.Seq != i+1 || t.ID != ref[i].ID || t.Text != ref[i].Text {
			return fmt.Sprintf("stream %d, request %s (%d migrations, %d positions reused): token %d is %d %q from %s, its reference's %d %q from %s",
				s.Index, s.Result.RequestID, s.Result.Migrations, s.Result.KVReusedPositions, i+1, t.ID, t.Text, t.Instance, ref[i].ID, ref[i].Text, ref[i].Instance)
		}
	}
	return fmt.Sprintf("stream %d: %d tokens, its reference %d", s.Index, len(s.Tokens), len(ref))
}

// seqFaults counts skipped and repeated sequence numbers.
func seqFaults(toks []Tok) (gaps, dups int) {
	last := 0
	for _, t := range toks {
		switch {
		case t.Seq <= last:
			dups++
		case t.Seq > last+1:
			gaps += t.Seq - last - 1
		}
		last = max(last, t.Seq)
	}
	return gaps, dups
}

// samePrefix: got is ref's beginning, token id and text alike.
func samePrefix(got, ref []Tok) bool {
	if len(got) > len(ref) {
		return false
	}
	for i, t := range got {
		if t.Seq != i+1 || t.ID != ref[i].ID || t.Text != ref[i].Text {
			return false
		}
	}
	return true
}

// Recoveries are, for every stream whose token before at came from
// instance, the time from at to its next token (ms): a kill's RTO per
// request. Streams that never got a token after at are counted in lost.
func Recoveries(streams []*Stream, instance string, at time.Time) (rto []float64, lost int) {
	for _, s := range streams {
		var before *Tok
		var after *Tok
		for i := range s.Tokens {
			t := &s.Tokens[i]
			if t.At.Before(at) {
				before = t
			} else if after == nil {
				after = t
			}
		}
		if before == nil || before.Instance != instance {
			continue
		}
		if after == nil {
			if s.Err != nil {
				lost++
			}
			continue
		}
		rto = append(rto, ms(after.At.Sub(at)))
	}
	return rto, lost
}

// Percentile is the p-th percentile (nearest rank) of v; 0 when empty.
func Percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Latencies records each stream's time to first token and duration.
func Latencies(r *Recorder, streams []*Stream) {
	for _, s := range streams {
		if len(s.Tokens) > 0 {
			r.Sample("ttft_ms", ms(s.Tokens[0].At.Sub(s.Started)))
		}
		if s.Err == nil {
			r.Sample("stream_ms", ms(s.Ended.Sub(s.Started)))
		}
	}
}

// Rounds counts, once Mark gave it a time, the streams of a load started
// after it that ended: Enough is closed when a load's worth did (every
// stream ran once since the mark). It holds the load's OnEnd.
type Rounds struct {
	enough chan struct{}
	want   int

	mu    sync.Mutex
	since time.Time
	n     int
}

// CountRounds installs l.OnEnd to count rounds.
func (l *Load) CountRounds() *Rounds {
	rd := &Rounds{enough: make(chan struct{}), want: l.spec.Streams}
	l.OnEnd = func(s *Stream) {
		rd.mu.Lock()
		defer rd.mu.Unlock()
		if !rd.since.IsZero() && s.Started.After(rd.since) {
			if rd.n++; rd.n == rd.want {
				close(rd.enough)
			}
		}
	}
	return rd
}

// Mark starts the count at t.
func (rd *Rounds) Mark(t time.Time) {
	rd.mu.Lock()
	rd.since = t
	rd.mu.Unlock()
}

// Enough is closed once a load's worth of streams started after the mark
// ended.
func (rd *Rounds) Enough() <-chan struct{} { return rd.enough }

// FirstToken installs l.OnToken to close the returned channel at the
// first token that serves reports about.
func (l *Load) FirstToken(serves func(Tok) bool) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	l.OnToken = func(_ *Stream, t Tok) {
		if serves(t) {
			once.Do(func() { close(ch) })
		}
	}
	return ch
}
