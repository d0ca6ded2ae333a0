package workerclient

import (
	"time"

	"github.com/spf13/pflag"
)

// Command is the lifeline subcommand that runs one worker.
const Command = "worker"

// Args is a worker's command line: the flags of `lifeline worker`. The
// node agent builds a worker's argv from it with Argv and the worker
// command defines its flags with AddFlags, so a flag renamed, added or
// retyped changes on both sides at once.
type Args struct {
	InstanceID string
	Generation uint64
	Role       string
	Listen     string
	CertDir    string
	// Preset and WeightSeed pick a synthetic model; ModelPath and
	// TokenizerPath a llama2.c checkpoint instead.
	Preset        string
	WeightSeed    uint64
	ModelPath     string
	TokenizerPath string
	// Engine is "lifeline" (the reference engine) or "llamacpp" (ModelPath
	// a GGUF file; a binary built with the llamacpp tag). ServedName is
	// the model id clients ask for ("": the engine's name for it);
	// ContextLen caps the context (0: the engine's default); Threads
	// computes (0: every CPU) and GPULayers go to the GPU (llamacpp).
	Engine     string
	ServedName string
	ContextLen int
	Threads    int
	GPULayers  int
	// GGMLBackends is a directory of ggml backend libraries (llamacpp).
	GGMLBackends string
	// RevisionCache is a directory of checkpoint revisions already
	// computed (a restart skips the hash pass and runs it in the
	// background); "" computes it at every start.
	RevisionCache string
	// KVSocket is the node's KV arena owner; KVTransfer the node agent's
	// transfer endpoint.
	KVSocket   string
	KVTransfer string
	// MaxRunning and MaxQueued are the scheduler's hard limits (0: the
	// engine's defaults).
	MaxRunning int
	MaxQueued  int
	// DraftPreset or DraftLayers (the target's first layers) turn on
	// speculative decoding with DraftK tokens proposed per step.
	DraftPreset string
	DraftLayers int
	DraftK      int
	// TP, Rank, GroupSegment and GroupGeneration make the worker rank
	// Rank of a tensor-parallel group of TP ranks (rank 0 serves the
	// endpoint; the others only compute); TP 1: a worker of its own.
	TP, Rank        int
	GroupSegment    string
	GroupGeneration uint64
	// KVArena, for a rank above 0, is the node's arena file (rank 0 has
	// the owner's socket and allocates the group's blocks there).
	KVArena string
	// AgentSocket is a socket of the agent that started the worker (every
	// rank's): a worker that finds nobody there for OrphanTimeout stops.
	AgentSocket   string
	OrphanTimeout time.Duration
	// MemoryHeadroomMiB bounds the worker's Go heap at what it holds once
	// loaded plus this many MiB (0: the default, below 0: no bound).
	MemoryHeadroomMiB int
	// SyntheticRate, above 0, serves the synthetic engine of Preset:
	// no computation, a step every 1/SyntheticRate s (load tests only).
	SyntheticRate float64
	// StepInterval, above 0, paces the reference engine: a step no sooner
	// than this after the previous one (tests and drills only).
	StepInterval time.Duration
}

// AddFlags defines the worker's flags on fs, bound to a's fields, and
// sets those fields to the flags' defaults.
func (a *Args) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&a.InstanceID, "instance-id", "", "instance id")
	fs.Uint64Var(&a.Generation, "generation", 0, "instance generation, stamped on every frame")
	fs.StringVar(&a.Role, "role", "decode", "decode, prefill or both")
	fs.StringVar(&a.Listen, "listen", "127.0.0.1:0", "UDP address of the QUIC endpoint")
	fs.StringVar(&a.CertDir, "certs", "", "this worker's certificate directory (its agent issues it with the node CA)")
	fs.StringVar(&a.Preset, "preset", "tiny", "synthetic model preset")
	fs.Uint64Var(&a.WeightSeed, "weight-seed", 1, "seed of the synthetic weights")
	fs.StringVar(&a.ModelPath, "model", "", "llama2.c model.bin")
	fs.StringVar(&a.TokenizerPath, "tokenizer", "", "llama2.c tokenizer.bin")
	fs.StringVar(&a.Engine, "engine", "lifeline", "lifeline (the reference engine) or llamacpp (--model a GGUF file)")
	fs.StringVar(&a.ServedName, "served-model-name", "", "the model id clients ask for (default: the preset, or the GGUF file's base name)")
	fs.IntVar(&a.ContextLen, "context", 0, "cap on the context length in tokens (0: the model's, at most 4096 for llamacpp)")
	fs.IntVar(&a.Threads, "threads", 0, "llamacpp: compute threads (0: every CPU)")
	fs.IntVar(&a.GPULayers, "gpu-layers", 0, "llamacpp: layers offloaded to the GPU (a CUDA build)")
	fs.StringVar(&a.GGMLBackends, "ggml-backends", "", "llamacpp: a directory of ggml backend libraries to load, make llamacpp-cuda's lib/lifeline (default $LIFELINE_GGML_BACKENDS)")
	fs.StringVar(&a.RevisionCache, "revision-cache", "", "directory of the --model revisions already computed: a restart on the same file is ready without the hash pass, which runs in the background (a mismatch ends the worker)")
	fs.StringVar(&a.KVSocket, "kv-socket", "", "the node's KV arena owner socket")
	fs.StringVar(&a.KVTransfer, "kv-transfer", "", "the node agent's KV transfer endpoint (migrated requests pull their blocks through it)")
	fs.IntVar(&a.MaxRunning, "max-running", 0, "hard limit on running sequences (0: default)")
	fs.IntVar(&a.MaxQueued, "max-queued", 0, "hard limit on queued requests (0: default, or none when max-running is set)")
	fs.StringVar(&a.DraftPreset, "draft-preset", "", "speculative decoding with this synthetic draft preset (tiny)")
	fs.IntVar(&a.DraftLayers, "draft-layers", 0, "speculative decoding with the target's first N layers as the draft (self-speculation)")
	fs.IntVar(&a.DraftK, "draft-k", 4, "draft tokens proposed per step")
	fs.IntVar(&a.TP, "tp", 1, "tensor-parallel degree of the instance's group")
	fs.IntVar(&a.Rank, "rank", 0, "this worker's rank in its group (0 serves the endpoint)")
	fs.StringVar(&a.GroupSegment, "group-segment", "", "the group's collective segment (its agent creates one per group generation)")
	fs.Uint64Var(&a.GroupGeneration, "group-generation", 0, "the group generation this rank was started for (a segment of another is refused)")
	fs.StringVar(&a.AgentSocket, "agent-socket", "", "a socket of the agent that started this worker: with nobody there for --orphan-timeout, the worker stops")
	fs.DurationVar(&a.OrphanTimeout, "orphan-timeout", 3*time.Minute, "how long a worker waits for its agent (restarted, to adopt it) before it stops")
	fs.IntVar(&a.MemoryHeadroomMiB, "memory-headroom-mib", 0, "soft bound on the Go heap: what it holds once loaded (weights, KV store) plus this many MiB (0: 64, below 0: none; GOMEMLIMIT overrides)")
	fs.Float64Var(&a.SyntheticRate, "synthetic-rate", 0, "load tests only: serve the synthetic engine of --preset, computing nothing, a step (a token for every running sequence) this many times a second, served as synthetic-<preset> (0: off)")
	fs.DurationVar(&a.StepInterval, "step-interval", 0, "tests and drills only: the reference engine starts a step no sooner than this after the previous one, so that a small model's streams last long enough to be cut mid-way (0: off, up to 1s)")
	fs.StringVar(&a.KVArena, "kv-arena", "", "a rank above 0: the node's KV arena file, where it writes its heads' part of the blocks rank 0 allocates")
}

// Argv is the command line, after the subcommand, that parses back to a:
// every flag AddFlags defines, as --name=value. Every flag is explicit,
// so a worker binary with other defaults still gets exactly a.
func (a Args) Argv() []string {
	var bound Args
	fs := pflag.NewFlagSet(Command, pflag.ContinueOnError)
	bound.AddFlags(fs)
	bound = a // the flags point into bound: they now read a's values
	var argv []string
	fs.VisitAll(func(f *pflag.Flag) { argv = append(argv, "--"+f.Name+"="+f.Value.String()) })
	return argv
}
