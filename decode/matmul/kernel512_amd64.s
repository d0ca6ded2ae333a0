//go:build amd64 && !purego

#include "textflag.h"

#include "hsum_amd64.h"

// STORE2 folds accumulator Z (its low half token 2k, its high half token
// 2k+1, one row) into out at O (token 2k) and O+ostride (token 2k+1).
#define STORE2(Z, Y, X, O, S) \
	VEXTRACTF32X8 $1, Z, Y12 \
	HSUM8(Y, X, X13) \
	VMOVSS X, O \
	HSUM8(Y12, X12, X13) \
	VMOVSS X12, O(S*1)

// PAIR loads one 8-float step of two tokens (at LO and HI, offset AX) into
// the halves of Z (Y its low half) and adds its products with the three
// weight rows (Z16, Z17, Z18) to the pair's accumulators A, B, C.
#define PAIR(LO, HI, Y, Z, A, B, C) \
	VMOVUPS (LO)(AX*1), Y \
	VINSERTF32X8 $1, (HI)(AX*1), Z, Z \
	VFMADD231PS Z16, Z, A \
	VFMADD231PS Z17, Z, B \
	VFMADD231PS Z18, Z, C

// func dot8x3AVX512(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, out *float32, ostride uintptr, pf *float32)
//
// Eight tokens times three rows with the lane schedule of dot4x3AVX2: each
// (token, row) pair has its own eight lanes — a 512-bit register holds two
// tokens' lanes for one row — fed one FMA per 8-float step, so every sum
// rounds exactly as the 256-bit kernels round it; only twice as many pairs
// are computed per instruction. Token i's sum for row j is stored at
// out + i*ostride + 4*j. pf, where the caller's next rows start, is
// prefetched into L2 at 128 bytes per step, as dot4x3AVX2 explains (57-60
// GFLOP/s from memory into L1, 84-87 into L2 on one core of a Zen 4).
TEXT ·dot8x3AVX512(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), AX
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), R9
	MOVQ n8+32(FP), CX
	MOVQ pf+56(FP), R8

	LEAQ (SI)(AX*1), R10
	LEAQ (SI)(AX*2), R11
	LEAQ (R10)(AX*2), R12
	LEAQ (SI)(AX*4), BX
	LEAQ (BX)(AX*1), R13
	LEAQ (BX)(AX*2), R14
	LEAQ (R13)(AX*2), R15
	LEAQ (DI)(R9*2), DX
	ADDQ DI, R9

	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11

	XORQ AX, AX
	TESTQ CX, CX
	JZ   store8x3

loop8x3:
	PREFETCHT1 (R8)(AX*4)
	PREFETCHT1 64(R8)(AX*4)
	VBROADCASTF32X8 (DI)(AX*1), Z16
	VBROADCASTF32X8 (R9)(AX*1), Z17
	VBROADCASTF32X8 (DX)(AX*1), Z18

	PAIR(SI, R10, Y20, Z20, Z0, Z1, Z2)
	PAIR(R11, R12, Y21, Z21, Z3, Z4, Z5)
	PAIR(BX, R13, Y22, Z22, Z6, Z7, Z8)
	PAIR(R14, R15, Y23, Z23, Z9, Z10, Z11)

	ADDQ $32, AX
	DECQ CX
	JNZ  loop8x3

store8x3:
	MOVQ out+40(FP), DX
	MOVQ ostride+48(FP), CX
	STORE2(Z0, Y0, X0, 0(DX), CX)
	STORE2(Z1, Y1, X1, 4(DX), CX)
	STORE2(Z2, Y2, X2, 8(DX), CX)
	LEAQ (DX)(CX*2), DX
	STORE2(Z3, Y3, X3, 0(DX), CX)
	STORE2(Z4, Y4, X4, 4(DX), CX)
	STORE2(Z5, Y5, X5, 8(DX), CX)
	LEAQ (DX)(CX*2), DX
	STORE2(Z6, Y6, X6, 0(DX), CX)
	STORE2(Z7, Y7, X7, 4(DX), CX)
	STORE2(Z8, Y8, X8, 8(DX), CX)
	LEAQ (DX)(CX*2), DX
	STORE2(Z9, Y9, X9, 0(DX), CX)
	STORE2(Z10, Y10, X10, 4(DX), CX)
	STORE2(Z11, Y11, X11, 8(DX), CX)
	VZEROUPPER
	RET
