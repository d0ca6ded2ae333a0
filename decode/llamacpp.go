//go:build llamacpp

package decode

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
)

func init() { newLlamaCppEngine = openLlamaCpp }

// openLlamaCpp starts an engine whose scheduler computes through
// llama.cpp: one context, a KV stream per slot. Its KV stays in the
// context (not the node's arena); its store only counts blocks.
func openLlamaCpp(opts Options) (*Engine, error) {
	rev, err := model.FileRevision(opts.ModelPath, model.RevisionCache{Dir: opts.RevisionCache})
	if err != nil {
		return nil, err
	}
	gpus, err := llamacpp.LoadBackends(opts.GGMLBackends)
	if err != nil {
		return nil, err
	}
	m, err := llamacpp.LoadModel(opts.ModelPath, llamacpp.ModelParams{GPULayers: opts.GPULayers})
	if err != nil {
		return nil, err
	}
	ctxLen := min(m.TrainContext(), cmp.Or(opts.ContextLen, DefaultLlamaCppContext))
	limits := opts.Limits
	if limits == (sched.Limits{}) {
		limits = DefaultLlamaCppLimits
	}
	eng, err := m.NewEngine(ctxLen, limits.Slots(), limits.MaxStepTokens, opts.Threads)
	if err != nil {
		m.Close()
		return nil, err
	}
	closeAll := func() error { eng.Close(); m.Close(); return nil }
	bs := cmp.Or(opts.BlockSize, kvcache.DefaultBlockSize)
	store, err := kvcache.NewMemStore(kvcache.NewLayout(1, 1, bs), limits.Slots()*((ctxLen+bs-1)/bs))
	if err != nil {
		closeAll()
		return nil, err
	}
	inv, err := eng.CheckInvariance(limits.Slots()-1, limits.Slots()-2, invarianceProbe(m.VocabSize()))
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("decode: llama.cpp invariance check: %w", err)
	}
	info := modelInfo{name: opts.ServedName, revision: rev, numerics: llamaCppNumerics(m, opts, gpus),
		contextLen: ctxLen, vocabSize: m.VocabSize(), continuation: inv.Guarantee()}
	if info.name == "" {
		info.name = GGUFName(opts.ModelPath)
	}
	tok := m.Tokenizer()
	var se sched.Engine = eng
	var snaps *llamaSnapshots
	if opts.KVSocket != "" {
		if snaps, err = openLlamaSnapshots(opts, eng, kvclient.Identity{Model: info.name, ModelRevision: rev, TokenizerHash: tok.Hash(),
			Layout: llamaStateLayout, DType: "f16", BlockSize: sched.SnapshotEvery, NumericsID: info.numerics}, limits.Slots()-1); err != nil {
			closeAll()
			return nil, err
		}
		se = snaps
	}
	s, err := sched.NewOn(se, store, limits)
	if err != nil {
		if snaps != nil {
			snaps.close()
		}
		closeAll()
		return nil, err
	}
	e := startEngine(s, tok, info)
	e.Store = store
	e.chat = chatTemplate(m.ChatTemplate())
	e.closers = append(e.closers, closeAll)
	if snaps != nil {
		e.snaps = snaps
		e.closers = append(e.closers, snaps.close)
	}
	return e, nil
}

// invarianceProbe is the prompt the start-up invariance check computes:
// 32 tokens spread over the vocabulary.
func invarianceProbe(vocab int) []int32 {
	out := make([]int32, 32)
	for i := range out {
		out[i] = int32((i*7919 + 13) % vocab)
	}
	return out
}

// llamaStateLayout names what a llama.cpp snapshot's blocks hold.
const llamaStateLayout = "llamacpp-sequence-state/v1"

// llamaSnapshots is llama.cpp's engine with its sequences saved to and
// restored from the node's arena (sched.Snapshotter).
type llamaSnapshots struct {
	*llamacpp.Engine
	*snapshots
	client *kvclient.Client
	// stateBase + statePerPosition·n is the size of a state of n
	// positions.
	stateBase, statePerPosition int
	// Used by the scheduler's step only: the export buffer, and the time
	// spent computing and saving, for the budget.
	scratch                []byte
	forwardTime, saveSpent time.Duration
	// skipped marks the slots whose last save the budget skipped: the
	// next is made whatever the budget (a restore looks two periods
	// back).
	skipped map[int]bool
}

// shrink is b, or nil when it is larger than llamacpp.KeptBuffer.
func shrink(b []byte) []byte {
	if cap(b) > llamacpp.KeptBuffer {
		return nil
	}
	return b
}

// snapshotBudget bounds the time saves take, as a share of the time the
// engine computes: a save that would go over it is skipped (the
// sequence's previous snapshot stands), but never two of a slot in a
// row, so a restore always finds one of the last two periods (a slot
// then saves every second period, at half the cost). Measured without it, saves every 64
// tokens cost 1–2 % at 2k positions on these CPUs; the budget keeps a
// slower export (a GPU's copy to the host, a long context) from
// costing the decode more.
const snapshotBudget = 0.05

// overBudget says whether saves that took spent, against forward of
// computing, may not save again.
func overBudget(spent, forward time.Duration) bool {
	return float64(spent) > snapshotBudget*float64(forward)
}

func (l *llamaSnapshots) Forward(store kvcache.Store, in []model.Input) error {
	began := time.Now()
	err := l.Engine.Forward(store, in)
	l.forwardTime += time.Since(began)
	return err
}

// openLlamaSnapshots connects eng to the node's arena as opts' writer;
// spare is a slot the state's size is measured on.
func openLlamaSnapshots(opts Options, eng *llamacpp.Engine, id kvclient.Identity, spare int) (*llamaSnapshots, error) {
	base, per, err := eng.StateSize(spare)
	if err != nil {
		return nil, err
	}
	client, err := kvclient.Dial(context.Background(), opts.KVSocket, kvclient.Writer{Instance: opts.InstanceID, Gen: opts.Generation})
	if err != nil {
		return nil, err
	}
	snaps, err := newSnapshots(client, id)
	if err != nil {
		client.Close()
		return nil, err
	}
	return &llamaSnapshots{Engine: eng, snapshots: snaps, client: client, stateBase: base, statePerPosition: per, skipped: map[int]bool{}}, nil
}

func (l *llamaSnapshots) Save(slot int, tokens []int) {
	if overBudget(l.saveSpent, l.forwardTime) && !l.skipped[slot] {
		l.skipped[slot] = true
		l.mu.Lock()
		l.stats.Skipped++
		l.mu.Unlock()
		return
	}
	delete(l.skipped, slot)
	began := time.Now()
	defer func() { l.saveSpent += time.Since(began); l.scratch = shrink(l.scratch) }()
	state, err := l.ExportInto(slot, &l.scratch)
	if err != nil {
		l.saveFailed(err)
		return
	}
	l.save(slot, tokens, state, began)
}

func (l *llamaSnapshots) Restore(slot int, tokens []int) int {
	began := time.Now()
	state, k, err := l.load(tokens)
	if err == nil {
		err = l.Engine.Restore(slot, state, k)
	}
	l.readBuf = shrink(l.readBuf)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.stats.RestoreMissed++
		return 0
	}
	l.stats.Restored++
	l.stats.RestoredPositions += uint64(k)
	l.stats.RestoreTime += time.Since(began)
	return k
}

func (l *llamaSnapshots) Drop(slot int) { l.drop(slot) }

// stateBytes bounds the state saved for the prefix of k positions: it
// holds up to a period more.
func (l *llamaSnapshots) stateBytes(k int) int {
	return l.stateBase + l.statePerPosition*(k+sched.SnapshotEvery-1)
}

func (l *llamaSnapshots) close() error {
	err := l.snapshots.close()
	l.client.Close()
	return err
}

// llamaCppNumerics names what a llama.cpp engine's arithmetic depends
// on: the llama.cpp commit, the CPU kernels the build chose (a hash of
// llama.cpp's system info), the GPU layers, the weight type, the KV type,
// flash attention and the KV streams; with layers on a GPU, the GPUs.
func llamaCppNumerics(m *llamacpp.Model, opts Options, gpus []string) string {
	sys := sha256.Sum256([]byte(llamacpp.SystemInfo()))
	// llama.cpp's description ends with the weight type ("llama 0.5B
	// Q8_0"), followed by "(guessed)" when the file does not name it.
	desc := strings.Fields(strings.TrimSuffix(m.Desc(), " (guessed)"))
	weights := "unknown"
	if len(desc) > 0 {
		weights = desc[len(desc)-1]
	}
	gpu := "none"
	if opts.GPULayers > 0 {
		gpu = strings.Join(gpus, "+")
	}
	return fmt.Sprintf("llamacpp=%s;cpu=%s;gpu=%s;gpu_layers=%d;weights=%s;kv=f16;flash_attn=off;kv_unified=off",
		gguf.LlamaCppCommit, hex.EncodeToString(sys[:6]), gpu, opts.GPULayers, weights)
}

// chatTemplate renders conversations with template tmpl through
// llama.cpp's llama_chat_apply_template (nil: no template). llama.cpp's
// renderer is the reference a GGUF model's users know from llama-server;
// a template it does not recognise is refused per request, naming the
// way out (completions with a prompt rendered by the client).
func chatTemplate(tmpl string) func([]ChatMessage) (string, error) {
	if tmpl == "" {
		return nil
	}
	return func(msgs []ChatMessage) (string, error) {
		in := make([]llamacpp.ChatMessage, len(msgs))
		for i, m := range msgs {
			in[i] = llamacpp.ChatMessage{Role: m.Role, Content: m.Content}
		}
		p, err := llamacpp.ApplyTemplate(tmpl, in, true)
		if err != nil {
			return "", fmt.Errorf("%w: send the rendered prompt to /v1/completions instead", err)
		}
		return p, nil
	}
}

func (l *llamaSnapshots) pullChains(tokens []int) [][]kvclient.BlockKey {
	return l.chains(tokens, l.stateBytes)
}
