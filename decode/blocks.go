package decode

import (
	"cmp"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
)

// kvBlocks is the engine's KV block count: Options.KVBlocks, or room for
// 16 sequences of up to 1,024 positions (one long sequence may use the
// room of several) plus the blocks the scheduler holds back for a canary.
func kvBlocks(opts Options, m *model.Model, limits sched.Limits) int {
	if opts.KVBlocks > 0 {
		return opts.KVBlocks
	}
	bs := cmp.Or(opts.BlockSize, kvcache.DefaultBlockSize)
	perSeq := (min(m.Config.ContextLen, 1024) + bs - 1) / bs
	return perSeq*min(limits.MaxRunning, 16) + (sched.CanaryMaxPositions+bs-1)/bs
}

// BlockIdentity is the identity of the KV blocks this engine computes.
func BlockIdentity(m *model.Model, tok tokenizer.Tokenizer, layout kvcache.Layout) kvclient.Identity {
	return kvclient.Identity{
		Model: m.Config.Name, ModelRevision: m.Revision, TokenizerHash: tok.Hash(),
		Layout: layout.String(), DType: layout.DType, RopeTheta: m.Config.RopeTheta,
		BlockSize: layout.BlockSize, NumericsID: model.NumericsIDFor(m.TP()),
	}
}
