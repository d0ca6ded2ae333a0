//go:build amd64 && !purego

#include "textflag.h"

#include "hsum_amd64.h"

// The kernels keep one 8-lane accumulator per (token, row) pair and walk the
// inner dimension in 8-float steps with one FMA per step, so every dot
// product sees the same sequence of roundings whichever kernel computed it;
// they fold the lanes in hsum8's order (HSUM8).

// func dot4x3AVX2(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, out *float32, ostride uintptr, pf *float32)
//
// Four tokens times three rows; token i's sum for row j, its lanes folded as
// hsum8 does, is stored at out + i*ostride + 4*j.
//
// pf is prefetched at 96 bytes per step: the caller points it at the next
// three weight rows, which streaming from DRAM would otherwise stall on.
// They are prefetched into L2 (PREFETCHT1), not L1: a batch of eight or more
// tokens keeps its activations in L1 (16 tokens of 384 floats are 24 KB),
// and the next rows brought into L1 as well pushed them out. 16 tokens times
// 55 MB of 384-float rows, one core of a Zen 4: 53 GFLOP/s with PREFETCHT0,
// 83 with PREFETCHT1; the same rows from cache run at ~95.
TEXT ·dot4x3AVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R8
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), R9
	MOVQ n8+32(FP), CX
	MOVQ out+40(FP), DX

	LEAQ (SI)(R8*1), R10
	LEAQ (SI)(R8*2), R11
	LEAQ (R10)(R8*2), R12
	LEAQ (DI)(R9*1), R13
	LEAQ (DI)(R9*2), BX
	MOVQ pf+56(FP), R8
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
	PREFETCHT1 (R8)(R9*1)
	PREFETCHT1 64(R8)(R9*1)
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
	MOVQ ostride+48(FP), CX
	STORE3(Y4, X4, Y5, X5, Y6, X6, DX)
	ADDQ CX, DX
	STORE3(Y7, X7, Y8, X8, Y9, X9, DX)
	ADDQ CX, DX
	STORE3(Y10, X10, Y11, X11, Y12, X12, DX)
	ADDQ CX, DX
	STORE3(Y13, X13, Y14, X14, Y15, X15, DX)
	VZEROUPPER
	RET

// func dot1x4AVX2(x *float32, w *float32, wstride uintptr, n8 uintptr, out *[4]float32, pf *float32)
//
// Four rows against one activation vector, each row's lanes folded as hsum8
// does — (l0+l4 + l2+l6) + (l1+l5 + l3+l7) — and stored to out. pf is
// prefetched at 128 bytes per step, four rows' worth over the loop: the
// caller points it at the next four rows.
TEXT ·dot1x4AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ wstride+16(FP), R9
	MOVQ n8+24(FP), CX
	MOVQ out+32(FP), DX
	MOVQ pf+40(FP), R8

	LEAQ (DI)(R9*1), R10
	LEAQ (DI)(R9*2), R11
	LEAQ (R10)(R9*2), R12

	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

	XORQ AX, AX
	XORQ BX, BX
	TESTQ CX, CX
	JZ   store1x4

loop1x4:
	PREFETCHT0 (R8)(BX*1)
	PREFETCHT0 64(R8)(BX*1)
	ADDQ $128, BX
	VMOVUPS (SI)(AX*1), Y0
	VFMADD231PS (DI)(AX*1), Y0, Y4
	VFMADD231PS (R10)(AX*1), Y0, Y5
	VFMADD231PS (R11)(AX*1), Y0, Y6
	VFMADD231PS (R12)(AX*1), Y0, Y7
	ADDQ $32, AX
	DECQ CX
	JNZ  loop1x4

store1x4:
	HSUM8(Y4, X4, X0)
	VMOVSS X4, 0(DX)
	HSUM8(Y5, X5, X0)
	VMOVSS X5, 4(DX)
	HSUM8(Y6, X6, X0)
	VMOVSS X6, 8(DX)
	HSUM8(Y7, X7, X0)
	VMOVSS X7, 12(DX)
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

// func sumAVX2(p *float32, n32 uintptr) float32
// Reads 32 floats per step into four accumulators: the read-only streaming
// baseline the decode kernels are measured against.
TEXT ·sumAVX2(SB), NOSPLIT, $0-20
	MOVQ p+0(FP), SI
	MOVQ n32+8(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	TESTQ CX, CX
	JZ   donesum

loopsum:
	VADDPS 0(SI), Y0, Y0
	VADDPS 32(SI), Y1, Y1
	VADDPS 64(SI), Y2, Y2
	VADDPS 96(SI), Y3, Y3
	ADDQ $128, SI
	DECQ CX
	JNZ  loopsum

donesum:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+16(FP)
	RET

// func dotRowAVX2(x *float32, w *float32, wstride uintptr, n8 uintptr, rows uintptr, out *float32)
//
// rows rows against one activation vector, one row at a time, each in one
// accumulator folded as hsum8 does and stored to out[r]: the bits of
// dot1x4. Where dot1x4 reads four rows side by side — four short streams,
// which the hardware prefetcher follows badly when rows are short — this
// reads the weights in address order; the next rows' independent chains
// overlap the current one's in the core's out-of-order window.
TEXT ·dotRowAVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ wstride+16(FP), R9
	MOVQ n8+24(FP), R11
	MOVQ rows+32(FP), R10
	MOVQ out+40(FP), DX
	TESTQ R10, R10
	JZ   donerow

onerow:
	VXORPS Y4, Y4, Y4
	XORQ AX, AX
	MOVQ R11, CX
	SHRQ $2, CX
	JZ   rowrest

rowquad:
	VMOVUPS (SI)(AX*1), Y0
	VFMADD231PS (DI)(AX*1), Y0, Y4
	VMOVUPS 32(SI)(AX*1), Y1
	VFMADD231PS 32(DI)(AX*1), Y1, Y4
	VMOVUPS 64(SI)(AX*1), Y2
	VFMADD231PS 64(DI)(AX*1), Y2, Y4
	VMOVUPS 96(SI)(AX*1), Y3
	VFMADD231PS 96(DI)(AX*1), Y3, Y4
	ADDQ $128, AX
	DECQ CX
	JNZ  rowquad

rowrest:
	MOVQ R11, CX
	ANDQ $3, CX
	JZ   rowfold

rowone:
	VMOVUPS (SI)(AX*1), Y0
	VFMADD231PS (DI)(AX*1), Y0, Y4
	ADDQ $32, AX
	DECQ CX
	JNZ  rowone

rowfold:
	HSUM8(Y4, X4, X0)
	VMOVSS X4, 0(DX)
	ADDQ $4, DX
	ADDQ R9, DI
	DECQ R10
	JNZ  onerow

donerow:
	VZEROUPPER
	RET
