//go:build amd64 && !purego

#include "textflag.h"

// The kernels keep one 8-lane accumulator per (token, row) pair and walk the
// inner dimension in 8-float steps with one FMA per step, so every dot
// product sees the same sequence of roundings whichever kernel computed it.
// The caller folds the lanes in a fixed order (see hsum8).

// func dot4x3AVX2(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, acc *[96]float32, pf *float32)
//
// pf is prefetched at 96 bytes per step: the caller points it at the next
// three weight rows, which streaming from DRAM would otherwise stall on.
TEXT ·dot4x3AVX2(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R8
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), R9
	MOVQ n8+32(FP), CX
	MOVQ acc+40(FP), DX

	LEAQ (SI)(R8*1), R10
	LEAQ (SI)(R8*2), R11
	LEAQ (R10)(R8*2), R12
	LEAQ (DI)(R9*1), R13
	LEAQ (DI)(R9*2), BX
	MOVQ pf+48(FP), R8
	XORQ R9, R9

	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15

	XORQ AX, AX
	TESTQ CX, CX
	JZ   store4x3

loop4x3:
	PREFETCHT0 (R8)(R9*1)
	PREFETCHT0 64(R8)(R9*1)
	ADDQ $96, R9
	VMOVUPS (DI)(AX*1), Y0
	VMOVUPS (R13)(AX*1), Y1
	VMOVUPS (BX)(AX*1), Y2

	VMOVUPS (SI)(AX*1), Y3
	VFMADD231PS Y0, Y3, Y4
	VFMADD231PS Y1, Y3, Y5
	VFMADD231PS Y2, Y3, Y6

	VMOVUPS (R10)(AX*1), Y3
	VFMADD231PS Y0, Y3, Y7
	VFMADD231PS Y1, Y3, Y8
	VFMADD231PS Y2, Y3, Y9

	VMOVUPS (R11)(AX*1), Y3
	VFMADD231PS Y0, Y3, Y10
	VFMADD231PS Y1, Y3, Y11
	VFMADD231PS Y2, Y3, Y12

	VMOVUPS (R12)(AX*1), Y3
	VFMADD231PS Y0, Y3, Y13
	VFMADD231PS Y1, Y3, Y14
	VFMADD231PS Y2, Y3, Y15

	ADDQ $32, AX
	DECQ CX
	JNZ  loop4x3

store4x3:
	VMOVUPS Y4, 0(DX)
	VMOVUPS Y5, 32(DX)
	VMOVUPS Y6, 64(DX)
	VMOVUPS Y7, 96(DX)
	VMOVUPS Y8, 128(DX)
	VMOVUPS Y9, 160(DX)
	VMOVUPS Y10, 192(DX)
	VMOVUPS Y11, 224(DX)
	VMOVUPS Y12, 256(DX)
	VMOVUPS Y13, 288(DX)
	VMOVUPS Y14, 320(DX)
	VMOVUPS Y15, 352(DX)
	VZEROUPPER
	RET

// func dot1x4AVX2(x *float32, w *float32, wstride uintptr, n8 uintptr, acc *[32]float32)
TEXT ·dot1x4AVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ wstride+16(FP), R9
	MOVQ n8+24(FP), CX
	MOVQ acc+32(FP), DX

	LEAQ (DI)(R9*1), R10
	LEAQ (DI)(R9*2), R11
	LEAQ (R10)(R9*2), R12

	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

	XORQ AX, AX
	TESTQ CX, CX
	JZ   store1x4

loop1x4:
	VMOVUPS (SI)(AX*1), Y0
	VFMADD231PS (DI)(AX*1), Y0, Y4
	VFMADD231PS (R10)(AX*1), Y0, Y5
	VFMADD231PS (R11)(AX*1), Y0, Y6
	VFMADD231PS (R12)(AX*1), Y0, Y7
	ADDQ $32, AX
	DECQ CX
	JNZ  loop1x4

store1x4:
	VMOVUPS Y4, 0(DX)
	VMOVUPS Y5, 32(DX)
	VMOVUPS Y6, 64(DX)
	VMOVUPS Y7, 96(DX)
	VZEROUPPER
	RET

// func axpyAVX2(dst *float32, a float32, x *float32, n8 uintptr)
// dst[i] = fma(a, x[i], dst[i]) for i < 8*n8.
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	VBROADCASTSS a+8(FP), Y1
	MOVQ x+16(FP), SI
	MOVQ n8+24(FP), CX
	XORQ AX, AX
	TESTQ CX, CX
	JZ   doneaxpy

loopaxpy:
	VMOVUPS (DI)(AX*1), Y0
	VFMADD231PS (SI)(AX*1), Y1, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	DECQ CX
	JNZ  loopaxpy

doneaxpy:
	VZEROUPPER
	RET
