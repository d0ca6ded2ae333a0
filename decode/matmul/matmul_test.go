package matmul

import (
	"math"
	"math/rand/v2"
	"testing"
)

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func naive(x, w []float32, T, m, n int) []float64 {
	out := make([]float64, T*m)
	for t := 0; t < T; t++ {
		for j := 0; j < m; j++ {
			var s float64
			for i := 0; i < n; i++ {
				s += float64(x[t*n+i]) * float64(w[j*n+i])
			}
			out[t*m+j] = s
		}
	}
	return out
}

func forEachKernel(t *testing.T, f func(t *testing.T)) {
	t.Run(KernelName(), f)
	restore := UseGeneric()
	defer restore()
	t.Run(KernelName(), f)
}

func TestKernelIsAVX2OnThisMachine(t *testing.T) {
	if avx2Available() && KernelName() != "avx2fma-lane8" {
		t.Fatalf("CPU has AVX2+FMA but kernel is %q", KernelName())
	}
}

// TestBatchInvariance checks that a row's products do not depend on how many
// other rows are in the batch, nor on its position in the batch, nor on the
// tile that computed them.
func TestBatchInvariance(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, dims := range [][2]int{{384, 384}, {172, 64}, {13, 7}, {1024, 40}, {5, 3}} {
			m, n := dims[0], dims[1]
			w := randVec(r, m*n)
			const T = 37
			x := randVec(r, T*n)
			full := make([]float32, T*m)
			MatMul(full, x, T, w, m, n)
			ref := naive(x, w, T, m, n)
			for tok := 0; tok < T; tok++ {
				one := make([]float32, m)
				MatMul(one, x[tok*n:(tok+1)*n], 1, w, m, n)
				rows := make([]float32, m)
				DotRows(rows, x[tok*n:(tok+1)*n], w, n)
				for j := 0; j < m; j++ {
					got := full[tok*m+j]
					if math.Float32bits(one[j]) != math.Float32bits(got) || math.Float32bits(rows[j]) != math.Float32bits(got) {
						t.Fatalf("m=%d n=%d token %d row %d: batch %x, alone %x, DotRows %x", m, n, tok, j, math.Float32bits(got), math.Float32bits(one[j]), math.Float32bits(rows[j]))
					}
					if d := math.Abs(float64(got) - ref[tok*m+j]); d > 1e-3*math.Sqrt(float64(n)) {
						t.Fatalf("m=%d n=%d: %v vs float64 reference %v", m, n, got, ref[tok*m+j])
					}
				}
			}
			// A batch that starts at an odd offset puts every row in another tile.
			shifted := make([]float32, (T-3)*m)
			MatMul(shifted, x[3*n:], T-3, w, m, n)
			for i := range shifted {
				if math.Float32bits(shifted[i]) != math.Float32bits(full[3*m+i]) {
					t.Fatalf("m=%d n=%d: shifted batch differs at %d", m, n, i)
				}
			}
		}
	})
}

func TestAxpy(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, n := range []int{0, 1, 7, 8, 9, 64, 100} {
			x := randVec(r, n)
			d := randVec(r, n)
			want := make([]float64, n)
			for i := range want {
				want[i] = float64(d[i]) + 0.5*float64(x[i])
			}
			Axpy(d, 0.5, x)
			for i := range d {
				if math.Abs(float64(d[i])-want[i]) > 1e-5 {
					t.Fatalf("n=%d i=%d: %v want %v", n, i, d[i], want[i])
				}
			}
		}
	})
}

func TestKernelsAgreeClosely(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	m, n := 96, 200
	w := randVec(r, m*n)
	x := randVec(r, 8*n)
	a := make([]float32, 8*m)
	MatMul(a, x, 8, w, m, n)
	restore := UseGeneric()
	b := make([]float32, 8*m)
	MatMul(b, x, 8, w, m, n)
	restore()
	for i := range a {
		if d := math.Abs(float64(a[i] - b[i])); d > 1e-4*(1+math.Abs(float64(a[i]))) {
			t.Fatalf("element %d: %v vs generic %v", i, a[i], b[i])
		}
	}
}

// TestWideKernelRoundsAsTheNarrow: the eight-token kernel, where the CPU
// has it, gives every product the bits of the four-token kernel.
func TestWideKernelRoundsAsTheNarrow(t *testing.T) {
	if active.dot8x3 == nil {
		if wideAvailable() {
			t.Fatal("the CPU has AVX-512 but the eight-token kernel is not in use")
		}
		t.Skip("no eight-token kernel on this CPU")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, dims := range [][3]int{{8, 384, 384}, {16, 1024, 384}, {19, 13, 7}, {40, 172, 64}, {9, 5, 3}, {24, 96, 1024}, {16, 48, 768}, {24, 96, 764}} {
		T, m, n := dims[0], dims[1], dims[2]
		w, x := randVec(r, m*n), randVec(r, T*n)
		wide, narrow := make([]float32, T*m), make([]float32, T*m)
		MatMul(wide, x, T, w, m, n)
		saved := active.dot8x3
		active.dot8x3 = nil
		MatMul(narrow, x, T, w, m, n)
		active.dot8x3 = saved
		for i := range wide {
			if math.Float32bits(wide[i]) != math.Float32bits(narrow[i]) {
				t.Fatalf("T=%d m=%d n=%d: output %d is %x with the wide kernel, %x without", T, m, n, i, math.Float32bits(wide[i]), math.Float32bits(narrow[i]))
			}
		}
	}
}

// TestRowByRowRoundsAsFourRows: DotRows reading short rows one after the
// other (dotRow) gives every row the bits of the four-rows-side-by-side
// kernel, for every length (whole 8-float steps or not, whole quads of
// steps or not, quads with steps left over: 40, 136, 139, 504), stride
// and row count.
func TestRowByRowRoundsAsFourRows(t *testing.T) {
	if active.dotRow == nil {
		if avx2Available() {
			t.Fatal("the CPU has AVX2+FMA but the row-by-row kernel is not in use")
		}
		t.Skip("no row-by-row kernel in this kernel set")
	}
	r := rand.New(rand.NewPCG(7, 8))
	for _, dims := range [][3]int{{1, 8, 8}, {5, 24, 24}, {13, 7, 7}, {64, 64, 96}, {97, 288, 288}, {12, 384, 400}, {7, 100, 101}, {33, 512, 512}, {3, 0, 4},
		{9, 40, 40}, {6, 136, 149}, {5, 139, 139}, {4, 504, 504}} {
		rows, n, stride := dims[0], dims[1], dims[2]
		w, x := randVec(r, rows*stride+n), randVec(r, max(n, 1))[:n]
		byRow, four := make([]float32, rows), make([]float32, rows)
		DotRows(byRow, x, w, stride)
		saved := active.dotRow
		active.dotRow = nil
		DotRows(four, x, w, stride)
		active.dotRow = saved
		for i := range byRow {
			if math.Float32bits(byRow[i]) != math.Float32bits(four[i]) {
				t.Fatalf("rows=%d n=%d stride=%d: row %d is %x read row by row, %x four side by side", rows, n, stride, i, math.Float32bits(byRow[i]), math.Float32bits(four[i]))
			}
		}
	}
}

// TestStridedProductIsDot: every element of a strided product has the bits
// of Dot over the same two rows, for tokens and rows that fill tiles or
// leave some over, lengths with and without 8-float tails, and strides
// wider than the rows (outputs and inputs past each row left untouched).
func TestStridedProductIsDot(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, T := range []int{1, 3, 4, 8, 9, 12, 13, 16} {
			for _, m := range []int{1, 2, 3, 16, 17} {
				for _, n := range []int{5, 12, 16, 64, 70} {
					xstride, wstride, ostride := n+r.IntN(9), n+r.IntN(200), m+r.IntN(5)
					x, w := randVec(r, (T-1)*xstride+n), randVec(r, (m-1)*wstride+n)
					out := make([]float32, (T-1)*ostride+m+1)
					const sentinel = float32(-12345)
					for i := range out {
						out[i] = sentinel
					}
					MatMulStrided(out, ostride, x, xstride, T, w, wstride, m, n)
					for tok := 0; tok < T; tok++ {
						for j := 0; j < m; j++ {
							want := Dot(x[tok*xstride:tok*xstride+n], w[j*wstride:j*wstride+n])
							if got := out[tok*ostride+j]; math.Float32bits(got) != math.Float32bits(want) {
								t.Fatalf("T=%d m=%d n=%d strides %d/%d/%d: out[%d][%d] = %x, Dot = %x", T, m, n, xstride, wstride, ostride, tok, j, math.Float32bits(got), math.Float32bits(want))
							}
						}
						for j := m; j < ostride && tok*ostride+j < len(out); j++ {
							if out[tok*ostride+j] != sentinel {
								t.Fatalf("T=%d m=%d n=%d: out[%d][%d] past the row was written", T, m, n, tok, j)
							}
						}
					}
				}
			}
		}
	})
}
