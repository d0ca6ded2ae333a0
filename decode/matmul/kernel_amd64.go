//go:build amd64 && !purego

package matmul

import "golang.org/x/sys/cpu"

//go:noescape
func dot4x3AVX2(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, out *float32, ostride uintptr, pf *float32)

//go:noescape
func dot1x4AVX2(x *float32, w *float32, wstride uintptr, n8 uintptr, out *[4]float32, pf *float32)

//go:noescape
func dotRowAVX2(x *float32, w *float32, wstride uintptr, n8 uintptr, rows uintptr, out *float32)

//go:noescape
func axpyAVX2(dst *float32, a float32, x *float32, n8 uintptr)

var avx2Kernels = kernels{
	name:   "avx2fma-lane8",
	dot4x3: dot4x3AVX2,
	dot1x4: dot1x4AVX2,
	dotRow: dotRowAVX2,
	axpy:   axpyAVX2,
	sum:    sumAVX2,

	siluMul:  siluMulAVX2,
	expSum:   expSumAVX2,
	divMax:   divMaxAVX2,
	axpyRows: axpyRowsAVX2,

	typed: genericTyped, // the F16C decoders where the CPU has F16C (init)
}

//go:noescape
func siluMulAVX2(a, b *float32, n8 uintptr)

//go:noescape
func expSumAVX2(p *float32, shift float32, n8 uintptr) float32

//go:noescape
func divMaxAVX2(p *float32, d float32, n8 uintptr) float32

//go:noescape
func axpyRowsAVX2(dst, a, v *float32, vstride, rows, n8 uintptr)

//go:noescape
func dot8x3AVX512(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, out *float32, ostride uintptr, pf *float32)

// hasAVX512 is what dot8x3AVX512 needs: 512-bit registers (F), their
// 256-bit forms for the high registers (VL) and the 256-bit inserts and
// broadcasts (DQ).
var hasAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512DQ

func init() {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		active = avx2Kernels
		if hasAVX512 {
			active.dot8x3 = dot8x3AVX512
		}
		switch {
		case hasAVX512 && cpu.X86.HasF16C:
			active.typed = avx512Typed
		case cpu.X86.HasF16C:
			active.typed = avx2Typed
		}
	}
}

//go:noescape
func sumAVX2(p *float32, n32 uintptr) float32
