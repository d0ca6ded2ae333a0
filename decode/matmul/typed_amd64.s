//go:build amd64 && !purego

#include "textflag.h"

#include "hsum_amd64.h"

// func f16AVX2(dst *float32, src *byte, n8 uintptr)
TEXT ·f16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n8+16(FP), CX
f16loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       f16loop
	VZEROUPPER
	RET

// func bf16AVX2(dst *float32, src *byte, n8 uintptr)
TEXT ·bf16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n8+16(FP), CX
bf16loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       bf16loop
	VZEROUPPER
	RET

// func q8AVX2(dst *float32, src *byte, blocks uintptr)
//
// A block is a half scale d then 32 int8s q; value j is float32(q[j])·d,
// one rounding, as the generic decoder.
TEXT ·q8AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ blocks+16(FP), CX
q8loop:
	MOVWLZX        (SI), AX
	VMOVD          AX, X7
	VCVTPH2PS      X7, X7
	VBROADCASTSS   X7, Y7
	VPMOVSXBD      2(SI), Y0
	VPMOVSXBD      10(SI), Y1
	VPMOVSXBD      18(SI), Y2
	VPMOVSXBD      26(SI), Y3
	VCVTDQ2PS      Y0, Y0
	VCVTDQ2PS      Y1, Y1
	VCVTDQ2PS      Y2, Y2
	VCVTDQ2PS      Y3, Y3
	VMULPS         Y7, Y0, Y0
	VMULPS         Y7, Y1, Y1
	VMULPS         Y7, Y2, Y2
	VMULPS         Y7, Y3, Y3
	VMOVUPS        Y0, (DI)
	VMOVUPS        Y1, 32(DI)
	VMOVUPS        Y2, 64(DI)
	VMOVUPS        Y3, 96(DI)
	ADDQ           $34, SI
	ADDQ           $128, DI
	DECQ           CX
	JNZ            q8loop
	VZEROUPPER
	RET

// func f16AVX512(dst *float32, src *byte, n16 uintptr)
TEXT ·f16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n16+16(FP), CX
f16loop512:
	VCVTPH2PS (SI), Z0
	VMOVUPS   Z0, (DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       f16loop512
	VZEROUPPER
	RET

// func bf16AVX512(dst *float32, src *byte, n16 uintptr)
TEXT ·bf16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n16+16(FP), CX
bf16loop512:
	VPMOVZXWD (SI), Z0
	VPSLLD    $16, Z0, Z0
	VMOVUPS   Z0, (DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       bf16loop512
	VZEROUPPER
	RET

// func q8AVX512(dst *float32, src *byte, blocks uintptr)
TEXT ·q8AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ blocks+16(FP), CX
q8loop512:
	MOVWLZX        (SI), AX
	VMOVD          AX, X7
	VCVTPH2PS      X7, X7
	VBROADCASTSS   X7, Z7
	VPMOVSXBD      2(SI), Z0
	VPMOVSXBD      18(SI), Z1
	VCVTDQ2PS      Z0, Z0
	VCVTDQ2PS      Z1, Z1
	VMULPS         Z7, Z0, Z0
	VMULPS         Z7, Z1, Z1
	VMOVUPS        Z0, (DI)
	VMOVUPS        Z1, 64(DI)
	ADDQ           $34, SI
	ADDQ           $128, DI
	DECQ           CX
	JNZ            q8loop512
	VZEROUPPER
	RET

// func dotRowQ8AVX2(x *float32, w *byte, rowBytes uintptr, blocks uintptr, rows uintptr, out *float32)
//
// rows Q8_0 rows of blocks blocks each, rowBytes apart, dotted with x:
// each weight decoded in a register exactly as q8AVX2 decodes it, then
// fed to dotRowAVX2's one accumulator in its order and folded by HSUM8,
// so the sums are the decoded rows' dotRowAVX2 sums, bit for bit,
// without writing the decoded rows to memory. blocks > 0.
TEXT ·dotRowQ8AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ rowBytes+16(FP), R9
	MOVQ blocks+24(FP), R11
	MOVQ rows+32(FP), R10
	MOVQ out+40(FP), DX
	TESTQ R10, R10
	JZ   q8rowdone

q8row:
	VXORPS Y4, Y4, Y4
	MOVQ DI, R8
	MOVQ SI, BX
	MOVQ R11, CX

q8blk:
	MOVWLZX      (R8), AX
	VMOVD        AX, X7
	VCVTPH2PS    X7, X7
	VBROADCASTSS X7, Y7
	VPMOVSXBD    2(R8), Y0
	VCVTDQ2PS    Y0, Y0
	VMULPS       Y7, Y0, Y0
	VFMADD231PS  (BX), Y0, Y4
	VPMOVSXBD    10(R8), Y1
	VCVTDQ2PS    Y1, Y1
	VMULPS       Y7, Y1, Y1
	VFMADD231PS  32(BX), Y1, Y4
	VPMOVSXBD    18(R8), Y2
	VCVTDQ2PS    Y2, Y2
	VMULPS       Y7, Y2, Y2
	VFMADD231PS  64(BX), Y2, Y4
	VPMOVSXBD    26(R8), Y3
	VCVTDQ2PS    Y3, Y3
	VMULPS       Y7, Y3, Y3
	VFMADD231PS  96(BX), Y3, Y4
	ADDQ         $34, R8
	ADDQ         $128, BX
	DECQ         CX
	JNZ          q8blk

	HSUM8(Y4, X4, X0)
	VMOVSS X4, 0(DX)
	ADDQ   $4, DX
	ADDQ   R9, DI
	DECQ   R10
	JNZ    q8row

q8rowdone:
	VZEROUPPER
	RET

// func dotRowF16AVX2(x *float32, w *byte, rowBytes uintptr, n8 uintptr, rows uintptr, out *float32)
//
// dotRowQ8AVX2 for rows of halves: 8 converted (VCVTPH2PS, as f16AVX2)
// and fed to the accumulator a step. n8 > 0.
TEXT ·dotRowF16AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ rowBytes+16(FP), R9
	MOVQ n8+24(FP), R11
	MOVQ rows+32(FP), R10
	MOVQ out+40(FP), DX
	TESTQ R10, R10
	JZ   f16rowdone

f16row:
	VXORPS Y4, Y4, Y4
	MOVQ DI, R8
	MOVQ SI, BX
	MOVQ R11, CX

f16step:
	VCVTPH2PS   (R8), Y0
	VFMADD231PS (BX), Y0, Y4
	ADDQ        $16, R8
	ADDQ        $32, BX
	DECQ        CX
	JNZ         f16step

	HSUM8(Y4, X4, X0)
	VMOVSS X4, 0(DX)
	ADDQ   $4, DX
	ADDQ   R9, DI
	DECQ   R10
	JNZ    f16row

f16rowdone:
	VZEROUPPER
	RET

// func dotRowBF16AVX2(x *float32, w *byte, rowBytes uintptr, n8 uintptr, rows uintptr, out *float32)
//
// dotRowF16AVX2 for bfloat16 rows (widened by a 16-bit shift, as
// bf16AVX2). n8 > 0.
TEXT ·dotRowBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ rowBytes+16(FP), R9
	MOVQ n8+24(FP), R11
	MOVQ rows+32(FP), R10
	MOVQ out+40(FP), DX
	TESTQ R10, R10
	JZ   bf16rowdone

bf16row:
	VXORPS Y4, Y4, Y4
	MOVQ DI, R8
	MOVQ SI, BX
	MOVQ R11, CX

bf16step:
	VPMOVZXWD   (R8), Y0
	VPSLLD      $16, Y0, Y0
	VFMADD231PS (BX), Y0, Y4
	ADDQ        $16, R8
	ADDQ        $32, BX
	DECQ        CX
	JNZ         bf16step

	HSUM8(Y4, X4, X0)
	VMOVSS X4, 0(DX)
	ADDQ   $4, DX
	ADDQ   R9, DI
	DECQ   R10
	JNZ    bf16row

bf16rowdone:
	VZEROUPPER
	RET
