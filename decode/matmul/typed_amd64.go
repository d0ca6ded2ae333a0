//go:build amd64 && !purego

package matmul

// The decoders convert 8 values a step (16 with AVX-512): halves with
// VCVTPH2PS (F16C), bfloat16 by a 16-bit shift, Q8_0 blocks of 32 by
// sign extension, conversion and one multiply by the block's scale —
// each value exactly as the generic decoders compute it.

//go:noescape
func f16AVX2(dst *float32, src *byte, n8 uintptr)

//go:noescape
func bf16AVX2(dst *float32, src *byte, n8 uintptr)

//go:noescape
func q8AVX2(dst *float32, src *byte, blocks uintptr)

//go:noescape
func dotRowQ8AVX2(x *float32, w *byte, rowBytes, blocks, rows uintptr, out *float32)

//go:noescape
func dotRowF16AVX2(x *float32, w *byte, rowBytes, n8, rows uintptr, out *float32)

//go:noescape
func dotRowBF16AVX2(x *float32, w *byte, rowBytes, n8, rows uintptr, out *float32)

//go:noescape
func f16AVX512(dst *float32, src *byte, n16 uintptr)

//go:noescape
func bf16AVX512(dst *float32, src *byte, n16 uintptr)

//go:noescape
func q8AVX512(dst *float32, src *byte, blocks uintptr)

// wide runs an assembly decoder over the whole steps of step values and
// the generic one over the rest.
func wide(step, inBytes int, asm func(*float32, *byte, uintptr), rest func([]float32, []byte)) func([]float32, []byte) {
	return func(dst []float32, src []byte) {
		n := len(dst) / step
		if n > 0 {
			_ = src[n*inBytes-1]
			asm(&dst[0], &src[0], uintptr(n))
		}
		rest(dst[n*step:], src[n*inBytes:])
	}
}

var avx2Typed = typedKernels{
	f16:      wide(8, 16, f16AVX2, f16Generic),
	bf16:     wide(8, 16, bf16AVX2, bf16Generic),
	q8:       wide(32, 34, q8AVX2, q8Generic),
	dotRowQ8: dotRowQ8AVX2,
	dotRow16: [2]func(x *float32, w *byte, rowBytes, n8, rows uintptr, out *float32){dotRowF16AVX2, dotRowBF16AVX2},
}

var avx512Typed = typedKernels{
	f16:      wide(16, 32, f16AVX512, f16Generic),
	bf16:     wide(16, 32, bf16AVX512, bf16Generic),
	q8:       wide(32, 34, q8AVX512, q8Generic),
	dotRowQ8: dotRowQ8AVX2,
	dotRow16: [2]func(x *float32, w *byte, rowBytes, n8, rows uintptr, out *float32){dotRowF16AVX2, dotRowBF16AVX2},
}
