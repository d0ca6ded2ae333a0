package sample

import (
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
)

// ulps is how far got is from want in units of got's last place.
func ulps(got, want float64) float64 {
	if got == want {
		return 0
	}
	ulp := math.Nextafter(got, math.Inf(1)) - got
	return math.Abs(got-want) / ulp
}

// TestExpWeightIsWithinTwoULPs: expWeight is e^x within two units in the
// last place over [-708, 0] (against math.Exp, itself within one), 0 below,
// 1 at and above 0, NaN for NaN.
func TestExpWeightIsWithinTwoULPs(t *testing.T) {
	worst, at := 0.0, 0.0
	check := func(x float64) {
		if u := ulps(expWeight(x), math.Exp(x)); u > worst {
			worst, at = u, x
		}
	}
	for x := weightLo; x <= 0; x += 1.0 / 512 {
		check(x)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 300000 {
		check(weightLo * r.Float64())
		check(-r.ExpFloat64() * 1e-3)
	}
	if worst > 2 {
		t.Fatalf("expWeight(%g) is %.2f ulps from e^x", at, worst)
	}
	t.Logf("worst: %.2f ulps at %g", worst, at)
	for _, c := range []struct{ x, want float64 }{
		{0, 1}, {math.Copysign(0, -1), 1}, {3, 1}, {math.Inf(1), 1},
		{-708.0000001, 0}, {-1e6, 0}, {math.Inf(-1), 0}, {-1, math.Exp(-1)},
	} {
		if got := expWeight(c.x); ulps(got, c.want) > 2 {
			t.Errorf("expWeight(%g) = %g, want %g", c.x, got, c.want)
		}
	}
	if v := expWeight(math.NaN()); v == v {
		t.Errorf("expWeight(NaN) = %g", v)
	}
}

// weightInputs are logits for weighAll: random spreads, the clamp's
// edges, rounding ties of k, signed zeros, infinities and NaN, in lengths
// with and without a tail.
func weightInputs() [][]float64 {
	r := rand.New(rand.NewPCG(7, 8))
	edges := []float64{0, math.Copysign(0, -1), -708, -708.0000001, -707.9999999, math.Inf(-1), math.Inf(1), math.NaN(),
		-0.5 * math.Ln2, -1.5 * math.Ln2, -2.5 * math.Ln2, -1e-300, -5e-324, 1e-300, 12, -745.2, -709.8}
	var out [][]float64
	for _, n := range []int{1, 3, 4, 7, 64, 1001, 32000} {
		l := make([]float64, n)
		for i := range l {
			switch i % 5 {
			case 0:
				l[i] = r.NormFloat64() * 4
			case 1:
				l[i] = -r.Float64() * 800
			case 2:
				l[i] = edges[r.IntN(len(edges))]
			default:
				l[i] = -r.ExpFloat64()
			}
		}
		out = append(out, l)
	}
	return out
}

// TestWeighAssemblyIsPortable: the four-lane kernel gives every weight the
// portable function's bits, for tops and temperatures across their range.
func TestWeighAssemblyIsPortable(t *testing.T) {
	if weighKernel == nil {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatal("CI's machine has AVX2: the assembly kernel must be compared")
		}
		t.Skip("no AVX2: only the portable function runs here")
	}
	for _, in := range weightInputs() {
		for _, tt := range [][2]float64{{0, 1}, {12, 0.8}, {-3, 0.05}, {700, 100}, {1e-3, 1.7}} {
			top, temp := tt[0], tt[1]
			got := append([]float64(nil), in...)
			weighAll(got, top, temp)
			for i, v := range in {
				want := expWeight((v - top) / temp)
				if math.Float64bits(got[i]) != math.Float64bits(want) && !(got[i] != got[i] && want != want) {
					t.Fatalf("weight of %g (top %g, T %g): kernel %g (%#x), portable %g (%#x)", v, top, temp, got[i], math.Float64bits(got[i]), want, math.Float64bits(want))
				}
			}
		}
	}
}

// TestDrawIsTheFirstRunningSumAboveU: the bisection over running sums
// picks what a linear scan picks — the first id whose running sum of
// weights, in id order, exceeds u — with stretches of zero weights
// (-Inf logits), a NaN logit (the last id), and vocabularies on both
// sides of parallelDraw.
func TestDrawIsTheFirstRunningSumAboveU(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 2, 5, 300, parallelDraw + 3} {
		for trial := range 20 {
			logits := make([]float32, n)
			for i := range logits {
				logits[i] = float32(r.NormFloat64() * 2)
				if r.IntN(3) == 0 {
					logits[i] = float32(math.Inf(-1))
				}
			}
			logits[r.IntN(n)] = 1 // at least one finite
			if trial == 19 {
				logits[r.IntN(n)] = float32(math.NaN())
			}
			p := Params{Temperature: 0.3 + r.Float64(), Seed: r.Uint64()}
			for pos := uint64(1); pos <= 25; pos++ {
				want := linearDraw(logits, p, pos)
				var s Sampler
				if got := s.Sample(logits, p, nil, pos); got != want {
					t.Fatalf("n=%d trial %d position %d: drew %d, a linear scan %d", n, trial, pos, got, want)
				}
				s.Parallel = goParallel // the chunked weights, from parallelDraw on
				if got := s.Sample(logits, p, nil, pos); got != want {
					t.Fatalf("n=%d trial %d position %d: drew %d with Parallel, a linear scan %d", n, trial, pos, got, want)
				}
			}
		}
	}
}

// linearDraw is the draw over every id by definition.
func linearDraw(logits []float32, p Params, pos uint64) int {
	top := float64(logits[0])
	for _, v := range logits {
		top = max(top, float64(v))
	}
	w := make([]float64, len(logits))
	var sum float64
	for i, v := range logits {
		w[i] = expWeight((float64(v) - top) / p.Temperature)
		sum += w[i]
	}
	u := Uniform(p.Seed, pos) * sum
	var cum float64
	for i := range w {
		cum += w[i]
		if u < cum {
			return i
		}
	}
	return len(w) - 1
}

// goParallel runs f(0) … f(n-1) on goroutines of their own.
func goParallel(n int, f func(int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}
