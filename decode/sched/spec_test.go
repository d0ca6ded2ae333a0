package sched

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

var small = sync.OnceValue(func() *model.Model {
	m, err := model.Synthetic("small", 3)
	if err != nil {
		panic(err)
	}
	return m
})

// specSetup is a target and a draft for it.
type specSetup struct {
	name   string
	target func() *model.Model
	draft  func(target *model.Model) *model.Model
}

func must(m *model.Model, err error) *model.Model {
	if err != nil {
		panic(err)
	}
	return m
}

var specSetups = []specSetup{
	{"tiny/self1", func() *model.Model { return tiny }, func(t *model.Model) *model.Model { return must(t.FirstLayers(1)) }},
	{"tiny/tiny", func() *model.Model { return tiny }, func(t *model.Model) *model.Model {
		return must(model.SyntheticDraft("tiny", 99, t.Config))
	}},
	{"small/tiny", small, func(t *model.Model) *model.Model { return must(model.SyntheticDraft("tiny", 99, t.Config)) }},
	{"small/self2", small, func(t *model.Model) *model.Model { return must(t.FirstLayers(2)) }},
}

// run submits reqs together to a fresh scheduler over m (speculating with
// sp when set), steps it until idle, and returns what each request got.
func run(t *testing.T, m *model.Model, sp *Speculation, store kvcache.Store, reqs []Request) (map[string]*recorder, Stats) {
	t.Helper()
	if store == nil {
		var err error
		if store, err = kvcache.NewMemStore(m.KVLayout(kvcache.DefaultBlockSize), 256); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(m, store, Limits{MaxRunning: 16, MaxQueued: 16, MaxStepTokens: 512})
	if err != nil {
		t.Fatal(err)
	}
	if sp != nil {
		if err := s.Speculate(*sp); err != nil {
			t.Fatal(err)
		}
	}
	recs := make(map[string]*recorder)
	for _, r := range reqs {
		rec := newRecorder()
		recs[r.ID] = rec
		if r.OnToken == nil {
			r = rec.attach(r)
		} else {
			onToken := r.OnToken
			r = rec.attach(r)
			attached := r.OnToken
			r.OnToken = func(tok Token) bool { return attached(tok) && onToken(tok) }
		}
		if err := s.Submit(r); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, s)
	if store.NumFree() != store.Capacity() {
		t.Fatalf("%d blocks leaked", store.Capacity()-store.NumFree())
	}
	if s.spec != nil && s.spec.store.NumFree() != s.spec.store.Capacity() {
		t.Fatalf("%d draft blocks leaked", s.spec.store.Capacity()-s.spec.store.NumFree())
	}
	return recs, s.Stats()
}

// sameOutput fails unless got equals want token by token (ids, numbers,
// Last, kept logits bit for bit) and both ended alike.
func sameOutput(t *testing.T, id string, want, got *recorder) {
	t.Helper()
	if len(got.tokens) != len(want.tokens) {
		t.Fatalf("%s: %d tokens with speculation, %d without:\n%v\n%v", id, len(got.tokens), len(want.tokens), ids(got.tokens), ids(want.tokens))
	}
	for i, w := range want.tokens {
		g := got.tokens[i]
		if g.ID != w.ID || g.SequenceNo != w.SequenceNo || g.Last != w.Last {
			t.Fatalf("%s: token %d: speculation %+v, plain %+v\n%v\n%v", id, i, g, w, ids(got.tokens), ids(want.tokens))
		}
		if len(g.Logits) != len(w.Logits) {
			t.Fatalf("%s: token %d: %d logits, want %d", id, i, len(g.Logits), len(w.Logits))
		}
		for j := range w.Logits {
			if math.Float32bits(g.Logits[j]) != math.Float32bits(w.Logits[j]) {
				t.Fatalf("%s: token %d logit %d: %v, want %v", id, i, j, g.Logits[j], w.Logits[j])
			}
		}
	}
	if got.finish == nil || want.finish == nil || got.finish.Reason != want.finish.Reason || got.finish.Generated != want.finish.Generated {
		t.Fatalf("%s: finish %+v, want %+v", id, got.finish, want.finish)
	}
}

func ids(toks []Token) []int {
	var out []int
	for _, t := range toks {
		out = append(out, t.ID)
	}
	return out
}

func specRequests(sampling func(i int) sample.Params) []Request {
	var reqs []Request
	for i := 0; i < 5; i++ {
		reqs = append(reqs, Request{ID: fmt.Sprint("r", i), Prompt: prompt(3+i*7, i), MaxTokens: 20 + i*3,
			Sampling: sampling(i), KeepLogits: i == 1})
	}
	return reqs
}

func compareWithPlain(t *testing.T, sampling func(i int) sample.Params) {
	for _, su := range specSetups {
		t.Run(su.name, func(t *testing.T) {
			if testing.Short() && su.target() != tiny {
				t.Skip("the small preset under -short")
			}
			m := su.target()
			reqs := specRequests(sampling)
			plain, _ := run(t, m, nil, nil, reqs)
			spec, st := run(t, m, &Speculation{Draft: su.draft(m), K: 4}, nil, reqs)
			for _, r := range reqs {
				sameOutput(t, r.ID, plain[r.ID], spec[r.ID])
			}
			if st.DraftProposed == 0 {
				t.Fatal("nothing was speculated")
			}
			t.Logf("accepted %d of %d draft tokens (%.0f%%)", st.DraftAccepted, st.DraftProposed, 100*float64(st.DraftAccepted)/float64(st.DraftProposed))
		})
	}
}

func TestSpeculationGreedyEqualsPlain(t *testing.T) {
	compareWithPlain(t, func(int) sample.Params { return sample.Params{} })
}

func TestSpeculationSeededSamplingEqualsPlain(t *testing.T) {
	compareWithPlain(t, func(i int) sample.Params {
		return sample.Params{Temperature: 0.7 + 0.1*float64(i), TopP: 0.95, TopK: 40 * (i % 2), Seed: uint64(1000 + i),
			FrequencyPenalty: 0.2 * float64(i%3), PresencePenalty: 0.1}
	})
}

// With the target as its own draft every proposal is accepted, so runs of
// k+1 tokens are committed at once: the cuts inside them are exercised.
func TestSpeculationCutsInsideAnAcceptedRun(t *testing.T) {
	base := Request{ID: "base", Prompt: prompt(9, 4), MaxTokens: 30, Sampling: sample.Params{Temperature: 0.8, Seed: 5}}
	perfect := &Speculation{Draft: tiny, K: 4}
	plain, _ := run(t, tiny, nil, nil, []Request{base})
	want := ids(plain["base"].tokens)
	spec, st := run(t, tiny, perfect, nil, []Request{base})
	sameOutput(t, "base", plain["base"], spec["base"])
	if st.DraftAccepted != st.DraftProposed || st.DraftProposed < 20 {
		t.Fatalf("a perfect draft: accepted %d of %d", st.DraftAccepted, st.DraftProposed)
	}

	// A stop token at every output position (its first occurrence).
	for at := 1; at < 10; at++ {
		if slices.Index(want, want[at]) != at {
			continue
		}
		r := base
		r.ID, r.StopTokens = fmt.Sprint("stop", at), []int{want[at]}
		p, _ := run(t, tiny, nil, nil, []Request{r})
		s, _ := run(t, tiny, perfect, nil, []Request{r})
		sameOutput(t, r.ID, p[r.ID], s[r.ID])
		if got := ids(s[r.ID].tokens); !slices.Equal(got, want[:at+1]) || s[r.ID].finish.Reason != FinishStop {
			t.Fatalf("stop at %d: got %v (%s), want %v", at, got, s[r.ID].finish.Reason, want[:at+1])
		}
	}
	// Every budget, so that it ends at each place within a run.
	for maxTokens := 1; maxTokens <= 12; maxTokens++ {
		r := base
		r.ID, r.MaxTokens = fmt.Sprint("budget", maxTokens), maxTokens
		s, _ := run(t, tiny, perfect, nil, []Request{r})
		if got := ids(s[r.ID].tokens); !slices.Equal(got, want[:maxTokens]) || s[r.ID].finish.Reason != FinishLength || !s[r.ID].tokens[maxTokens-1].Last {
			t.Fatalf("max_tokens %d: got %v (%+v), want %v", maxTokens, got, s[r.ID].finish, want[:maxTokens])
		}
	}
	// OnToken declining more: nothing after that token.
	for stopAfter := 1; stopAfter <= 9; stopAfter++ {
		r := base
		r.ID = fmt.Sprint("decline", stopAfter)
		n := 0
		r.OnToken = func(Token) bool { n++; return n < stopAfter }
		s, _ := run(t, tiny, perfect, nil, []Request{r})
		if got := ids(s[r.ID].tokens); !slices.Equal(got, want[:stopAfter]) || s[r.ID].finish.Reason != FinishStop {
			t.Fatalf("declined after %d: got %v (%s), want %v", stopAfter, got, s[r.ID].finish.Reason, want[:stopAfter])
		}
	}
}

// A continuation from any prefix with speculation is the uninterrupted
// run's rest: the replay boundary is the last committed token.
func TestSpeculationContinuationFromPrefix(t *testing.T) {
	draft := must(tiny.FirstLayers(1))
	full := Request{ID: "full", Prompt: prompt(11, 2), MaxTokens: 40, Sampling: sample.Params{Temperature: 0.9, TopP: 0.9, Seed: 77}}
	plain, _ := run(t, tiny, nil, nil, []Request{full})
	spec, _ := run(t, tiny, &Speculation{Draft: draft, K: 3}, nil, []Request{full})
	sameOutput(t, "full", plain["full"], spec["full"])
	want := spec["full"].tokens
	for _, k := range []int{1, 2, 5, 13, 29} {
		r := full
		r.ID, r.Prefix = fmt.Sprint("cont", k), ids(want[:k])
		got, _ := run(t, tiny, &Speculation{Draft: draft, K: 3}, nil, []Request{r})
		if g := got[r.ID].tokens; len(g) != len(want)-k || g[0].SequenceNo != k+1 || !slices.Equal(ids(g), ids(want[k:])) {
			t.Fatalf("continuation after %d: %v, want %v", k, ids(g), ids(want[k:]))
		}
	}
}

// sharingStore records every published block's contents and checks, when
// the block is freed, that nothing wrote it after its publication.
type sharingStore struct {
	*kvcache.MemStore
	t         *testing.T
	published map[string][]float32 // by the tokens of the prefix
	byBlock   map[kvcache.BlockID]string
}

func newSharingStore(t *testing.T, m *model.Model) *sharingStore {
	ms, err := kvcache.NewMemStore(m.KVLayout(kvcache.DefaultBlockSize), 256)
	if err != nil {
		t.Fatal(err)
	}
	return &sharingStore{MemStore: ms, t: t, published: make(map[string][]float32), byBlock: make(map[kvcache.BlockID]string)}
}

func (s *sharingStore) AcquirePrefix([]int, int) []kvcache.BlockID { return nil }

func (s *sharingStore) Publish(id, _ kvcache.BlockID, tokens []int) {
	key := fmt.Sprint(tokens)
	s.published[key] = slices.Clone(s.Block(id))
	s.byBlock[id] = key
}

func (s *sharingStore) Free(id kvcache.BlockID) error {
	if key, ok := s.byBlock[id]; ok {
		if !slices.Equal(s.Block(id), s.published[key]) {
			s.t.Errorf("block %d (%s) was written after it was published", id, key)
		}
		delete(s.byBlock, id)
	}
	return s.MemStore.Free(id)
}

func TestSpeculationPublishesOnlyCommittedKV(t *testing.T) {
	reqs := specRequests(func(i int) sample.Params { return sample.Params{Temperature: 0.5 * float64(i%2), Seed: uint64(i)} })
	for i := range reqs {
		reqs[i].MaxTokens += 30
	}
	plainStore := newSharingStore(t, tiny)
	plain, _ := run(t, tiny, nil, plainStore, reqs)
	for _, draft := range []*model.Model{must(tiny.FirstLayers(1)), tiny} {
		store := newSharingStore(t, tiny)
		spec, st := run(t, tiny, &Speculation{Draft: draft, K: 4}, store, reqs)
		for _, r := range reqs {
			sameOutput(t, r.ID, plain[r.ID], spec[r.ID])
		}
		if len(store.published) < len(reqs) || st.DraftAccepted == 0 {
			t.Fatalf("%s: %d blocks published, %d draft tokens accepted", draft.Config.Name, len(store.published), st.DraftAccepted)
		}
		for key, blk := range store.published {
			want, ok := plainStore.published[key]
			if !ok {
				t.Fatalf("%s: published %s, which the plain run did not", draft.Config.Name, key)
			}
			for i := range want {
				if math.Float32bits(blk[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s: block %s float %d: %v, the plain run's %v", draft.Config.Name, key, i, blk[i], want[i])
				}
			}
		}
	}
}

func TestSpeculateRefusesBadDrafts(t *testing.T) {
	other := tiny.Config
	other.VocabSize = 300
	wrongVocab := must(model.Random(other, 1))
	short := tiny.Config
	short.ContextLen = 64
	shortCtx := must(model.Random(short, 1))
	for _, sp := range []Speculation{{Draft: nil, K: 4}, {Draft: tiny, K: 0}, {Draft: tiny, K: MaxDraftK + 1}, {Draft: wrongVocab, K: 4}, {Draft: shortCtx, K: 4}} {
		s, _ := newSched(t, 16, DefaultLimits)
		if err := s.Speculate(sp); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Speculate(k=%d): %v, want ErrInvalidRequest", sp.K, err)
		}
	}
	s, _ := newSched(t, 16, DefaultLimits)
	if err := s.Speculate(Speculation{Draft: tiny, K: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Speculate(Speculation{Draft: tiny, K: 2}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("second Speculate: %v", err)
	}
}

// TestSpeculationCancelMidRunFreesEverything: cancelling speculating
// sequences while Run steps them ends them with what was delivered so far
// (a prefix of the plain run) and frees their target and draft blocks.
func TestSpeculationCancelMidRunFreesEverything(t *testing.T) {
	reqs := specRequests(func(i int) sample.Params { return sample.Params{Seed: uint64(i), Temperature: 0.5} })
	for i := range reqs {
		reqs[i].MaxTokens = 400
	}
	plain, _ := run(t, tiny, nil, nil, reqs)
	s, store := newSched(t, 256, DefaultLimits)
	if err := s.Speculate(Speculation{Draft: tiny, K: 4}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	recs := map[string]*recorder{}
	for _, r := range reqs {
		recs[r.ID] = newRecorder()
		if err := s.Submit(recs[r.ID].attach(r)); err != nil {
			t.Fatal(err)
		}
	}
	proctest.WaitFor(t, 30*time.Second, "tokens delivered", func() (bool, string) {
		st := s.Stats()
		return st.Generated > 20, fmt.Sprint(st.Generated)
	})
	for _, r := range reqs {
		if err := s.Cancel(r.ID); err != nil && !errors.Is(err, ErrUnknownSequence) {
			t.Fatal(err)
		}
	}
	for _, r := range reqs {
		rec := recs[r.ID]
		<-rec.done
		rec.mu.Lock()
		got := ids(rec.tokens)
		rec.mu.Unlock()
		if want := ids(plain[r.ID].tokens); !slices.Equal(got, want[:len(got)]) {
			t.Fatalf("%s: %v is not a prefix of %v", r.ID, got, want)
		}
	}
	stop()
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	if store.NumFree() != store.Capacity() || s.spec.store.NumFree() != s.spec.store.Capacity() || len(s.spec.seqs) != 0 {
		t.Fatalf("leaked: %d target blocks, %d draft blocks, %d draft states", store.Capacity()-store.NumFree(),
			s.spec.store.Capacity()-s.spec.store.NumFree(), len(s.spec.seqs))
	}
}

// TestSpeculationWithGrammarAndLogprobsEqualsPlain: structured requests
// are speculated too — the verifier's pickNext masks each position with the
// grammar state after the history it is given, speculated tokens included —
// and their tokens, logprobs and finish equal the plain run's; the output
// is complete JSON.
func TestSpeculationWithGrammarAndLogprobsEqualsPlain(t *testing.T) {
	g := builtinGrammar(t, `{"type":"object","properties":{"name":{"type":"string"},"ok":{"type":"boolean"},"tags":{"type":"array","items":{"enum":["a","b"]}}},"required":["name","ok"]}`, false)
	m := tiny
	var reqs []Request
	for i := range 4 {
		reqs = append(reqs, Request{ID: fmt.Sprint("g", i), Prompt: prompt(5+i*3, i), MaxTokens: 60,
			Sampling: sample.Params{Temperature: 0.3 * float64(i), Seed: uint64(7 + i)}, Grammar: g, Logprobs: true, TopLogprobs: 3})
	}
	for _, su := range specSetups[:2] {
		t.Run(su.name, func(t *testing.T) {
			plain, _ := run(t, m, nil, nil, reqs)
			spec, st := run(t, m, &Speculation{Draft: su.draft(m), K: 4}, nil, reqs)
			if st.DraftProposed == 0 {
				t.Fatal("no structured request was speculated")
			}
			tok := tokenizer.NewBuiltin()
			for _, r := range reqs {
				want, got := plain[r.ID], spec[r.ID]
				sameOutput(t, r.ID, want, got)
				var text []byte
				for i, w := range want.tokens {
					x := got.tokens[i]
					if math.Float64bits(x.Logprob) != math.Float64bits(w.Logprob) || !slices.Equal(x.TopLogprobs, w.TopLogprobs) {
						t.Fatalf("%s token %d: logprobs %v %v, plain %v %v", r.ID, i, x.Logprob, x.TopLogprobs, w.Logprob, w.TopLogprobs)
					}
					text = append(text, tok.Piece(tok.EOS(), w.ID)...)
				}
				if !json.Valid(text) {
					t.Fatalf("%s: %q is not JSON", r.ID, text)
				}
			}
		})
	}
}
