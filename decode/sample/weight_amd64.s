//go:build amd64 && !purego

#include "textflag.h"

// The constants of expWeight (weight.go), each in four lanes, as bits.
// Order: log2e, ln2hi, ln2lo, 1/16, 1/8! … 1/2!, 1, 2, the low clamp, and
// the exponent bias as four int64s.
DATA weightc<>+0(SB)/8, $0x3ff71547652b82fe
DATA weightc<>+8(SB)/8, $0x3ff71547652b82fe
DATA weightc<>+16(SB)/8, $0x3ff71547652b82fe
DATA weightc<>+24(SB)/8, $0x3ff71547652b82fe
DATA weightc<>+32(SB)/8, $0x3fe62e42fefa3000
DATA weightc<>+40(SB)/8, $0x3fe62e42fefa3000
DATA weightc<>+48(SB)/8, $0x3fe62e42fefa3000
DATA weightc<>+56(SB)/8, $0x3fe62e42fefa3000
DATA weightc<>+64(SB)/8, $0x3d53de6af278ece6
DATA weightc<>+72(SB)/8, $0x3d53de6af278ece6
DATA weightc<>+80(SB)/8, $0x3d53de6af278ece6
DATA weightc<>+88(SB)/8, $0x3d53de6af278ece6
DATA weightc<>+96(SB)/8, $0x3fb0000000000000
DATA weightc<>+104(SB)/8, $0x3fb0000000000000
DATA weightc<>+112(SB)/8, $0x3fb0000000000000
DATA weightc<>+120(SB)/8, $0x3fb0000000000000
DATA weightc<>+128(SB)/8, $0x3efa01a01a01a01a
DATA weightc<>+136(SB)/8, $0x3efa01a01a01a01a
DATA weightc<>+144(SB)/8, $0x3efa01a01a01a01a
DATA weightc<>+152(SB)/8, $0x3efa01a01a01a01a
DATA weightc<>+160(SB)/8, $0x3f2a01a01a01a01a
DATA weightc<>+168(SB)/8, $0x3f2a01a01a01a01a
DATA weightc<>+176(SB)/8, $0x3f2a01a01a01a01a
DATA weightc<>+184(SB)/8, $0x3f2a01a01a01a01a
DATA weightc<>+192(SB)/8, $0x3f56c16c16c16c17
DATA weightc<>+200(SB)/8, $0x3f56c16c16c16c17
DATA weightc<>+208(SB)/8, $0x3f56c16c16c16c17
DATA weightc<>+216(SB)/8, $0x3f56c16c16c16c17
DATA weightc<>+224(SB)/8, $0x3f81111111111111
DATA weightc<>+232(SB)/8, $0x3f81111111111111
DATA weightc<>+240(SB)/8, $0x3f81111111111111
DATA weightc<>+248(SB)/8, $0x3f81111111111111
DATA weightc<>+256(SB)/8, $0x3fa5555555555555
DATA weightc<>+264(SB)/8, $0x3fa5555555555555
DATA weightc<>+272(SB)/8, $0x3fa5555555555555
DATA weightc<>+280(SB)/8, $0x3fa5555555555555
DATA weightc<>+288(SB)/8, $0x3fc5555555555555
DATA weightc<>+296(SB)/8, $0x3fc5555555555555
DATA weightc<>+304(SB)/8, $0x3fc5555555555555
DATA weightc<>+312(SB)/8, $0x3fc5555555555555
DATA weightc<>+320(SB)/8, $0x3fe0000000000000
DATA weightc<>+328(SB)/8, $0x3fe0000000000000
DATA weightc<>+336(SB)/8, $0x3fe0000000000000
DATA weightc<>+344(SB)/8, $0x3fe0000000000000
DATA weightc<>+352(SB)/8, $0x3ff0000000000000
DATA weightc<>+360(SB)/8, $0x3ff0000000000000
DATA weightc<>+368(SB)/8, $0x3ff0000000000000
DATA weightc<>+376(SB)/8, $0x3ff0000000000000
DATA weightc<>+384(SB)/8, $0x4000000000000000
DATA weightc<>+392(SB)/8, $0x4000000000000000
DATA weightc<>+400(SB)/8, $0x4000000000000000
DATA weightc<>+408(SB)/8, $0x4000000000000000
DATA weightc<>+416(SB)/8, $0xc086200000000000
DATA weightc<>+424(SB)/8, $0xc086200000000000
DATA weightc<>+432(SB)/8, $0xc086200000000000
DATA weightc<>+440(SB)/8, $0xc086200000000000
DATA weightc<>+448(SB)/8, $1023
DATA weightc<>+456(SB)/8, $1023
DATA weightc<>+464(SB)/8, $1023
DATA weightc<>+472(SB)/8, $1023
GLOBL weightc<>(SB), RODATA|NOPTR, $480

#define W_LOG2E weightc<>+0(SB)
#define W_LN2HI weightc<>+32(SB)
#define W_LN2LO weightc<>+64(SB)
#define W_SIXTEENTH weightc<>+96(SB)
#define W_C8 weightc<>+128(SB)
#define W_C7 weightc<>+160(SB)
#define W_C6 weightc<>+192(SB)
#define W_C5 weightc<>+224(SB)
#define W_C4 weightc<>+256(SB)
#define W_C3 weightc<>+288(SB)
#define W_C2 weightc<>+320(SB)
#define W_ONE weightc<>+352(SB)
#define W_TWO weightc<>+384(SB)
#define W_LO weightc<>+416(SB)
#define W_BIAS weightc<>+448(SB)

// func weighAVX2(l *float64, top, temp float64, n4 uintptr)
//
// l[i] = expWeight((l[i]-top)/temp) for i < 4*n4, four lanes at a time with
// the portable function's operations in its order, each rounded to
// float64 (no FMA): the same bits.
TEXT ·weighAVX2(SB), NOSPLIT, $0-32
	MOVQ l+0(FP), DI
	VBROADCASTSD top+8(FP), Y14
	VBROADCASTSD temp+16(FP), Y15
	MOVQ n4+24(FP), CX
	VMOVUPD W_LO, Y13
	VXORPD Y12, Y12, Y12
	TESTQ CX, CX
	JZ   doneweigh

loopweigh:
	VMOVUPD (DI), Y0
	VSUBPD Y14, Y0, Y0          // l - top
	VDIVPD Y15, Y0, Y0          // x = (l - top) / temp
	VCMPPD $1, Y13, Y0, Y11     // lanes with x < -708 (not NaN): weight 0
	VMAXPD Y0, Y13, Y0          // max(-708, x), NaN kept
	VMINPD Y0, Y12, Y0          // min(0, x), NaN kept
	VMULPD W_LOG2E, Y0, Y1
	VCVTPD2DQY Y1, X2           // k = x·log2e rounded to nearest even
	VCVTDQ2PD X2, Y3
	VMULPD W_LN2HI, Y3, Y4
	VSUBPD Y4, Y0, Y0
	VMULPD W_LN2LO, Y3, Y4
	VSUBPD Y4, Y0, Y0
	VMULPD W_SIXTEENTH, Y0, Y0
	VMULPD W_C8, Y0, Y1
	VADDPD W_C7, Y1, Y1
	VMULPD Y0, Y1, Y1
	VADDPD W_C6, Y1, Y1
	VMULPD Y0, Y1, Y1
	VADDPD W_C5, Y1, Y1
	VMULPD Y0, Y1, Y1
	VADDPD W_C4, Y1, Y1
	VMULPD Y0, Y1, Y1
	VADDPD W_C3, Y1, Y1
	VMULPD Y0, Y1, Y1
	VADDPD W_C2, Y1, Y1
	VMULPD Y0, Y1, Y1
	VADDPD W_ONE, Y1, Y1
	VMULPD Y1, Y0, Y0           // e = e^(x/16) - 1
	VADDPD W_TWO, Y0, Y1   // four squarings: e ← e·(e+2)
	VMULPD Y1, Y0, Y0
	VADDPD W_TWO, Y0, Y1
	VMULPD Y1, Y0, Y0
	VADDPD W_TWO, Y0, Y1
	VMULPD Y1, Y0, Y0
	VADDPD W_TWO, Y0, Y1
	VMULPD Y1, Y0, Y0
	VADDPD W_ONE, Y0, Y0
	VPMOVSXDQ X2, Y5            // 2^k from its exponent bits
	VPADDQ W_BIAS, Y5, Y5
	VPSLLQ $52, Y5, Y5
	VMULPD Y5, Y0, Y0
	VANDNPD Y0, Y11, Y0
	VMOVUPD Y0, (DI)
	ADDQ $32, DI
	DECQ CX
	JNZ  loopweigh

doneweigh:
	VZEROUPPER
	RET
