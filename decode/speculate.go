package decode

import (
	"cmp"
	"fmt"

	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

// DefaultDraftK is the number of draft tokens proposed per step when
// Options.DraftK is 0.
const DefaultDraftK = 4

// draftSeedSalt separates a preset draft's weights from a target of the
// same preset and weight seed (which would be the target itself).
const draftSeedSalt = 0x5bd1e995

func (o *Options) speculates() bool { return o.DraftPreset != "" || o.DraftLayers != 0 }

func (o *Options) validateDraft() error {
	switch {
	case o.DraftPreset != "" && o.DraftLayers != 0:
		return badField("draft", "set a draft preset or draft layers, not both")
	case o.DraftLayers < 0:
		return badField("draft_layers", "%d (want a positive number of the target's layers)", o.DraftLayers)
	case o.DraftK < 0 || o.DraftK > sched.MaxDraftK:
		return badField("draft_k", "%d (want 1..%d, or 0 for %d)", o.DraftK, sched.MaxDraftK, DefaultDraftK)
	}
	return nil
}

// speculate builds the draft model of opts and turns speculative decoding
// on: a synthetic preset stretched to the target's context, or the
// target's first DraftLayers layers.
func (e *Engine) speculate(opts Options) error {
	var (
		draft *model.Model
		err   error
	)
	if opts.DraftLayers != 0 {
		draft, err = e.Model.FirstLayers(opts.DraftLayers)
	} else {
		draft, err = model.SyntheticDraft(opts.DraftPreset, opts.WeightSeed^draftSeedSalt, e.Model.Config)
	}
	if err != nil {
		return badField("draft", "%v", err)
	}
	k := cmp.Or(opts.DraftK, DefaultDraftK)
	if err := e.sched.Speculate(sched.Speculation{Draft: draft, K: k}); err != nil {
		return fmt.Errorf("decode: speculation: %w", err)
	}
	return nil
}
