//go:build amd64 && !purego

package matmul

import (
	"math"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/cpu"
)

func addArchSets(sets map[string]typedKernels) {
	if cpu.X86.HasAVX2 && cpu.X86.HasF16C {
		sets["avx2"] = avx2Typed
	}
	if hasAVX512 && cpu.X86.HasF16C {
		sets["avx512"] = avx512Typed
	}
}

// TestFusedRowsAreDecodedDotRows: the fused kernels' sums (Q8_0, F16,
// BF16) are DotRows' over the decoded rows, bit for bit, for every row
// length.
func TestFusedRowsAreDecodedDotRows(t *testing.T) {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA || !cpu.X86.HasF16C {
		t.Skip("no AVX2, FMA and F16C")
	}
	r := rand.New(rand.NewPCG(7, 8))
	kernels := map[Type]func(x *float32, w *byte, rowBytes, steps, rows uintptr, out *float32){Q8_0: dotRowQ8AVX2, F16: dotRowF16AVX2, BF16: dotRowBF16AVX2}
	for typ, k := range kernels {
		for _, n := range []int{32, 64, 96, 384, 512, 544, 1024, 2048} {
			const rows = 9
			w := randomTyped(r, typ, rows, n, true)
			dec := make([]float32, rows*n)
			w.DecodeRows(dec, n, 0, rows)
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			steps := n / 8
			if typ == Q8_0 {
				steps = n / 32
			}
			want, got := make([]float32, rows), make([]float32, rows)
			DotRows(want, x, dec, n)
			k(&x[0], &w.Raw[0], uintptr(typ.RowBytes(n)), uintptr(steps), rows, &got[0])
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s n=%d row %d: fused %v, decoded %v", typ, n, i, got[i], want[i])
				}
			}
		}
	}
}
