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

// TestDotRowQ8IsDecodedDotRows: the fused Q8_0 kernel's sums are
// DotRows' over the decoded rows, bit for bit, for every row length.
func TestDotRowQ8IsDecodedDotRows(t *testing.T) {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA || !cpu.X86.HasF16C {
		t.Skip("no AVX2, FMA and F16C")
	}
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{32, 64, 96, 384, 512, 544, 1024, 2048} {
		const rows = 9
		w := randomTyped(r, Q8_0, rows, n, true)
		dec := make([]float32, rows*n)
		w.DecodeRows(dec, n, 0, rows)
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		want, got := make([]float32, rows), make([]float32, rows)
		DotRows(want, x, dec, n)
		dotRowQ8AVX2(&x[0], &w.Raw[0], uintptr(Q8_0.RowBytes(n)), uintptr(n/32), rows, &got[0])
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d row %d: fused %v, decoded %v", n, i, got[i], want[i])
			}
		}
	}
}
