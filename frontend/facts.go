package frontend

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/frontend/route"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// This file holds what a response says about its request beyond the
// tokens: the system fingerprint, the usage, and the seed.

// fingerprint is the system_fingerprint of an instance: its numerics id
// and model revision, which decide its output bit for bit.
func fingerprint(numericsID, revision string) string {
	sum := sha256.Sum256([]byte(numericsID + "|" + revision))
	return "fp_" + hex.EncodeToString(sum[:])[:10]
}

// randomSeed is the seed of a request that named none: fixed at
// admission, in 0..2^63-1 as OpenAI documents seeds.
func randomSeed() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// responseFacts is what a stream learns of the instance that serves it,
// once, from the router (an instance that died since is no longer
// known there: the first look is kept).
type responseFacts struct {
	known       bool
	fingerprint string
	// promptTokens counts the prompt as the worker computes it (BOS
	// included); -1 when the instance's tokenizer is not the built-in
	// one and the frontend cannot count.
	promptTokens int
}

// learn fills the stream's facts from instance id, if not done yet; the
// router is nil in unit tests. Called under st.mu.
func (st *stream) learn(rt *route.Router, id string) {
	if st.facts.known || rt == nil || id == "" {
		return
	}
	in, ok := rt.Instance(id)
	if !ok {
		return
	}
	st.facts = responseFacts{known: true, fingerprint: fingerprint(in.NumericsID, in.ModelRevision), promptTokens: -1}
	tok := tokenizer.NewBuiltin()
	if in.KVIdentity != nil && in.KVIdentity.TokenizerHash != tok.Hash() {
		return
	}
	if st.promptLen > 0 {
		st.facts.promptTokens = st.promptLen
	}
}

// usage is the request's usage with n tokens generated.
func (st *stream) usage(n int) *sse.Usage {
	st.mu.Lock()
	p := max(st.facts.promptTokens, 0)
	if st.workerPromptLen > 0 {
		p = st.workerPromptLen // the serving model's own count
	}
	st.mu.Unlock()
	return &sse.Usage{PromptTokens: p, CompletionTokens: n, TotalTokens: p + n}
}

// meta is the stream's fingerprint, learnt from instance if not yet.
func (st *stream) meta(instance string) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.learn(st.router, instance)
	return st.facts.fingerprint
}

// setWorkerPromptLen records the prompt's length in the serving model's
// tokens, from its worker's finish frame (0: not said).
func (st *stream) setWorkerPromptLen(n int) {
	if n <= 0 {
		return
	}
	st.mu.Lock()
	st.workerPromptLen = n
	st.mu.Unlock()
}

// setPromptLen records the prompt's length in tokens under the built-in
// tokenizer, BOS included, as the run encoded it for routing (0: it
// could not be encoded).
func (st *stream) setPromptLen(n int) {
	st.mu.Lock()
	st.promptLen = n
	st.mu.Unlock()
}
