package sched

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
)

// Speculative decoding. For a decoding sequence, a draft model proposes up
// to K tokens; the target computes the sequence's last token and the K
// proposals in the same forward pass, with logits at every one of those
// K+1 positions; then pickNext chooses the token of each position in turn,
// with the full history, and a proposal is accepted while it equals that
// choice. The first choice that differs from its proposal (or the choice
// after K accepted ones) is committed too, and the run ends there.
//
// pickNext is a pure function of (logits, parameters, history, position)
// and the engine is batch-invariant, so the committed tokens are exactly
// those of a run without speculation, for any sampling parameters: the
// draft decides speed, never output. Only committed tokens are delivered
// and counted; K/V written for rejected positions lie beyond the
// sequence's computed length, so they are never read, never published, and
// are overwritten when those positions are computed again.

// Speculation configures speculative decoding.
type Speculation struct {
	// Draft proposes tokens. It must have the target's vocabulary and at
	// least its context; its K/V live in private memory.
	Draft *model.Model
	// K is the most draft tokens proposed per sequence and step.
	K int
}

// MaxDraftK bounds Speculation.K.
const MaxDraftK = 16

// speculator is the draft side of a scheduler. Its store, workspace and
// sampler are used by the stepping goroutine only (under stepMu); seqs and
// the counters are guarded by the scheduler's mu.
type speculator struct {
	draft *model.Model
	k     int
	store *kvcache.MemStore
	ws    model.Workspace
	sm    sample.Sampler
	seqs  map[*sequence]*draftSeq
	// proposed and accepted count draft tokens: accepted ones are those
	// committed (delivered) because they equalled the target's choice.
	proposed, accepted uint64
}

// draftSeq is one sequence's draft state.
type draftSeq struct {
	blocks []kvcache.BlockID
	// computed counts leading positions whose draft K/V belong to the
	// sequence's committed tokens.
	computed int
	logits   []float32
	// verify are the target's logits buffers of the positions after the
	// sequence's last token (that one uses sequence.logits).
	verify [][]float32
	// hist is the output so far followed by this step's proposals.
	hist []int
}

// specRun is one sequence's speculation within a step.
type specRun struct {
	seq *sequence
	d   *draftSeq
	// at is the index of the sequence's first input in the step's batch;
	// n is its token count when planned; k its proposals' count.
	at, n, k  int
	proposals []int
	logits    [][]float32
	// picks are the verified tokens: matched ones that equal their
	// proposal, then one that differs (or follows all k).
	picks   []pick
	matched int
	// draftFailed is set when a draft pass failed: the draft's K/V of
	// this sequence are then recomputed from the start.
	draftFailed bool
}

// Speculate turns speculative decoding on with sp's draft. It may be
// called once, before or while the scheduler runs.
func (s *Scheduler) Speculate(sp Speculation) error {
	if sp.Draft == nil {
		return fmt.Errorf("%w: speculation without a draft model", ErrInvalidRequest)
	}
	if s.model == nil {
		return fmt.Errorf("%w: speculation needs the reference engine", ErrInvalidRequest)
	}
	c, dc := s.model.Config, sp.Draft.Config
	switch {
	case sp.K < 1 || sp.K > MaxDraftK:
		return fmt.Errorf("%w: draft k %d (want 1..%d)", ErrInvalidRequest, sp.K, MaxDraftK)
	case dc.VocabSize != c.VocabSize:
		return fmt.Errorf("%w: draft %s has %d tokens, the target %d", ErrInvalidRequest, dc.Name, dc.VocabSize, c.VocabSize)
	case dc.ContextLen < c.ContextLen:
		return fmt.Errorf("%w: draft %s has a context of %d, the target %d", ErrInvalidRequest, dc.Name, dc.ContextLen, c.ContextLen)
	}
	// A sequence's draft needs no more positions than its target blocks
	// hold (a proposal is never fed past the budget), so the draft store
	// has as many blocks as the target's.
	store, err := kvcache.NewMemStore(sp.Draft.KVLayout(s.store.Layout().BlockSize), s.store.Capacity())
	if err != nil {
		return fmt.Errorf("sched: draft store: %w", err)
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spec != nil {
		return fmt.Errorf("%w: speculation is already on", ErrInvalidRequest)
	}
	s.spec = &speculator{draft: sp.Draft, k: sp.K, store: store, seqs: make(map[*sequence]*draftSeq)}
	return nil
}

// speculable is the one condition on a request for speculation. A canary
// measures the plain path; a prefill samples nothing.
func speculable(r *Request) bool {
	return !r.PrefillOnly && r.Priority != Canary
}

// specWidthLocked is how many tokens the draft proposes for seq in a step
// with budget positions left: 0 unless speculation is on, seq is decoding
// (its last token is its only uncomputed position) and has room for at
// least one proposal before its budget ends. It gives seq its draft blocks
// on first use; a sequence that cannot get them is not speculated.
func (s *Scheduler) specWidthLocked(seq *sequence, budget int) int {
	sp := s.spec
	if sp == nil || !speculable(&seq.req) || len(seq.tokens)-seq.computed != 1 {
		return 0
	}
	// At most k+1 tokens are committed: never past MaxTokens, so every
	// computed position lies within the blocks reserved for the request.
	k := min(sp.k, seq.req.MaxTokens-seq.nOutput-1, budget-1)
	if k <= 0 {
		return 0
	}
	if sp.seqs[seq] == nil {
		d := &draftSeq{logits: make([]float32, sp.draft.Config.VocabSize)}
		for range s.blocksFor(&seq.req) {
			id, err := sp.store.Alloc()
			if err != nil {
				sp.free(d)
				return 0
			}
			d.blocks = append(d.blocks, id)
		}
		sp.seqs[seq] = d
	}
	return k
}

// planSpecLocked adds seq's last token and k placeholder positions (their
// tokens are the draft's proposals, filled in by propose) with logits at
// each, and returns the positions used.
func (s *Scheduler) planSpecLocked(b *stepBatch, seq *sequence, k int) int {
	d := s.spec.seqs[seq]
	n := len(seq.tokens)
	vocab := s.model.Config.VocabSize
	if seq.logits == nil {
		seq.logits = make([]float32, vocab)
	}
	for len(d.verify) < k {
		d.verify = append(d.verify, make([]float32, vocab))
	}
	d.computed = min(d.computed, n-1)
	d.hist = append(d.hist[:0], seq.tokens[len(seq.req.Prompt):]...)
	r := &specRun{seq: seq, d: d, at: len(b.in), n: n, k: k, logits: append([][]float32{seq.logits}, d.verify[:k]...)}
	for i := 0; i <= k; i++ {
		b.in = append(b.in, model.Input{Token: seq.tokens[n-1], Pos: n - 1 + i, Blocks: seq.blocks, Seq: seq.slot, Logits: r.logits[i]})
	}
	// Only the committed position counts as computed; commit moves it
	// past the accepted ones.
	seq.computed = n
	seq.inFlight = true
	b.seqs = append(b.seqs, seq)
	b.spec = append(b.spec, r)
	return k + 1
}

// propose runs the draft over runs, one pass per proposal: the first pass
// also computes the draft K/V of every committed position the draft has not
// seen yet. Proposals use the request's own sampling parameters and
// position counter (greedy at temperature 0), so that a seeded draw of a
// similar distribution lands on the same token. It writes the proposals
// into the target's batch in.
func (s *Scheduler) propose(in []model.Input, runs []*specRun) {
	if len(runs) == 0 {
		return
	}
	sp := s.spec
	var batch []model.Input
	for _, r := range runs {
		for p := r.d.computed; p < r.n; p++ {
			batch = append(batch, model.Input{Token: r.seq.tokens[p], Pos: p, Blocks: r.d.blocks})
		}
		batch[len(batch)-1].Logits = r.d.logits
	}
	for j := 1; len(batch) > 0; j++ {
		if err := sp.draft.Forward(&sp.ws, sp.store, batch); err != nil {
			// The placeholders stay: verification is exact whatever
			// was proposed.
			for _, r := range runs {
				r.draftFailed = true
			}
			break
		}
		batch = batch[:0]
		for _, r := range runs {
			if j > r.k {
				continue
			}
			t := sp.sm.Sample(r.d.logits, r.seq.req.Sampling, r.d.hist, uint64(len(r.d.hist)+1))
			r.proposals = append(r.proposals, t)
			r.d.hist = append(r.d.hist, t)
			in[r.at+j].Token = t
			if j < r.k {
				batch = append(batch, model.Input{Token: t, Pos: r.n - 1 + j, Blocks: r.d.blocks, Logits: r.d.logits})
			}
		}
	}
	for _, r := range runs {
		for len(r.proposals) < r.k {
			t := in[r.at+len(r.proposals)+1].Token
			r.proposals = append(r.proposals, t)
			r.d.hist = append(r.d.hist, t)
		}
	}
}

// verify chooses r's tokens with pickNext, position by position, while
// the proposals match; it ends after a stop token.
func verify(sm *sample.Sampler, r *specRun) {
	base := r.n - len(r.seq.req.Prompt)
	for i := 0; i <= r.k; i++ {
		p := pickNext(sm, r.seq, r.logits[i], r.d.hist[:base+i])
		r.picks = append(r.picks, p)
		if i == r.k || p.id != r.proposals[i] {
			return
		}
		r.matched++
		if containsID(r.seq.req.StopTokens, p.id) {
			return
		}
	}
}

func containsID(ids []int, id int) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// verifyAll verifies every run; runs are independent, so they are split
// across goroutines.
func (s *Scheduler) verifyAll(runs []*specRun) {
	workers := min(runtime.GOMAXPROCS(0), len(runs))
	for len(s.samplers) < workers {
		s.samplers = append(s.samplers, new(sample.Sampler))
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(runs); i += workers {
				verify(s.samplers[w], runs[i])
			}
		}()
	}
	wg.Wait()
}

// commitSpecLocked delivers r's verified tokens one by one until the
// sequence ends (a stop token, its budget, OnToken declining), so nothing
// past its end is delivered, and counts its proposals.
func (s *Scheduler) commitSpecLocked(r *specRun) {
	seq := r.seq
	delivered := 0
	for i, p := range r.picks {
		if seq.finished {
			break
		}
		if i > 0 && seq.req.KeepLogits {
			copy(seq.logits, r.logits[i]) // logits[0] is seq.logits
		}
		s.deliverLocked(seq, p)
		delivered++
	}
	s.spec.proposed += uint64(r.k)
	s.spec.accepted += uint64(min(r.matched, delivered))
	if !seq.finished {
		// The K/V of every delivered token but the last were computed in
		// this pass, at the positions verification read them from.
		seq.computed = len(seq.tokens) - 1
	}
	// The draft fed its proposals up to position n+k-2; those that were
	// committed keep their K/V.
	r.d.computed = r.n + max(0, min(delivered-1, r.k-1))
	if r.draftFailed {
		r.d.computed = 0
	}
}

// dropLocked frees seq's draft state; finishLocked calls it for every
// sequence that ends. The draft store is private: a block freed here is not
// one a running draft pass reads (that pass's sequences are in flight, and
// an in-flight sequence finishes only after its step).
func (sp *speculator) dropLocked(seq *sequence) {
	if sp == nil {
		return
	}
	if d, ok := sp.seqs[seq]; ok {
		sp.free(d)
		delete(sp.seqs, seq)
	}
}

func (sp *speculator) free(d *draftSeq) {
	for _, id := range d.blocks {
		sp.store.Free(id) // our own private store: it cannot refuse
	}
	d.blocks = nil
}
