package decode

import (
	"cmp"
	"fmt"
	"time"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

// The synthetic engine is for load tests only: it computes nothing. A
// frontend relaying thousands of streams needs workers that produce
// tokens faster than the CPU reference engine can, at a rate the test
// sets. Its scheduler, sampler, detokenizer and wire are the real ones;
// only the forward pass is replaced: every step takes 1/rate seconds,
// whatever its batch, and each position's logits favour one token, a
// hash of the position and its input token. So a sequence's tokens are a
// pure function of its prompt, seed and sampling parameters, like the
// reference engine's, and a migrated stream continues bit-identically on
// another synthetic worker. It is served as "synthetic-<preset>" and its
// numerics id is its own: nobody asks for it by mistake, and its KV (it
// keeps none: the store only counts blocks) is never mixed with a real
// engine's.

// SyntheticMaxRate bounds Options.SyntheticRate (steps per second).
const SyntheticMaxRate = 10000

// syntheticNumerics is the synthetic engine's numerics id.
const syntheticNumerics = "synthetic/v1"

// syntheticEngine is the sched.Engine of the synthetic engine.
type syntheticEngine struct {
	vocab, contextLen int
	step              time.Duration
	next              time.Time // when the next step may end
}

// Forward fills the logits asked for and returns once the step's time
// has passed.
func (e *syntheticEngine) Forward(_ kvcache.Store, in []model.Input) error {
	for _, x := range in {
		if x.Logits == nil {
			continue
		}
		for i := range x.Logits {
			x.Logits[i] = 0
		}
		h := uint64(x.Pos)*0x9e3779b97f4a7c15 ^ uint64(x.Token)*0xbf58476d1ce4e5b9
		h ^= h >> 31
		x.Logits[h%uint64(e.vocab)] = 8
		x.Logits[(h>>20)%uint64(e.vocab)] += 4
	}
	now := time.Now()
	if e.next.Before(now) {
		e.next = now
	}
	e.next = e.next.Add(e.step)
	time.Sleep(time.Until(e.next))
	return nil
}

func (e *syntheticEngine) VocabSize() int  { return e.vocab }
func (e *syntheticEngine) ContextLen() int { return e.contextLen }

// validateSynthetic checks the options of a synthetic engine.
func (o *Options) validateSynthetic() error {
	switch {
	case o.SyntheticRate < 0 || o.SyntheticRate > SyntheticMaxRate:
		return badField("synthetic_rate", "%v steps per second (want 0, off, up to %d)", o.SyntheticRate, SyntheticMaxRate)
	case o.Engine == EngineLlamaCpp || o.ModelPath != "" || o.TP > 1 || o.speculates():
		return badField("synthetic_rate", "the synthetic engine takes a preset's shape only: no engine, model, tp or draft settings")
	case o.Preset == "":
		return badField("preset", "the synthetic engine takes a preset's shape: set one")
	case o.ContextLen < 0:
		return badField("context", "%d", o.ContextLen)
	}
	return nil
}

// newSyntheticEngine starts the synthetic engine of opts.Preset's
// tokenizer and shape at opts.SyntheticRate steps per second.
func newSyntheticEngine(opts Options) (*Engine, error) {
	m, tok, err := loadModel(Options{Preset: opts.Preset, WeightSeed: opts.WeightSeed})
	if err != nil {
		return nil, err
	}
	limits := opts.Limits
	if limits == (sched.Limits{}) {
		limits = sched.DefaultLimits
	}
	// A step costs the same whatever its batch: let it take every running
	// sequence and the prompts of those that start.
	limits.MaxStepTokens = max(limits.MaxStepTokens, 16*limits.Slots())
	ctxLen := m.Config.ContextLen
	if opts.ContextLen > 0 {
		ctxLen = min(ctxLen, opts.ContextLen)
	}
	se := &syntheticEngine{vocab: m.Config.VocabSize, contextLen: ctxLen, step: time.Duration(float64(time.Second) / opts.SyntheticRate)}
	bs := cmp.Or(opts.BlockSize, kvcache.DefaultBlockSize)
	store, err := kvcache.NewMemStore(kvcache.NewLayout(1, 1, bs), limits.Slots()*((ctxLen+bs-1)/bs))
	if err != nil {
		return nil, err
	}
	s, err := sched.NewOn(se, store, limits)
	if err != nil {
		return nil, err
	}
	info := modelInfo{name: cmp.Or(opts.ServedName, "synthetic-"+opts.Preset), revision: fmt.Sprintf("synthetic-%s-%d", opts.Preset, opts.WeightSeed),
		numerics: syntheticNumerics, contextLen: ctxLen, vocabSize: m.Config.VocabSize, continuation: "bit-exact"}
	e := startEngine(s, tok, info)
	e.Store = store
	return e, nil
}
