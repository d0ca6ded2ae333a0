// Package decode is the reference engine: it ties the model, tokenizer,
// sampler and scheduler into streams of numbered tokens with text, and
// hosts the `lifeline engine` command.
package decode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
)

// ErrInvalidRequest matches every *RequestError.
var ErrInvalidRequest = errors.New("decode: invalid request")

// RequestError names the request field that is wrong.
type RequestError struct {
	Field  string
	Reason string
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("decode: invalid request: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *RequestError) Is(target error) bool { return target == ErrInvalidRequest }

func badField(field, format string, args ...any) error {
	return &RequestError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Options configure an engine.
type Options struct {
	// Preset names a synthetic model ("tiny", "small"); WeightSeed picks its
	// weights. Ignored when ModelPath is set.
	Preset     string
	WeightSeed uint64
	// ModelPath and TokenizerPath load a llama2.c model.bin and tokenizer.bin.
	ModelPath     string
	TokenizerPath string
	// Engine is EngineLifeline ("" too) or EngineLlamaCpp: ModelPath is
	// then a GGUF file computed by llama.cpp (llamacpp.go; a binary built
	// with the llamacpp tag), with Threads and GPULayers.
	Engine             string
	Threads, GPULayers int
	// GGMLBackends is a directory of ggml backend libraries to load (make
	// llamacpp-cuda's lib/lifeline), for GPULayers.
	GGMLBackends string
	// ServedName is the model id clients ask for ("": the preset's or the
	// checkpoint's name, a GGUF file's base name without .gguf).
	ServedName string
	// ContextLen caps the context in tokens (0: the model's; for
	// llama.cpp at most DefaultLlamaCppContext).
	ContextLen int
	// RevisionCache, a directory, keeps the revisions of the checkpoints
	// hashed before: a restart with the same file is ready without the
	// hash pass, which runs in the background (Engine.WeightsChanged).
	RevisionCache string
	// BlockSize is the number of positions per KV block; KVBlocks the number
	// of blocks (0: enough for MaxRunning full contexts, capped).
	BlockSize int
	KVBlocks  int
	Limits    sched.Limits
	// KVSocket, when set, keeps the KV cache in the node's shared-memory
	// arena through the arena owner's socket; full blocks are published and
	// published prefixes reused. InstanceID and Generation name this writer.
	KVSocket   string
	InstanceID string
	Generation uint64
	// DraftPreset ("tiny", "small") or DraftLayers (the target's first
	// layers) turn on speculative decoding with that draft model, DraftK
	// tokens proposed per step (0: DefaultDraftK); see speculate.go.
	DraftPreset string
	DraftLayers int
	DraftK      int
	// TP, when above 1, makes this engine rank Rank of a tensor-parallel
	// group of TP ranks sharing the collective segment GroupSegment of
	// group generation GroupGeneration (tp.go): rank 0 is the engine, the
	// others follow it (RunFollower).
	TP, Rank        int
	GroupSegment    string
	GroupGeneration uint64
	// KVArena, for a rank above 0 of a group whose rank 0 keeps its KV
	// in the node's arena (KVSocket), is the arena file: the rank writes
	// and reads its heads' part of the blocks rank 0 allocates there.
	KVArena string
	// SyntheticRate, above 0, makes this the synthetic engine of Preset
	// (synthetic.go), for load tests only: no computation, a step every
	// 1/SyntheticRate seconds, served as "synthetic-<preset>".
	SyntheticRate float64
	// StepInterval (up to MaxStepInterval) paces the reference engine: a
	// step no sooner than this after the previous one, for tests' streams
	// that must last long enough to be cut mid-way at little CPU.
	StepInterval time.Duration
}

const MaxStepInterval = time.Second // bounds Options.StepInterval

// Engines Options.Engine names.
const (
	EngineLifeline = "lifeline"
	EngineLlamaCpp = "llamacpp"
)

// Validate reports the first bad option by name.
func (o *Options) Validate() error {
	switch {
	case o.Engine != "" && o.Engine != EngineLifeline && o.Engine != EngineLlamaCpp:
		return badField("engine", "%q (want %s or %s)", o.Engine, EngineLifeline, EngineLlamaCpp)
	case o.StepInterval < 0 || o.StepInterval > MaxStepInterval:
		return badField("step_interval", "%v (want 0, off, up to %v)", o.StepInterval, MaxStepInterval)
	case o.StepInterval > 0 && (o.SyntheticRate != 0 || o.Engine == EngineLlamaCpp):
		return badField("step_interval", "paces the reference engine only (the synthetic engine sets its own pace; llama.cpp has no step interval)")
	case o.SyntheticRate != 0:
		return o.validateSynthetic()
	case o.Engine == EngineLlamaCpp:
		return o.validateLlamaCpp()
	case o.ContextLen < 0:
		return badField("context", "%d", o.ContextLen)
	case o.ModelPath == "" && o.Preset == "":
		return badField("preset", "set a preset or a model path")
	case o.ModelPath != "" && o.TokenizerPath == "" && ModelFormat(o.ModelPath) == FormatLlama2C:
		return badField("tokenizer", "a llama2.c model needs its tokenizer.bin (a GGUF file or a Hugging Face directory holds its own)")
	case o.TokenizerPath != "" && ModelFormat(o.ModelPath) != FormatLlama2C:
		return badField("tokenizer", "%s holds its own vocabulary: no tokenizer file", o.ModelPath)
	case o.BlockSize < 0 || o.BlockSize > 4096:
		return badField("block_size", "%d (want 1..4096)", o.BlockSize)
	case o.KVBlocks < 0:
		return badField("kv_blocks", "%d", o.KVBlocks)
	case o.KVSocket != "" && o.InstanceID == "":
		return badField("instance_id", "a writer to the shared arena needs an instance id")
	case o.TP < 0 || o.TP > collective.MaxRanks || o.Rank < 0 || (o.TP > 1 && o.Rank >= o.TP):
		return badField("tp", "rank %d of tp %d (tp 1..%d)", o.Rank, o.TP, collective.MaxRanks)
	case o.TP > 1 && o.GroupSegment == "":
		return badField("group_segment", "a tensor-parallel rank needs its group's segment")
	case o.TP > 1 && o.Rank > 0 && o.KVSocket != "":
		return badField("kv_socket", "rank %d of a group writes the blocks rank 0 allocates: --kv-arena, not the owner's socket", o.Rank)
	case o.TP > 1 && o.speculates():
		return badField("draft", "speculative decoding with tensor parallelism is not built")
	}
	return o.validateDraft()
}

// Engine is one running instance of the reference engine.
type Engine struct {
	Model     *model.Model
	Tokenizer tokenizer.Tokenizer
	Store     kvcache.Store
	// Cache is the shared-arena store when Options.KVSocket is set.
	Cache *kvclient.Cache
	// WeightsChanged receives the error of the background hash pass of a
	// model whose revision came from Options.RevisionCache, if its
	// weights are not the ones that revision names (or not finite): the
	// engine must not serve any more, its worker exits. Nil when the
	// model was hashed at load.
	WeightsChanged <-chan error
	// GroupAborted, for rank 0 of a tensor-parallel group, is closed
	// once the group is aborted (a rank died): the engine can compute
	// nothing more, its worker exits (tp.go).
	GroupAborted <-chan struct{}
	sched        *sched.Scheduler
	// info is what the engine tells about its model.
	info modelInfo
	// chat renders a conversation with the model's own chat template;
	// nil when it has none.
	chat func([]ChatMessage) (string, error)
	// snaps keeps the sequences of an engine that holds K/V itself in the
	// node's arena (llama.cpp with Options.KVSocket); nil otherwise.
	snaps snapshotter

	stop    context.CancelFunc
	done    chan struct{}
	closers []func() error
	gvocab  grammarVocab
}

// NewEngine loads the model and starts the scheduler loop; Close stops it.
func NewEngine(opts Options) (*Engine, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Engine == EngineLlamaCpp {
		return newLlamaCppEngine(opts)
	}
	if opts.SyntheticRate > 0 {
		return newSyntheticEngine(opts)
	}
	e, err := newEngine(opts)
	if err == nil {
		e.sched.SetStepInterval(opts.StepInterval)
	}
	if err != nil || !opts.speculates() {
		return e, err
	}
	if err := e.speculate(opts); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// newEngine is NewEngine without speculation.
func newEngine(opts Options) (*Engine, error) {
	var ck checkpoint
	var err error
	if opts.ModelPath != "" && ModelFormat(opts.ModelPath) != FormatLlama2C {
		ck, err = loadCheckpoint(opts.ModelPath, model.RevisionCache{Dir: opts.RevisionCache})
	} else {
		ck.m, ck.tok, err = loadModel(opts)
	}
	if err != nil {
		return nil, err
	}
	m, tok := ck.m, ck.tok
	loaded := m // a group's rank 0 computes with its shard of it
	limits := opts.Limits
	if limits == (sched.Limits{}) {
		limits = sched.DefaultLimits
	}
	blocks := kvBlocks(opts, m, limits)
	var g *collective.Group
	if opts.TP > 1 {
		if m, g, err = leadGroup(opts, m); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				g.Abort()
				g.Close()
			}
		}()
	}
	e, err := newEngineOn(opts, m, tok, limits, blocks)
	if err == nil {
		e.info.name = cmp.Or(opts.ServedName, ck.name, e.info.name)
		e.chat = goChatTemplate(ck.chat)
	}
	if err == nil && opts.ContextLen > 0 {
		e.info.contextLen = min(e.info.contextLen, opts.ContextLen)
	}
	if err == nil && loaded.Unverified() {
		e.WeightsChanged = verifyLater(loaded)
	}
	if err == nil && g != nil {
		var stop func()
		e.GroupAborted, stop = g.WatchAbort()
		// The engine stopped: so is the group.
		e.closers = append(e.closers, func() error { g.Abort(); stop(); return g.Close() })
	}
	return e, err
}

// newEngineOn is the engine of m over its KV store: the node's arena when
// opts.KVSocket is set, else private memory.
func newEngineOn(opts Options, m *model.Model, tok tokenizer.Tokenizer, limits sched.Limits, blocks int) (*Engine, error) {
	bs := cmp.Or(opts.BlockSize, kvcache.DefaultBlockSize)
	if opts.KVSocket == "" {
		store, err := kvcache.NewMemStore(m.KVLayout(bs), blocks)
		if err != nil {
			return nil, err
		}
		return NewEngineWith(m, tok, store, limits)
	}
	client, err := kvclient.Dial(context.Background(), opts.KVSocket, kvclient.Writer{Instance: opts.InstanceID, Gen: opts.Generation})
	if err != nil {
		return nil, err
	}
	layout := m.KVLayout(bs)
	cache, err := kvclient.NewCache(client, layout, BlockIdentity(m, tok, layout), blocks)
	if err != nil {
		client.Close()
		return nil, err
	}
	e, err := NewEngineWith(m, tok, cache, limits)
	if err != nil {
		cache.Close()
		client.Close()
		return nil, err
	}
	e.closers = append(e.closers, cache.Close, client.Close)
	e.Cache = cache
	return e, nil
}

// NewEngineWith starts an engine on a loaded model and a given KV store.
func NewEngineWith(m *model.Model, tok tokenizer.Tokenizer, store kvcache.Store, limits sched.Limits) (*Engine, error) {
	if tok.VocabSize() != m.Config.VocabSize {
		return nil, fmt.Errorf("decode: tokenizer has %d tokens, model %d", tok.VocabSize(), m.Config.VocabSize)
	}
	s, err := sched.New(m, store, limits)
	if err != nil {
		return nil, err
	}
	info := modelInfo{name: m.Config.Name, revision: m.Revision, numerics: model.NumericsIDFor(m.TP()), contextLen: m.Config.ContextLen,
		vocabSize: m.Config.VocabSize, continuation: "bit-exact"}
	e := startEngine(s, tok, info)
	e.Model, e.Store = m, store
	return e, nil
}

// startEngine starts s's loop.
func startEngine(s *sched.Scheduler, tok tokenizer.Tokenizer, info modelInfo) *Engine {
	ctx, stop := context.WithCancel(context.Background())
	e := &Engine{Tokenizer: tok, sched: s, info: info, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		s.Run(ctx)
	}()
	return e
}

// Limits are the engine's scheduler limits.
func (e *Engine) Limits() sched.Limits { return e.sched.Limits() }

// Close stops the scheduler (open streams end as cancelled), then hands
// back shared KV blocks.
func (e *Engine) Close() {
	e.stop()
	<-e.done
	for _, c := range e.closers {
		c()
	}
	e.closers = nil
}

// Stats reports the scheduler's load.
func (e *Engine) Stats() sched.Stats { return e.sched.Stats() }

// QueuePosition is where request id waits in the scheduler's queue (1:
// next), or 0 when it is not queued.
func (e *Engine) QueuePosition(id string) int { return e.sched.QueuePosition(id) }

// NumericsID identifies the arithmetic of this engine build: KV and
// continuations move only between equal ids.
func (e *Engine) NumericsID() string { return e.info.numerics }

// Request is one generation.
type Request struct {
	ID string
	// Prompt is text; PromptTokens, when set, is used instead (without BOS).
	Prompt       string
	PromptTokens []int
	// Messages, when set and the model has a chat template of its own
	// (Engine.ChatTemplate), are rendered with it instead of Prompt.
	Messages []ChatMessage
	// PrefixTokens were already generated; output continues after them,
	// numbered from len(PrefixTokens)+1, and they count towards MaxTokens.
	PrefixTokens []int
	MaxTokens    int
	Sampling     sample.Params
	// Stop strings end the output before their first occurrence.
	Stop         []string
	StopTokenIDs []int
	// IgnoreEOS keeps generating past the end-of-sequence token.
	IgnoreEOS  bool
	Priority   sched.Priority
	KeepLogits bool
	// PrefillOnly computes and publishes the prompt's K/V and ends with
	// FinishPrefilled and the prompt's tokens (Event.PromptTokens).
	PrefillOnly bool
	// Structured constrains the output (nil: free text); the sequence ends
	// with FinishStop when the value closes.
	Structured *Structured
	// Logprobs asks for every token's log-probability, TopLogprobs
	// (0..20) for that many most likely alternatives.
	Logprobs    bool
	TopLogprobs int
}

// Event is one streamed output token, or the end of the stream.
type Event struct {
	SequenceNo int
	TokenID    int
	// Text is the text this token completes; it is valid UTF-8 and may be
	// empty (a partial character or a possible stop-string start is held).
	Text   string
	Logits []float32
	// Logprob and TopLogprobs are set when the request asked for logprobs.
	Logprob     float64
	TopLogprobs []sample.TopLogprob
	// Done marks the last event; it carries no token. FinishReason is set
	// on it, and also on the token that ended the stream when one did.
	Done         bool
	FinishReason sched.FinishReason
	// ReusedPositions counts prompt positions whose K/V were taken from the
	// shared arena instead of computed (Done event only).
	ReusedPositions int
	// PromptLen is the prompt's length in the model's tokens, BOS
	// included (Done event).
	PromptLen int
	// PromptTokens is the prompt as computed, BOS included (Done event of
	// a PrefillOnly request; BlockKeys gives its blocks' keys).
	PromptTokens []int
	Err          error
}

const maxStopStrings = 4

func (e *Engine) prepare(r *Request) (prompt []int, err error) {
	switch {
	case r.MaxTokens <= 0:
		return nil, badField("max_tokens", "%d (want a positive number)", r.MaxTokens)
	case len(r.Stop) > maxStopStrings:
		return nil, badField("stop", "%d stop strings (at most %d)", len(r.Stop), maxStopStrings)
	}
	for _, s := range r.Stop {
		if s == "" || !utf8.ValidString(s) {
			return nil, badField("stop", "stop strings must be non-empty valid UTF-8")
		}
	}
	if r.PromptTokens != nil {
		if len(r.PromptTokens) == 0 {
			return nil, badField("prompt", "empty")
		}
		if err := tokenizer.CheckIDs(e.Tokenizer, r.PromptTokens); err != nil {
			return nil, badField("prompt", "%v", err)
		}
		prompt = r.PromptTokens
	} else {
		if err := e.renderChat(r); err != nil {
			return nil, err
		}
		switch {
		case r.Prompt == "":
			return nil, badField("prompt", "empty")
		case !utf8.ValidString(r.Prompt):
			return nil, badField("prompt", "not valid UTF-8")
		}
		if prompt, err = e.Tokenizer.Encode(r.Prompt); err != nil {
			return nil, badField("prompt", "%v", err)
		}
	}
	if addsBOS(e.Tokenizer) {
		prompt = slices.Concat([]int{e.Tokenizer.BOS()}, prompt)
	}
	if len(prompt) == 0 {
		return nil, badField("prompt", "no tokens")
	}
	ctxLen := e.info.contextLen
	if len(prompt) >= ctxLen {
		return nil, badField("prompt", "%d tokens do not fit the context of %d", len(prompt), ctxLen)
	}
	if r.MaxTokens > ctxLen-len(prompt) {
		return nil, badField("max_tokens", "prompt of %d tokens plus max_tokens %d exceeds the context of %d", len(prompt), r.MaxTokens, ctxLen)
	}
	if err := tokenizer.CheckIDs(e.Tokenizer, r.PrefixTokens); err != nil {
		return nil, badField("prefix_tokens", "%v", err)
	}
	if len(r.PrefixTokens) >= r.MaxTokens {
		return nil, badField("prefix_tokens", "%d prefix tokens leave nothing to generate within max_tokens %d", len(r.PrefixTokens), r.MaxTokens)
	}
	if err := r.Sampling.Validate(); err != nil {
		return nil, badField("sampling", "%v", err)
	}
	if err := checkStructured(r); err != nil {
		return nil, err
	}
	for id := range r.Sampling.LogitBias {
		if id >= e.info.vocabSize {
			return nil, badField("logit_bias", "token id %d is not in the vocabulary of %d", id, e.info.vocabSize)
		}
	}
	return prompt, nil
}

// ChainKeys returns the identity keys of the full blocks of prompt ‖
// prefix that a request would reuse (all but the last position), or nil
// when the engine does not share its KV.
func (e *Engine) ChainKeys(r Request) ([]kvclient.BlockKey, error) {
	if e.Cache == nil {
		return nil, nil
	}
	prompt, err := e.prepare(&r)
	if err != nil {
		return nil, err
	}
	tokens := slices.Concat(prompt, r.PrefixTokens)
	id := e.Cache.Identity()
	return id.Chain(tokens, (len(tokens)-1)/id.BlockSize), nil
}

// BlockKeys are the identity keys of the full blocks of tokens (BOS
// included), or nil when the engine does not share its KV.
func (e *Engine) BlockKeys(tokens []int) []kvclient.BlockKey {
	if e.Cache == nil {
		return nil
	}
	id := e.Cache.Identity()
	return id.Chain(tokens, -1)
}

var requestSeq struct {
	sync.Mutex
	n uint64
}

// Generate starts a request and returns its stream. The channel is
// buffered for the whole request, so a slow reader never stalls the
// engine; it is closed after the Done event. Cancelling ctx cancels the
// request.
func (e *Engine) Generate(ctx context.Context, r Request) (<-chan Event, error) {
	prompt, err := e.prepare(&r)
	if err != nil {
		return nil, err
	}
	if r.ID == "" {
		requestSeq.Lock()
		requestSeq.n++
		r.ID = fmt.Sprintf("req-%d", requestSeq.n)
		requestSeq.Unlock()
	}
	stops := slices.Clone(r.StopTokenIDs)
	if !r.IgnoreEOS {
		stops = append(stops, endTokens(e.Tokenizer)...)
	}
	text := newTextStream(e.Tokenizer, prompt[len(prompt)-1], r.Stop)
	for i, id := range r.PrefixTokens {
		// Replay the prefix so that held-back text and partial characters
		// are exactly where the uninterrupted run had them.
		_, stopped := text.push(id, false)
		stopToken := slices.Contains(stops, id)
		switch {
		case (stopped || stopToken) && i == len(r.PrefixTokens)-1:
			// The sequence ended with its last token, and only the
			// finish frame was lost (its worker died between the two): a
			// migration of a finished request finishes here at once.
			return finishedStream(sched.FinishStop), nil
		case stopped:
			return nil, badField("prefix_tokens", "the prefix already contains a stop string")
		case stopToken:
			return nil, badField("prefix_tokens", "the prefix contains stop token %d", id)
		}
	}
	events := make(chan Event, r.MaxTokens-len(r.PrefixTokens)+1)
	finished := make(chan struct{})
	sr := sched.Request{
		ID: r.ID, Prompt: prompt, Prefix: r.PrefixTokens, MaxTokens: r.MaxTokens,
		Sampling: r.Sampling, StopTokens: stops, Priority: r.Priority, KeepLogits: r.KeepLogits, PrefillOnly: r.PrefillOnly,
		Grammar: e.schedGrammar(&r), Logprobs: r.Logprobs, TopLogprobs: r.TopLogprobs,
		OnToken: func(t sched.Token) bool {
			chunk, stopped := text.push(t.ID, t.Last)
			ev := Event{SequenceNo: t.SequenceNo, TokenID: t.ID, Text: chunk, Logits: t.Logits, Logprob: t.Logprob, TopLogprobs: t.TopLogprobs}
			switch {
			case stopped || t.Closed || (t.Last && slices.Contains(stops, t.ID)):
				ev.FinishReason = sched.FinishStop
			case t.Last:
				ev.FinishReason = sched.FinishLength
			}
			events <- ev
			return !stopped
		},
		OnFinish: func(f sched.Finish) {
			done := Event{Done: true, FinishReason: f.Reason, ReusedPositions: f.ReusedPositions, PromptLen: len(prompt), Err: f.Err}
			if f.Reason == sched.FinishPrefilled {
				// Keys are hashed by the consumer, not here under the
				// scheduler's lock.
				done.PromptTokens = prompt
			}
			events <- done
			close(events)
			close(finished)
		},
	}
	if err := e.sched.Submit(sr); err != nil {
		if errors.Is(err, sched.ErrPrefixFinished) {
			return finishedStream(sched.FinishStop), nil
		}
		return nil, submitError(err)
	}
	go func() {
		select {
		case <-ctx.Done():
			e.sched.Cancel(r.ID)
		case <-finished:
		}
	}()
	return events, nil
}

// finishedStream is the stream of a request whose prefix already ended
// it: no token, then Done with reason.
func finishedStream(reason sched.FinishReason) <-chan Event {
	events := make(chan Event, 1)
	events <- Event{Done: true, FinishReason: reason}
	close(events)
	return events
}
