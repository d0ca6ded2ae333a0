package decode

// modelInfo is what an engine tells of its model.
type modelInfo struct {
	name, revision, numerics string
	contextLen, vocabSize    int
	// continuation is the guarantee a continuation elsewhere keeps
	// (Engine.Continuation).
	continuation string
}

// Continuation is the guarantee a continuation of this engine's
// sequences on another instance of its numerics keeps: "bit-exact" (the
// reference engine; llama.cpp when its start-up check found its logits
// batch-, chunk- and import-invariant) or "token-exact" (greedy tokens
// agree; sampled ones may differ where two were close) — llamacpp's
// BitExact, TokenExact, Inexact.
func (e *Engine) Continuation() string { return e.info.continuation }

// ModelName is the model id the engine serves.
func (e *Engine) ModelName() string { return e.info.name }

// ModelRevision identifies the weights: the reference engine's revision
// of its checkpoint, a GGUF file's content hash.
func (e *Engine) ModelRevision() string { return e.info.revision }

// ContextLen is the most positions a sequence may hold.
func (e *Engine) ContextLen() int { return e.info.contextLen }
