package model

import (
	"errors"
	"math"
	"path/filepath"
	"sync"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
)

// tpGroup is a tensor-parallel group of shards of m in this process, each
// rank with its own collective view, KV store and workspace.
type tpGroup struct {
	ranks []*seqRunner
}

func newTPGroup(t *testing.T, m *Model, tp, positions int) *tpGroup {
	t.Helper()
	path := filepath.Join(t.TempDir(), "group")
	if err := collective.Create(path, tp, 1, positions*m.Config.Dim); err != nil {
		t.Fatal(err)
	}
	g := &tpGroup{}
	for r := 0; r < tp; r++ {
		cg, err := collective.Open(path, r, tp, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cg.Close() })
		s, err := m.Shard(r, tp, cg.AllReduce)
		if err != nil {
			t.Fatal(err)
		}
		g.ranks = append(g.ranks, newSeqRunner(t, s, positions))
	}
	return g
}

// run computes tokens[from:to] on every rank at once and returns each
// rank's logits.
func (g *tpGroup) run(t *testing.T, tokens []int, from, to int) [][][]float32 {
	t.Helper()
	out := make([][][]float32, len(g.ranks))
	var wg sync.WaitGroup
	for r, sr := range g.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[r] = sr.run(t, tokens, from, to)
		}()
	}
	wg.Wait()
	return out
}

// decodeEqualsPrefill runs toks through a tp group token by token and
// through another in one prefill: every rank's decode logits must be rank
// 0's prefill logits, bit for bit. It returns the decoding group and the
// largest difference from the whole model's logits.
func decodeEqualsPrefill(t *testing.T, m *Model, tp int, toks []int) (*tpGroup, float64) {
	t.Helper()
	n := len(toks)
	prefill := newTPGroup(t, m, tp, n).run(t, toks, 0, n)
	dec := newTPGroup(t, m, tp, n)
	whole := newSeqRunner(t, m, n).run(t, toks, 0, n)
	worst := 0.0
	for p := 0; p < n; p++ {
		step := dec.run(t, toks, p, p+1)
		for r := range step {
			if i := sameBits(step[r][0], prefill[0][p]); i >= 0 {
				t.Fatalf("tp=%d position %d: rank %d's decode and rank 0's prefill differ at logit %d", tp, p, r, i)
			}
		}
		for i, v := range whole[p] {
			worst = max(worst, math.Abs(float64(v-prefill[0][p][i])))
		}
	}
	return dec, worst
}

// TestShardTP2IsExactForItsTP: a tp=2 group's ranks compute the same
// logits bit for bit; token-by-token decode against the per-rank KV equals
// one prefill of the sequence and equals a second group's run; and the
// result is the whole model's up to float rounding (another order of
// sums, not another function).
func TestShardTP2IsExactForItsTP(t *testing.T) {
	m := tinyModel(t)
	const n = 40
	toks := testTokens(n, 3)
	dec, worst := decodeEqualsPrefill(t, m, 2, toks)
	t.Logf("tp=2 vs tp=1: largest logit difference %.3g", worst)
	if worst == 0 || worst > 1e-3 {
		t.Fatalf("tp=2 differs from tp=1 by %.3g at most: want a float rounding difference (0 < d ≤ 1e-3)", worst)
	}
	// A rank writes its own heads' half of each position (rank 1: the
	// second): the other half of its blocks stays as it was (zero).
	blk := dec.ranks[1].store.Block(dec.ranks[1].blocks[0])
	layout := dec.ranks[1].store.Layout()
	if half := layout.KVDim / 2; !allZero(blk[layout.KeyOffset(0, 0):][:half]) || allZero(blk[layout.KeyOffset(0, 0)+half:][:half]) {
		t.Fatal("rank 1 did not write exactly its heads' half of the key row")
	}
}

// TestShardTP4ReplicatesKVHeads: tiny has 4 query heads and 2 key-value
// heads; at tp 4 each rank holds one query head and the key-value head it
// shares with its neighbour. The four ranks compute the same logits, token
// by token against their KV as in one prefill, close to tp 1.
func TestShardTP4ReplicatesKVHeads(t *testing.T) {
	m := tinyModel(t)
	const n = 24
	toks := testTokens(n, 9)
	dec, worst := decodeEqualsPrefill(t, m, 4, toks)
	if worst > 1e-3 {
		t.Fatalf("tp=4 differs from tp=1 by %.3g", worst)
	}
	// Ranks 0 and 1 share key-value head 0, 2 and 3 head 1: each writes
	// its replica, the same bits, and nothing else.
	for r := range 4 {
		blk := dec.ranks[r].store.Block(dec.ranks[r].blocks[0])
		layout := dec.ranks[r].store.Layout()
		head := layout.KVDim / 2
		mine, other := blk[layout.KeyOffset(0, 0)+(r/2)*head:][:head], blk[layout.KeyOffset(0, 0)+(1-r/2)*head:][:head]
		if allZero(mine) || !allZero(other) {
			t.Fatalf("tp=4 rank %d did not write exactly its key-value head", r)
		}
		if r%2 == 1 {
			twin := dec.ranks[r-1].store.Block(dec.ranks[r-1].blocks[0])[layout.KeyOffset(0, 0)+(r/2)*head:][:head]
			if i := sameBits(mine, twin); i >= 0 {
				t.Fatalf("tp=4 ranks %d and %d hold different bits of their shared head at %d", r-1, r, i)
			}
		}
	}
}

func TestShardRefusesWhatDoesNotSplit(t *testing.T) {
	m := tinyModel(t) // 4 heads, 2 key-value heads, hidden 176
	for _, c := range []struct{ rank, tp int }{{0, 8}, {0, 3}, {2, 2}, {-1, 2}} {
		if _, err := m.Shard(c.rank, c.tp, func([]float32) error { return nil }); err == nil {
			t.Errorf("rank %d of tp %d: no error", c.rank, c.tp)
		}
	}
	if _, err := m.Shard(0, 2, nil); err == nil {
		t.Error("tp 2 without an all-reduce: no error")
	}
	s, err := m.Shard(0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Shard(0, 1, nil); err == nil {
		t.Error("a shard of a shard: no error")
	}
	if NumericsIDFor(2) == NumericsID() {
		t.Errorf("tp=2 has tp=1's numerics id %s", NumericsID())
	}
}

// TestLeadAndFollow: rank 0 drives (Lead: every Forward's inputs
// broadcast first), rank 1 follows on its own store (Follow) until the
// group is aborted; rank 0's logits, prefill then token by token, are
// the lock-step group's bit for bit. A malformed step message is refused.
func TestLeadAndFollow(t *testing.T) {
	m := tinyModel(t)
	const n = 30
	toks := testTokens(n, 5)
	want := newTPGroup(t, m, 2, n).run(t, toks, 0, n)[0]

	path := filepath.Join(t.TempDir(), "group")
	if err := collective.Create(path, 2, 1, n*m.Config.Dim); err != nil {
		t.Fatal(err)
	}
	var gs [2]*collective.Group
	var shards [2]*Model
	for r := range gs {
		g, err := collective.Open(path, r, 2, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		gs[r] = g
		if shards[r], err = m.Shard(r, 2, g.AllReduce); err != nil {
			t.Fatal(err)
		}
	}
	leader := shards[0].Lead(func(in []Input) error {
		_, err := gs[0].Broadcast(EncodeInputs(in), false)
		return err
	})
	followed := make(chan error, 1)
	go func() {
		store, err := kvcache.NewMemStore(shards[1].KVLayout(kvcache.DefaultBlockSize), 64)
		if err != nil {
			followed <- err
			return
		}
		var ws Workspace
		followed <- shards[1].Follow(&ws, store, func() ([]byte, error) { return gs[1].Broadcast(nil, true) })
	}()
	lr := newSeqRunner(t, leader, n)
	got := lr.run(t, toks, 0, n/2)
	for p := n / 2; p < n; p++ {
		got = append(got, lr.run(t, toks, p, p+1)...)
	}
	for p := range got {
		if i := sameBits(got[p], want[p]); i >= 0 {
			t.Fatalf("position %d: the led group's logit %d differs from the lock-step group's", p, i)
		}
	}
	gs[0].Abort()
	if err := <-followed; !errors.Is(err, collective.ErrAborted) {
		t.Fatalf("the follower ended with %v, want the abort", err)
	}
	if _, err := DecodeInputs([]byte{5, 1}); !errors.Is(err, ErrBadInput) {
		t.Fatalf("a truncated step message: %v", err)
	}
	in := []Input{{Token: 1, Pos: 0, Blocks: []kvcache.BlockID{3, 4}}, {Token: 2, Pos: 1, Blocks: []kvcache.BlockID{3, 4}}}
	back, err := DecodeInputs(EncodeInputs(in))
	if err != nil || len(back) != 2 || back[1].Token != 2 || back[1].Pos != 1 || len(back[0].Blocks) != 2 || back[0].Blocks[1] != 4 {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}

func allZero(v []float32) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}
