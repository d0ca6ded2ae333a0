//go:build amd64 && !purego

#include "textflag.h"

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
