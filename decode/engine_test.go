package decode

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

func newTinyEngine(t testing.TB) *Engine {
	t.Helper()
	e, err := NewEngine(Options{Preset: "tiny", WeightSeed: 1, Limits: sched.Limits{MaxRunning: 64, MaxQueued: 512, MaxStepTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

type result struct {
	events []Event
	finish Event
}

func collect(t testing.TB, ch <-chan Event) result {
	t.Helper()
	var r result
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return r
			}
			if ev.Done {
				r.finish = ev
				continue
			}
			r.events = append(r.events, ev)
		case <-timeout:
			t.Fatal("stream did not end")
		}
	}
}

func generate(t testing.TB, e *Engine, r Request) result {
	t.Helper()
	ch, err := e.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, ch)
}

var continuationPrompts = []string{
	"Once upon a time",
	"The water was cold and the",
	"流式请求的故障恢复",
	"a",
	"Tell me a story about a dog who found a river near the old mountain road, then went home.",
}

// TestContinuationBitExact is the engine's core promise: for 5 prompts and
// 20 random split points k each, at temperature 0 and 0.9, generating from
// prompt ‖ first k output tokens reproduces the uninterrupted run after k —
// token ids, text chunks and logits bit for bit. All continuations of one
// configuration run concurrently, so they also share batches.
func TestContinuationBitExact(t *testing.T) {
	t.Parallel()
	e := newTinyEngine(t)
	const maxTokens = 48
	rng := rand.New(rand.NewPCG(2026, 11))
	for _, temp := range []float64{0, 0.9} {
		for pi, prompt := range continuationPrompts {
			base := Request{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true, KeepLogits: true,
				Sampling: sample.Params{Temperature: temp, TopP: 0.95, TopK: 50, FrequencyPenalty: 0.2, Seed: uint64(1000 + pi)}}
			full := generate(t, e, base)
			if len(full.events) != maxTokens || full.finish.FinishReason != sched.FinishLength {
				t.Fatalf("full run: %d tokens, finish %+v", len(full.events), full.finish)
			}
			ids := make([]int, maxTokens)
			for i, ev := range full.events {
				ids[i] = ev.TokenID
				if ev.SequenceNo != i+1 {
					t.Fatalf("full run event %d has sequence_no %d", i, ev.SequenceNo)
				}
			}
			type split struct {
				k  int
				ch <-chan Event
			}
			var splits []split
			for s := 0; s < 20; s++ {
				k := rng.IntN(maxTokens)
				r := base
				r.PrefixTokens = ids[:k]
				ch, err := e.Generate(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				splits = append(splits, split{k, ch})
			}
			for _, sp := range splits {
				got := collect(t, sp.ch)
				if len(got.events) != maxTokens-sp.k {
					t.Fatalf("temp %v prompt %d k=%d: %d tokens, want %d", temp, pi, sp.k, len(got.events), maxTokens-sp.k)
				}
				for i, ev := range got.events {
					want := full.events[sp.k+i]
					if len(ev.Logits) != e.Model.Config.VocabSize || len(want.Logits) != len(ev.Logits) {
						t.Fatalf("logits of %d and %d values, want %d", len(ev.Logits), len(want.Logits), e.Model.Config.VocabSize)
					}
					if ev.SequenceNo != want.SequenceNo || ev.TokenID != want.TokenID || ev.Text != want.Text {
						t.Fatalf("temp %v prompt %d k=%d: event %d = (%d,%d,%q), want (%d,%d,%q)",
							temp, pi, sp.k, i, ev.SequenceNo, ev.TokenID, ev.Text, want.SequenceNo, want.TokenID, want.Text)
					}
					for j := range ev.Logits {
						if math.Float32bits(ev.Logits[j]) != math.Float32bits(want.Logits[j]) {
							t.Fatalf("temp %v prompt %d k=%d seq %d: logit %d differs", temp, pi, sp.k, ev.SequenceNo, j)
						}
					}
				}
			}
		}
	}
	if st := e.Stats(); st.FreeBlocks != st.TotalBlocks || st.FreeErrors != 0 {
		t.Fatalf("blocks leaked: %+v", st)
	}
}

func TestStopStrings(t *testing.T) {
	e := newTinyEngine(t)
	base := Request{Prompt: "Once upon a time", MaxTokens: 40, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 5}}
	full := generate(t, e, base)
	var text strings.Builder
	for _, ev := range full.events {
		text.WriteString(ev.Text)
	}
	words := strings.Fields(text.String())
	if len(words) < 12 {
		t.Fatalf("too few words: %q", text.String())
	}
	// Stop at the 10th word (and its leading space), spanning tokens.
	stop := " " + words[9] + " " + words[10]
	want := text.String()[:strings.Index(text.String(), stop)]
	r := base
	r.Stop = []string{"never appears \x01", stop}
	got := generate(t, e, r)
	var gotText strings.Builder
	for _, ev := range got.events {
		gotText.WriteString(ev.Text)
	}
	if gotText.String() != want || got.finish.FinishReason != sched.FinishStop {
		t.Fatalf("stop %q: got %q (%s), want %q", stop, gotText.String(), got.finish.FinishReason, want)
	}
}

func TestCancelEndsStreamAndFreesBlocks(t *testing.T) {
	e := newTinyEngine(t)
	ctx, cancel := context.WithCancel(context.Background())
	const max = 500
	ch, err := e.Generate(ctx, Request{Prompt: "hello", MaxTokens: max, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	<-ch // one token
	cancel()
	r := collect(t, ch)
	if r.finish.FinishReason != sched.FinishCancelled || !errors.Is(r.finish.Err, sched.ErrCancelled) || len(r.events) >= max-1 {
		t.Fatalf("finish %+v after %d tokens", r.finish, len(r.events))
	}
	// The Done event is sent after the blocks are freed.
	if st := e.Stats(); st.FreeBlocks != st.TotalBlocks {
		t.Fatalf("blocks not freed after cancel: %+v", st)
	}
}

func TestStopTokenID(t *testing.T) {
	e := newTinyEngine(t)
	base := Request{Prompt: "Once upon a time", MaxTokens: 30, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 8}}
	full := generate(t, e, base)
	stopID := full.events[11].TokenID
	first := 0
	for full.events[first].TokenID != stopID {
		first++
	}
	r := base
	r.StopTokenIDs = []int{stopID}
	got := generate(t, e, r)
	if len(got.events) != first+1 || got.finish.FinishReason != sched.FinishStop || got.events[first].FinishReason != sched.FinishStop {
		t.Fatalf("stop on id %d: %d events (want %d), finish %+v", stopID, len(got.events), first+1, got.finish)
	}
}

func TestHugeMaxTokensRejected(t *testing.T) {
	e := newTinyEngine(t)
	for _, n := range []int{math.MaxInt, math.MaxInt - 1, math.MaxInt32} {
		if _, err := e.Generate(context.Background(), Request{Prompt: "hi", MaxTokens: n}); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("max_tokens %d: %v", n, err)
		}
	}
	if r := generate(t, e, Request{Prompt: "hi", MaxTokens: 3, IgnoreEOS: true}); len(r.events) != 3 {
		t.Fatal("engine broken after huge max_tokens")
	}
}

// TestLlama2CFirstTokenKeepsItsSpace: llama2.c drops a piece's leading
// space only right after BOS, so the first output word must keep its space
// after a prompt.
func TestLlama2CFirstTokenKeepsItsSpace(t *testing.T) {
	b := tokenizer.NewBuiltin()
	pieces := make([]string, b.VocabSize())
	scores := make([]float32, b.VocabSize())
	for i := range pieces {
		pieces[i] = b.PieceString(i)
		scores[i] = float32(len(pieces[i]))
	}
	var buf bytes.Buffer
	tokenizer.WriteLlama2C(&buf, pieces, scores)
	tok, err := tokenizer.ReadLlama2C(&buf, len(pieces))
	if err != nil {
		t.Fatal(err)
	}
	prompt, _ := tok.Encode("Once upon a time")
	next, _ := b.Encode(" there")
	ts := newTextStream(tok, prompt[len(prompt)-1], nil)
	if got, _ := ts.push(next[0], true); got != " there" {
		t.Fatalf("first output text %q, want %q", got, " there")
	}
}

func TestBadInput(t *testing.T) {
	e := newTinyEngine(t)
	ctxLen := e.Model.Config.ContextLen
	for name, c := range map[string]struct {
		r     Request
		field string
	}{
		"empty prompt":      {Request{Prompt: "", MaxTokens: 5}, "prompt"},
		"invalid utf8":      {Request{Prompt: "ok \xc3\x28", MaxTokens: 5}, "prompt"},
		"prompt too long":   {Request{Prompt: strings.Repeat("water ", ctxLen), MaxTokens: 5}, "prompt"},
		"max tokens 0":      {Request{Prompt: "hi", MaxTokens: 0}, "max_tokens"},
		"max tokens -3":     {Request{Prompt: "hi", MaxTokens: -3}, "max_tokens"},
		"max tokens > ctx":  {Request{Prompt: "hi", MaxTokens: ctxLen}, "max_tokens"},
		"bad prefix id":     {Request{Prompt: "hi", MaxTokens: 5, PrefixTokens: []int{1 << 30}}, "prefix_tokens"},
		"prefix fills":      {Request{Prompt: "hi", MaxTokens: 2, PrefixTokens: []int{400, 401}}, "prefix_tokens"},
		"prefix has eos":    {Request{Prompt: "hi", MaxTokens: 5, PrefixTokens: []int{2, 400}}, "prefix_tokens"},
		"bad temperature":   {Request{Prompt: "hi", MaxTokens: 5, Sampling: sample.Params{Temperature: -1}}, "sampling"},
		"empty stop string": {Request{Prompt: "hi", MaxTokens: 5, Stop: []string{""}}, "stop"},
		"empty token list":  {Request{PromptTokens: []int{}, MaxTokens: 5}, "prompt"},
	} {
		_, err := e.Generate(context.Background(), c.r)
		var re *RequestError
		if !errors.As(err, &re) || !errors.Is(err, ErrInvalidRequest) || re.Field != c.field {
			t.Errorf("%s: %v, want a RequestError on %q", name, err, c.field)
		}
	}
	if _, err := NewEngine(Options{Preset: "enormous"}); !errors.Is(err, model.ErrUnknownPreset) {
		t.Errorf("unknown preset: %v", err)
	}
	// The engine still serves after all that.
	if r := generate(t, e, Request{Prompt: "hi", MaxTokens: 3, IgnoreEOS: true}); len(r.events) != 3 {
		t.Fatalf("engine broken after bad input: %d tokens", len(r.events))
	}
}

func TestOverloadIsTypedAtEngineLevel(t *testing.T) {
	e, err := NewEngine(Options{Preset: "tiny", Limits: sched.Limits{MaxRunning: 1, MaxQueued: 0, MaxStepTokens: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ch, err := e.Generate(context.Background(), Request{Prompt: "hi", MaxTokens: 500, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Generate(context.Background(), Request{Prompt: "hi", MaxTokens: 3})
	var oe *sched.OverloadedError
	if !errors.As(err, &oe) || !oe.Retryable() {
		t.Fatalf("second request: %v, want *sched.OverloadedError", err)
	}
	collect(t, ch)
}

// TestFinishedPrefixFinishesAtOnce: a continuation whose prefix already
// ended the sequence — its last token a stop token, the end of a stop
// string, or the close of a structured value — is what a migration sends
// when the first worker died after its last token and before its finish
// frame. It finishes at once with stop and no token (not an
// invalid-request error), while the same prefix continued past its end is
// still refused.
func TestFinishedPrefixFinishesAtOnce(t *testing.T) {
	e := newTinyEngine(t)
	eos := e.Tokenizer.EOS()
	for name, r := range map[string]Request{
		"stop token": {Prompt: "hi", MaxTokens: 8, PrefixTokens: []int{400, eos}},
		"stop id":    {Prompt: "hi", MaxTokens: 8, PrefixTokens: []int{400, 401}, StopTokenIDs: []int{401}},
	} {
		got := generate(t, e, r)
		if len(got.events) != 0 || got.finish.FinishReason != sched.FinishStop || got.finish.Err != nil {
			t.Fatalf("%s: %d tokens, finish %+v", name, len(got.events), got.finish)
		}
	}
	// A stop string completed by the prefix's last token.
	base := Request{Prompt: "Once upon a time", MaxTokens: 30, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 5}}
	full := generate(t, e, base)
	// The stop string is the text of a token from the 7th on (the first
	// with visible text), so that it ends the run mid-way.
	stopAt := 6
	for stopAt < len(full.events) && strings.TrimSpace(full.events[stopAt].Text) == "" {
		stopAt++
	}
	if stopAt == len(full.events) {
		t.Fatalf("no token from the 7th on has text: %+v", full.events)
	}
	stop := full.events[stopAt].Text
	r := base
	r.Stop = []string{stop}
	first := generate(t, e, r)
	var prefix []int
	for _, ev := range full.events[:stopAt+1] {
		prefix = append(prefix, ev.TokenID)
	}
	if first.finish.FinishReason != sched.FinishStop || len(first.events) > stopAt+1 {
		t.Fatalf("the stop string %q did not end the first run at token %d: %d tokens, %s", stop, stopAt+1, len(first.events), first.finish.FinishReason)
	}
	r.PrefixTokens = prefix[:len(first.events)]
	if !strings.Contains(textOf(result{events: full.events[:len(first.events)]}), stop) {
		t.Fatalf("test setup: %q not in the prefix's text", stop)
	}
	if got := generate(t, e, r); len(got.events) != 0 || got.finish.FinishReason != sched.FinishStop {
		t.Fatalf("stop string: %d tokens, finish %+v", len(got.events), got.finish)
	}
	// A closed structured value.
	a, err := grammar.Compile([]byte(`{"type":"object","properties":{"a":{"type":"null"}},"required":["a"]}`))
	if err != nil {
		t.Fatal(err)
	}
	closed, _ := e.Tokenizer.Encode(`{"a":null}`)
	sr := Request{Prompt: "hi", MaxTokens: 20, PrefixTokens: closed, Structured: &Structured{Automaton: a}}
	if got := generate(t, e, sr); len(got.events) != 0 || got.finish.FinishReason != sched.FinishStop {
		t.Fatalf("closed value: %d tokens, finish %+v", len(got.events), got.finish)
	}
	// Past the end is still bad input.
	if _, err := e.Generate(context.Background(), Request{Prompt: "hi", MaxTokens: 8, PrefixTokens: []int{eos, 400}}); err == nil {
		t.Fatal("a prefix continuing past its stop token was accepted")
	}
}
