package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/quick"
)

func logitsFrom(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * 3)
	}
	return l
}

var quickCfg = &quick.Config{MaxCount: 500}

func TestSameInputsSameToken(t *testing.T) {
	f := func(seed, lseed uint64, pos uint16, temp uint8, topK uint8, topP uint8) bool {
		logits := logitsFrom(lseed, 64)
		p := Params{Temperature: float64(temp) / 100, TopK: int(topK % 70), TopP: float64(topP) / 255, Seed: seed, FrequencyPenalty: 0.3}
		hist := []int{1, 2, 2, int(lseed % 64)}
		var a, b Sampler
		// b has run before on unrelated input: scratch must not leak.
		b.Sample(logitsFrom(lseed+1, 64), Params{Temperature: 1, Seed: 9}, []int{5, 5, 5}, 3)
		return a.Sample(logits, p, hist, uint64(pos)) == b.Sample(logits, p, hist, uint64(pos))
	}
	if err := quick.Check(f, quickCfg); err != nil {
		t.Fatal(err)
	}
}

func rankOf(logits []float32, id int) int {
	r := 0
	for j, l := range logits {
		if l > logits[id] || (l == logits[id] && j < id) {
			r++
		}
	}
	return r
}

func TestTopKNeverPicksOutside(t *testing.T) {
	f := func(seed, lseed uint64, pos uint32, k uint8) bool {
		logits := logitsFrom(lseed, 50)
		K := int(k%10) + 1
		var s Sampler
		id := s.Sample(logits, Params{Temperature: 5, TopK: K, Seed: seed}, nil, uint64(pos))
		return rankOf(logits, id) < K
	}
	if err := quick.Check(f, quickCfg); err != nil {
		t.Fatal(err)
	}
}

func TestTopPNeverPicksOutside(t *testing.T) {
	f := func(seed, lseed uint64, pos uint32, pp uint8) bool {
		logits := logitsFrom(lseed, 50)
		topP := float64(pp%100+1) / 101
		temp := 1.3
		// The nucleus: smallest prefix of the sorted distribution reaching topP.
		ids := make([]int, len(logits))
		for i := range ids {
			ids[i] = i
		}
		slices.SortFunc(ids, func(a, b int) int { return rankOf(logits, a) - rankOf(logits, b) })
		var z float64
		for _, l := range logits {
			z += math.Exp((float64(l) - float64(logits[ids[0]])) / temp)
		}
		allowed := map[int]bool{}
		var cum float64
		for _, id := range ids {
			allowed[id] = true
			cum += math.Exp((float64(logits[id])-float64(logits[ids[0]]))/temp) / z
			if cum >= topP {
				break
			}
		}
		var s Sampler
		return allowed[s.Sample(logits, Params{Temperature: temp, TopP: topP, Seed: seed}, nil, uint64(pos))]
	}
	if err := quick.Check(f, quickCfg); err != nil {
		t.Fatal(err)
	}
}

// TestLogitBias: a bias is added to its token's logit first: -100 bans the
// greedy pick, +100 forces another token even under sampling.
func TestLogitBias(t *testing.T) {
	var s Sampler
	logits := []float32{1, 3, 2, 0}
	if id := s.Sample(logits, Params{LogitBias: map[int]float64{1: -100}}, nil, 1); id != 2 {
		t.Fatalf("greedy with token 1 banned picked %d, want 2", id)
	}
	for pos := uint64(1); pos <= 50; pos++ {
		if id := s.Sample(logits, Params{Temperature: 1, Seed: 9, LogitBias: map[int]float64{3: 100}}, nil, pos); id != 3 {
			t.Fatalf("position %d: picked %d with token 3 at +100", pos, id)
		}
	}
	// Ids past the logits are ignored by the sampler (the engine refuses
	// them); out-of-range values are invalid.
	if id := s.Sample(logits, Params{LogitBias: map[int]float64{99: 100}}, nil, 1); id != 1 {
		t.Fatalf("a bias past the vocabulary changed the pick: %d", id)
	}
	for _, bad := range []map[int]float64{{1: 101}, {-1: 1}, {1: math.NaN()}} {
		if (Params{LogitBias: bad}).Validate() == nil {
			t.Fatalf("logit_bias %v validated", bad)
		}
	}
}

func TestGreedyAndPenalties(t *testing.T) {
	var s Sampler
	logits := []float32{1, 3, 3, 2}
	if id := s.Sample(logits, Params{}, nil, 1); id != 1 {
		t.Fatalf("greedy tie picked %d, want lowest id 1", id)
	}
	// Token 1 used twice: 3 - 2*0.6 = 1.8 < 3 (token 2) -> 2.
	if id := s.Sample(logits, Params{FrequencyPenalty: 0.6}, []int{1, 1}, 3); id != 2 {
		t.Fatalf("frequency penalty: picked %d, want 2", id)
	}
	// Presence penalty on 1 and 2 leaves 3 (logit 2) on top.
	if id := s.Sample(logits, Params{PresencePenalty: 1.5}, []int{1, 2}, 3); id != 3 {
		t.Fatalf("presence penalty: picked %d, want 3", id)
	}
}

func TestUniformSpreadsAndDependsOnBoth(t *testing.T) {
	var buckets [10]int
	for p := uint64(0); p < 10000; p++ {
		u := Uniform(42, p)
		if u < 0 || u >= 1 {
			t.Fatalf("Uniform out of range: %v", u)
		}
		buckets[int(u*10)]++
	}
	for i, n := range buckets {
		if n < 850 || n > 1150 {
			t.Fatalf("bucket %d has %d of 10000", i, n)
		}
	}
	if Uniform(1, 5) == Uniform(2, 5) || Uniform(1, 5) == Uniform(1, 6) {
		t.Fatal("Uniform ignores seed or position")
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Params{{Temperature: -1}, {TopK: -1}, {TopP: 1.5}, {Temperature: math.NaN()}, {FrequencyPenalty: 3}} {
		if err := p.Validate(); !errors.Is(err, ErrInvalidParams) {
			t.Errorf("%+v: %v", p, err)
		}
	}
	if err := (Params{Temperature: 0.9, TopK: 40, TopP: 0.95}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestSampleAllowed: a masked draw picks only allowed ids, is a pure
// function of its arguments, and with every id allowed equals Sample.
func TestSampleAllowed(t *testing.T) {
	f := func(seed, lseed uint64, pos uint16, temp uint8, topK uint8, topP uint8, mask uint64) bool {
		logits := logitsFrom(lseed, 64)
		p := Params{Temperature: float64(temp) / 100, TopK: int(topK % 70), TopP: float64(topP) / 255, Seed: seed, PresencePenalty: 0.5}
		hist := []int{1, 2, int(lseed % 64)}
		allowed, all := make([]bool, 64), make([]bool, 64)
		for i := range allowed {
			allowed[i] = mask&(1<<i) != 0
			all[i] = true
		}
		allowed[int(seed%64)] = true
		var a, b Sampler
		id := a.SampleAllowed(logits, p, hist, uint64(pos), allowed)
		return allowed[id] && id == b.SampleAllowed(logits, p, hist, uint64(pos), allowed) &&
			a.SampleAllowed(logits, p, hist, uint64(pos), all) == b.Sample(logits, p, hist, uint64(pos))
	}
	if err := quick.Check(f, quickCfg); err != nil {
		t.Fatal(err)
	}
}

func TestLogprobs(t *testing.T) {
	logits := []float32{1, 3, 3, -2, 0.5, 3}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v))
	}
	lp, top := Logprobs(logits, 4, 4, nil)
	if want := 0.5 - math.Log(sum); math.Abs(lp-want) > 1e-12 {
		t.Fatalf("logprob %v, want %v", lp, want)
	}
	wantIDs := []int{1, 2, 5, 0} // ties by lower id
	if len(top) != len(wantIDs) {
		t.Fatalf("top %v", top)
	}
	for i, w := range wantIDs {
		if top[i].ID != w || math.Abs(top[i].Logprob-(float64(logits[w])-math.Log(sum))) > 1e-12 {
			t.Fatalf("top[%d] = %+v, want id %d", i, top[i], w)
		}
	}
	if _, top := Logprobs(logits, 0, 0, nil); len(top) != 0 {
		t.Fatalf("top 0: %v", top)
	}
	if _, top := Logprobs(logits, 0, 50, nil); len(top) != len(logits) {
		t.Fatalf("top 50 of %d: %d", len(logits), len(top))
	}
}

// TestParallelDrawIsTheSame: a draw over a 32,000-id vocabulary whose
// weights are computed in parts on other goroutines picks the same id and
// leaves the same weights, bit for bit, as one computed in one loop.
func TestParallelDrawIsTheSame(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 13))
	calls := 0
	par := &Sampler{Parallel: func(n int, f func(int)) {
		calls++
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { f(i) })
		}
		wg.Wait()
	}}
	var one Sampler
	logits := make([]float32, 32000)
	for round := range 50 {
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * 4)
		}
		p := Params{Temperature: 0.2 + r.Float64(), Seed: r.Uint64()}
		pos := uint64(round + 1)
		a, b := par.Sample(logits, p, nil, pos), one.Sample(logits, p, nil, pos)
		if a != b {
			t.Fatalf("round %d: the parallel draw picked %d, the serial one %d", round, a, b)
		}
		for i := range logits {
			if math.Float64bits(par.logits[i]) != math.Float64bits(one.logits[i]) {
				t.Fatalf("round %d: weight %d is %v in parts, %v in one loop", round, i, par.logits[i], one.logits[i])
			}
		}
	}
	if calls != 50 {
		t.Fatalf("Parallel ran %d times in 50 draws over 32,000 ids", calls)
	}
}
