package matmul

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatMul reports the kernel's effective GFLOP/s for a decode-sized
// product at several batch sizes; compare with BenchmarkMemcpy of the same run.
func BenchmarkMatMul(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	m, n := 1024, 384
	w := randVec(r, m*n)
	for _, T := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			x := randVec(r, T*n)
			out := make([]float32, T*m)
			for b.Loop() {
				MatMul(out, x, T, w, m, n)
			}
			b.ReportMetric(float64(2*T*m*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkMemcpy is the bandwidth baseline for the matrix kernel.
func BenchmarkMemcpy(b *testing.B) {
	src := make([]byte, 64<<20)
	dst := make([]byte, len(src))
	// Touch both once so the loop measures copying, not page faults.
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkWideKernel compares the eight-token kernel with the four-token
// one on the same product (run with -count to interleave them).
func BenchmarkWideKernel(b *testing.B) {
	if active.dot8x3 == nil {
		b.Skip("no eight-token kernel on this CPU")
	}
	r := rand.New(rand.NewPCG(1, 1))
	m, n := 1024, 384
	w := randVec(r, m*n)
	for _, T := range []int{16, 64} {
		x := randVec(r, T*n)
		out := make([]float32, T*m)
		for _, wide := range []bool{true, false} {
			b.Run(fmt.Sprintf("T=%d/wide=%v", T, wide), func(b *testing.B) {
				saved := active.dot8x3
				if !wide {
					active.dot8x3 = nil
				}
				defer func() { active.dot8x3 = saved }()
				for b.Loop() {
					MatMul(out, x, T, w, m, n)
				}
				b.ReportMetric(float64(2*T*m*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
