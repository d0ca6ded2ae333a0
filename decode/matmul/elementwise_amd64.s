//go:build amd64 && !purego

#include "textflag.h"

#include "hsum_amd64.h"

// The elementwise kernels of the engine: SiLU gates, softmax
// exponentials, divisions with a running maximum and the weighted row sums
// of attention. The exponential uses multiplies and adds only — no FMA —
// so that the portable versions in elementwise.go give the same bits.

// Constants, eight lanes each: the clamp, Cody-Waite ln 2 halves and the
// Cephes expf polynomial.
DATA expc<>+0(SB)/4, $0xc2ae0000
DATA expc<>+4(SB)/4, $0xc2ae0000
DATA expc<>+8(SB)/4, $0xc2ae0000
DATA expc<>+12(SB)/4, $0xc2ae0000
DATA expc<>+16(SB)/4, $0xc2ae0000
DATA expc<>+20(SB)/4, $0xc2ae0000
DATA expc<>+24(SB)/4, $0xc2ae0000
DATA expc<>+28(SB)/4, $0xc2ae0000
DATA expc<>+32(SB)/4, $0x3fb8aa3b
DATA expc<>+36(SB)/4, $0x3fb8aa3b
DATA expc<>+40(SB)/4, $0x3fb8aa3b
DATA expc<>+44(SB)/4, $0x3fb8aa3b
DATA expc<>+48(SB)/4, $0x3fb8aa3b
DATA expc<>+52(SB)/4, $0x3fb8aa3b
DATA expc<>+56(SB)/4, $0x3fb8aa3b
DATA expc<>+60(SB)/4, $0x3fb8aa3b
DATA expc<>+64(SB)/4, $0x3f000000
DATA expc<>+68(SB)/4, $0x3f000000
DATA expc<>+72(SB)/4, $0x3f000000
DATA expc<>+76(SB)/4, $0x3f000000
DATA expc<>+80(SB)/4, $0x3f000000
DATA expc<>+84(SB)/4, $0x3f000000
DATA expc<>+88(SB)/4, $0x3f000000
DATA expc<>+92(SB)/4, $0x3f000000
DATA expc<>+96(SB)/4, $0x3f318000
DATA expc<>+100(SB)/4, $0x3f318000
DATA expc<>+104(SB)/4, $0x3f318000
DATA expc<>+108(SB)/4, $0x3f318000
DATA expc<>+112(SB)/4, $0x3f318000
DATA expc<>+116(SB)/4, $0x3f318000
DATA expc<>+120(SB)/4, $0x3f318000
DATA expc<>+124(SB)/4, $0x3f318000
DATA expc<>+128(SB)/4, $0xb95e8083
DATA expc<>+132(SB)/4, $0xb95e8083
DATA expc<>+136(SB)/4, $0xb95e8083
DATA expc<>+140(SB)/4, $0xb95e8083
DATA expc<>+144(SB)/4, $0xb95e8083
DATA expc<>+148(SB)/4, $0xb95e8083
DATA expc<>+152(SB)/4, $0xb95e8083
DATA expc<>+156(SB)/4, $0xb95e8083
DATA expc<>+160(SB)/4, $0x39506967
DATA expc<>+164(SB)/4, $0x39506967
DATA expc<>+168(SB)/4, $0x39506967
DATA expc<>+172(SB)/4, $0x39506967
DATA expc<>+176(SB)/4, $0x39506967
DATA expc<>+180(SB)/4, $0x39506967
DATA expc<>+184(SB)/4, $0x39506967
DATA expc<>+188(SB)/4, $0x39506967
DATA expc<>+192(SB)/4, $0x3ab743ce
DATA expc<>+196(SB)/4, $0x3ab743ce
DATA expc<>+200(SB)/4, $0x3ab743ce
DATA expc<>+204(SB)/4, $0x3ab743ce
DATA expc<>+208(SB)/4, $0x3ab743ce
DATA expc<>+212(SB)/4, $0x3ab743ce
DATA expc<>+216(SB)/4, $0x3ab743ce
DATA expc<>+220(SB)/4, $0x3ab743ce
DATA expc<>+224(SB)/4, $0x3c088908
DATA expc<>+228(SB)/4, $0x3c088908
DATA expc<>+232(SB)/4, $0x3c088908
DATA expc<>+236(SB)/4, $0x3c088908
DATA expc<>+240(SB)/4, $0x3c088908
DATA expc<>+244(SB)/4, $0x3c088908
DATA expc<>+248(SB)/4, $0x3c088908
DATA expc<>+252(SB)/4, $0x3c088908
DATA expc<>+256(SB)/4, $0x3d2aa9c1
DATA expc<>+260(SB)/4, $0x3d2aa9c1
DATA expc<>+264(SB)/4, $0x3d2aa9c1
DATA expc<>+268(SB)/4, $0x3d2aa9c1
DATA expc<>+272(SB)/4, $0x3d2aa9c1
DATA expc<>+276(SB)/4, $0x3d2aa9c1
DATA expc<>+280(SB)/4, $0x3d2aa9c1
DATA expc<>+284(SB)/4, $0x3d2aa9c1
DATA expc<>+288(SB)/4, $0x3e2aaaaa
DATA expc<>+292(SB)/4, $0x3e2aaaaa
DATA expc<>+296(SB)/4, $0x3e2aaaaa
DATA expc<>+300(SB)/4, $0x3e2aaaaa
DATA expc<>+304(SB)/4, $0x3e2aaaaa
DATA expc<>+308(SB)/4, $0x3e2aaaaa
DATA expc<>+312(SB)/4, $0x3e2aaaaa
DATA expc<>+316(SB)/4, $0x3e2aaaaa
DATA expc<>+320(SB)/4, $0x3f000000
DATA expc<>+324(SB)/4, $0x3f000000
DATA expc<>+328(SB)/4, $0x3f000000
DATA expc<>+332(SB)/4, $0x3f000000
DATA expc<>+336(SB)/4, $0x3f000000
DATA expc<>+340(SB)/4, $0x3f000000
DATA expc<>+344(SB)/4, $0x3f000000
DATA expc<>+348(SB)/4, $0x3f000000
DATA expc<>+352(SB)/4, $0x3f800000
DATA expc<>+356(SB)/4, $0x3f800000
DATA expc<>+360(SB)/4, $0x3f800000
DATA expc<>+364(SB)/4, $0x3f800000
DATA expc<>+368(SB)/4, $0x3f800000
DATA expc<>+372(SB)/4, $0x3f800000
DATA expc<>+376(SB)/4, $0x3f800000
DATA expc<>+380(SB)/4, $0x3f800000
DATA expc<>+384(SB)/4, $0x0000007f
DATA expc<>+388(SB)/4, $0x0000007f
DATA expc<>+392(SB)/4, $0x0000007f
DATA expc<>+396(SB)/4, $0x0000007f
DATA expc<>+400(SB)/4, $0x0000007f
DATA expc<>+404(SB)/4, $0x0000007f
DATA expc<>+408(SB)/4, $0x0000007f
DATA expc<>+412(SB)/4, $0x0000007f
DATA expc<>+416(SB)/4, $0x80000000
DATA expc<>+420(SB)/4, $0x80000000
DATA expc<>+424(SB)/4, $0x80000000
DATA expc<>+428(SB)/4, $0x80000000
DATA expc<>+432(SB)/4, $0x80000000
DATA expc<>+436(SB)/4, $0x80000000
DATA expc<>+440(SB)/4, $0x80000000
DATA expc<>+444(SB)/4, $0x80000000
GLOBL expc<>(SB), RODATA|NOPTR, $448

#define C_NEG87 expc<>+0(SB)
#define C_LOG2E expc<>+32(SB)
#define C_HALF expc<>+64(SB)
#define C_LN2HI expc<>+96(SB)
#define C_LN2LO expc<>+128(SB)
#define C_P0 expc<>+160(SB)
#define C_P1 expc<>+192(SB)
#define C_P2 expc<>+224(SB)
#define C_P3 expc<>+256(SB)
#define C_P4 expc<>+288(SB)
#define C_P5 expc<>+320(SB)
#define C_ONE expc<>+352(SB)
#define C_BIAS expc<>+384(SB)
#define C_SIGN expc<>+416(SB)

// EXPNEG sets Y0 to exp(min(max(Y0, -87), 0)) as expNeg does, with Y1-Y3
// as scratch; Y15 must hold -87 and Y14 zero. The operand order of the
// clamps keeps a NaN.
#define EXPNEG \
	VMAXPS Y0, Y15, Y0 \
	VMINPS Y0, Y14, Y0 \
	VMULPS C_LOG2E, Y0, Y1 \
	VADDPS C_HALF, Y1, Y1 \
	VROUNDPS $9, Y1, Y1 \
	VMULPS C_LN2HI, Y1, Y2 \
	VSUBPS Y2, Y0, Y0 \
	VMULPS C_LN2LO, Y1, Y2 \
	VSUBPS Y2, Y0, Y0 \
	VMULPS Y0, Y0, Y3 \
	VMOVUPS C_P0, Y2 \
	VMULPS Y0, Y2, Y2 \
	VADDPS C_P1, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VADDPS C_P2, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VADDPS C_P3, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VADDPS C_P4, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VADDPS C_P5, Y2, Y2 \
	VMULPS Y3, Y2, Y2 \
	VADDPS Y0, Y2, Y2 \
	VADDPS C_ONE, Y2, Y2 \
	VCVTTPS2DQ Y1, Y1 \
	VPADDD C_BIAS, Y1, Y1 \
	VPSLLD $23, Y1, Y1 \
	VMULPS Y1, Y2, Y0

// func siluMulAVX2(a *float32, b *float32, n8 uintptr)
// a[i] = silu(a[i]) * b[i] for i < 8*n8, as siluMulGeneric.
TEXT ·siluMulAVX2(SB), NOSPLIT, $0-24
	MOVQ a+0(FP), DI
	MOVQ b+8(FP), SI
	MOVQ n8+16(FP), CX
	VMOVUPS C_NEG87, Y15
	VXORPS Y14, Y14, Y14
	VMOVUPS C_SIGN, Y13
	VMOVUPS C_ONE, Y12
	TESTQ CX, CX
	JZ   donesilu

loopsilu:
	VMOVUPS (DI), Y4
	VORPS Y13, Y4, Y0
	EXPNEG
	VADDPS Y12, Y0, Y5
	VMULPS Y0, Y4, Y6
	VBLENDVPS Y4, Y6, Y4, Y6
	VDIVPS Y5, Y6, Y6
	VMULPS (SI), Y6, Y6
	VMOVUPS Y6, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	DECQ CX
	JNZ  loopsilu

donesilu:
	VZEROUPPER
	RET

// func expSumAVX2(p *float32, shift float32, n8 uintptr) float32
// p[i] = expNeg(p[i] - shift) for i < 8*n8; returns their sum, eight lanes
// folded as hsum8, as expSumGeneric.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-28
	MOVQ p+0(FP), DI
	VBROADCASTSS shift+8(FP), Y11
	MOVQ n8+16(FP), CX
	VMOVUPS C_NEG87, Y15
	VXORPS Y14, Y14, Y14
	VXORPS Y10, Y10, Y10
	TESTQ CX, CX
	JZ   doneexp

loopexp:
	VMOVUPS (DI), Y0
	VSUBPS Y11, Y0, Y0
	EXPNEG
	VMOVUPS Y0, (DI)
	VADDPS Y0, Y10, Y10
	ADDQ $32, DI
	DECQ CX
	JNZ  loopexp

doneexp:
	HSUM8(Y10, X10, X0)
	VZEROUPPER
	MOVSS X10, ret+24(FP)
	RET

// func divMaxAVX2(p *float32, d float32, n8 uintptr) float32
// p[i] /= d for i < 8*n8; returns their maximum, as divMaxGeneric: lane
// maxima kept as m = m > x ? m : x, then folded in hsum8's order.
TEXT ·divMaxAVX2(SB), NOSPLIT, $0-28
	MOVQ p+0(FP), DI
	VBROADCASTSS d+8(FP), Y11
	MOVQ n8+16(FP), CX
	MOVQ $0xff800000, AX
	MOVQ AX, X10
	VBROADCASTSS X10, Y10
	TESTQ CX, CX
	JZ   donediv

loopdiv:
	VMOVUPS (DI), Y0
	VDIVPS Y11, Y0, Y0
	VMOVUPS Y0, (DI)
	VMAXPS Y0, Y10, Y10
	ADDQ $32, DI
	DECQ CX
	JNZ  loopdiv

donediv:
	VEXTRACTF128 $1, Y10, X0
	VMAXPS X0, X10, X10
	VMOVHLPS X10, X10, X0
	VMAXPS X0, X10, X10
	VMOVSHDUP X10, X0
	VMAXSS X0, X10, X10
	VZEROUPPER
	MOVSS X10, ret+24(FP)
	RET

// func axpyRowsAVX2(dst *float32, a *float32, v *float32, vstride uintptr, rows uintptr, n8 uintptr)
// For r < rows in order: dst[i] = fma(a[r], v[r*vstride/4 + i], dst[i]) for
// i < 8*n8 — axpyAVX2 once per row, with dst held in registers: 64, then
// 32, then 8 floats at a time.
TEXT ·axpyRowsAVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ vstride+24(FP), R9
	MOVQ rows+32(FP), R10
	MOVQ n8+40(FP), CX
	TESTQ R10, R10
	JZ   donerows

rows8:
	CMPQ CX, $8
	JB   rows4
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 128(DI), Y4
	VMOVUPS 160(DI), Y5
	VMOVUPS 192(DI), Y6
	VMOVUPS 224(DI), Y7
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R10, R13

loop8:
	VBROADCASTSS (R11), Y8
	VFMADD231PS 0(R12), Y8, Y0
	VFMADD231PS 32(R12), Y8, Y1
	VFMADD231PS 64(R12), Y8, Y2
	VFMADD231PS 96(R12), Y8, Y3
	VFMADD231PS 128(R12), Y8, Y4
	VFMADD231PS 160(R12), Y8, Y5
	VFMADD231PS 192(R12), Y8, Y6
	VFMADD231PS 224(R12), Y8, Y7
	ADDQ $4, R11
	ADDQ R9, R12
	DECQ R13
	JNZ  loop8
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 128(DI)
	VMOVUPS Y5, 160(DI)
	VMOVUPS Y6, 192(DI)
	VMOVUPS Y7, 224(DI)
	ADDQ $256, DI
	ADDQ $256, DX
	SUBQ $8, CX
	JMP  rows8

rows4:
	CMPQ CX, $4
	JB   rows1
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R10, R13

loop4:
	VBROADCASTSS (R11), Y8
	VFMADD231PS 0(R12), Y8, Y0
	VFMADD231PS 32(R12), Y8, Y1
	VFMADD231PS 64(R12), Y8, Y2
	VFMADD231PS 96(R12), Y8, Y3
	ADDQ $4, R11
	ADDQ R9, R12
	DECQ R13
	JNZ  loop4
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, DX
	SUBQ $4, CX
	JMP  rows4

rows1:
	TESTQ CX, CX
	JZ   donerows
	VMOVUPS 0(DI), Y0
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R10, R13

loop1:
	VBROADCASTSS (R11), Y8
	VFMADD231PS 0(R12), Y8, Y0
	ADDQ $4, R11
	ADDQ R9, R12
	DECQ R13
	JNZ  loop1
	VMOVUPS Y0, 0(DI)
	ADDQ $32, DI
	ADDQ $32, DX
	DECQ CX
	JMP  rows1

donerows:
	VZEROUPPER
	RET
