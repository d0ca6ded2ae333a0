package matmul

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
)

// ulps is how many float32 steps lie between got and want.
func ulps(got float32, want float64) float64 {
	w := float32(want)
	step := math.Abs(float64(math.Nextafter32(w, float32(math.Inf(1)))) - float64(w))
	return math.Abs(float64(got)-want) / step
}

func TestExpIsWithinTwoULPs(t *testing.T) {
	worst, at := 0.0, float32(0)
	check := func(x float32) {
		if u := ulps(expNeg(x), math.Exp(float64(x))); u > worst {
			worst, at = u, x
		}
	}
	for x := float32(-87); x <= 0; x += 1.0 / 1024 {
		check(x)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		check(-87 * r.Float32())
	}
	if worst > 2 {
		t.Fatalf("expNeg(%g) is %.2f ulps from e^x", at, worst)
	}
	t.Logf("worst: %.2f ulps at %g", worst, at)
	for _, c := range []struct{ x, want float32 }{
		{0, 1}, {float32(math.Copysign(0, -1)), 1}, {5, 1}, {float32(math.Inf(1)), 1},
		{-1000, expNeg(-87)}, {float32(math.Inf(-1)), expNeg(-87)},
	} {
		if got := expNeg(c.x); got != c.want {
			t.Errorf("expNeg(%g) = %g, want %g", c.x, got, c.want)
		}
	}
	if v := expNeg(float32(math.NaN())); v == v {
		t.Errorf("expNeg(NaN) = %g", v)
	}
}

func TestSiLUMulIsSiLU(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		a := randVec(r, 4099)
		for i := range a {
			a[i] *= 8
		}
		b := randVec(r, len(a))
		got := append([]float32(nil), a...)
		SiLUMul(got, b)
		for i, h := range a {
			want := float64(h) / (1 + math.Exp(-float64(h))) * float64(b[i])
			if u := ulps(got[i], want); u > 4 {
				t.Fatalf("silu(%g)·%g = %g, want %g (%.1f ulps)", h, b[i], got[i], want, u)
			}
		}
	})
}

// specials are the inputs where clamps, signs and blends decide.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-30, 87, -87, 88.8, -88.8, 100, -100, 1e30, -1e30,
	float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32}

func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// elementwiseInputs are random vectors of every length up to 70 and a few
// long ones, with the specials scattered in.
func elementwiseInputs(seed uint64) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	var out [][]float32
	for _, n := range append([]int{1024, 1031, 4096}, func() []int {
		var s []int
		for n := 1; n <= 70; n++ {
			s = append(s, n)
		}
		return s
	}()...) {
		v := randVec(r, n)
		for i := range v {
			v[i] *= 20
			if r.IntN(8) == 0 {
				v[i] = specials[r.IntN(len(specials))]
			}
		}
		out = append(out, v)
	}
	return out
}

// TestElementwiseAssemblyIsPortable checks that the assembly kernels give
// the portable functions' bits: the exponential has no fused operation, so
// they must agree everywhere, specials included.
func TestElementwiseAssemblyIsPortable(t *testing.T) {
	if !avx2Available() {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatal("CI's machine has AVX2+FMA: the assembly kernels must be compared")
		}
		t.Skip("no AVX2+FMA: only the portable kernels run here")
	}
	gates := elementwiseInputs(2)[2] // 4096 floats
	for _, in := range elementwiseInputs(1) {
		n8 := uintptr(len(in) / 8)
		if n8 == 0 {
			continue
		}
		b := gates[:len(in)]
		x, y := append([]float32(nil), in...), append([]float32(nil), in...)
		siluMulAVX2(&x[0], &b[0], n8)
		siluMulGeneric(&y[0], &b[0], n8)
		for i := range x {
			if !sameBits(x[i], y[i]) {
				t.Fatalf("silu(%g)·%g: assembly %g (%#x), portable %g (%#x)", in[i], b[i], x[i], math.Float32bits(x[i]), y[i], math.Float32bits(y[i]))
			}
		}
		for _, shift := range []float32{0, 3.5, -2, 40} {
			x, y := append([]float32(nil), in...), append([]float32(nil), in...)
			sx, sy := expSumAVX2(&x[0], shift, n8), expSumGeneric(&y[0], shift, n8)
			for i := range x {
				if !sameBits(x[i], y[i]) {
					t.Fatalf("exp(%g - %g): assembly %g, portable %g", in[i], shift, x[i], y[i])
				}
			}
			if !sameBits(sx, sy) {
				t.Fatalf("sum of %d exponentials: assembly %g, portable %g", len(in), sx, sy)
			}
			x, y = append([]float32(nil), in...), append([]float32(nil), in...)
			mx, my := divMaxAVX2(&x[0], shift+0.5, n8), divMaxGeneric(&y[0], shift+0.5, n8)
			for i := range x {
				if !sameBits(x[i], y[i]) {
					t.Fatalf("%g / %g: assembly %g, portable %g", in[i], shift+0.5, x[i], y[i])
				}
			}
			if !sameBits(mx, my) {
				t.Fatalf("max of %d quotients: assembly %g, portable %g", len(in), mx, my)
			}
		}
	}
}

// TestSoftmaxExpAndDivMax checks the exported functions, tails included,
// against the definitions they state.
func TestSoftmaxExpAndDivMax(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(8, 9))
		for n := 0; n <= 67; n++ {
			s := randVec(r, n)
			want := float32(math.Inf(-1))
			for _, v := range s {
				want = max(want, v/3)
			}
			d := append([]float32(nil), s...)
			if m := DivMax(d, 3); m != want {
				t.Fatalf("n=%d: DivMax = %g, want %g", n, m, want)
			}
			for i, v := range s {
				if d[i] != v/3 {
					t.Fatalf("n=%d: DivMax left %g at %d, want %g", n, d[i], i, v/3)
				}
			}
			var lanes [8]float32
			e := append([]float32(nil), d...)
			sum := SoftmaxExp(e, want)
			for i := range e {
				if e[i] != expNeg(d[i]-want) {
					t.Fatalf("n=%d: SoftmaxExp left %g at %d, want %g", n, e[i], i, expNeg(d[i]-want))
				}
				if i < n/8*8 {
					lanes[i%8] += e[i]
				}
			}
			wantSum := hsum8(lanes[:])
			for _, v := range e[n/8*8:] {
				wantSum += v
			}
			if sum != wantSum {
				t.Fatalf("n=%d: SoftmaxExp sum %g, want %g", n, sum, wantSum)
			}
		}
	})
}

// TestAxpyRowsIsAxpyPerRow checks the attention value sum against one Axpy
// per row in order, for head sizes with and without tails and row counts
// around a KV block's.
func TestAxpyRowsIsAxpyPerRow(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(10, 11))
		for _, n := range []int{1, 7, 8, 16, 24, 40, 48, 64, 72, 96, 100, 128} {
			for _, rows := range []int{0, 1, 3, 16, 17} {
				stride := n + r.IntN(3)*8
				v := randVec(r, max(rows, 1)*stride)
				a := randVec(r, rows)
				start := randVec(r, n)
				got, want := append([]float32(nil), start...), append([]float32(nil), start...)
				AxpyRows(got, a, v, stride)
				for j := range a {
					Axpy(want, a[j], v[j*stride:][:n])
				}
				for i := range got {
					if !sameBits(got[i], want[i]) {
						t.Fatalf("n=%d rows=%d: element %d is %g, one Axpy per row gives %g", n, rows, i, got[i], want[i])
					}
				}
			}
		}
	})
}
