package matmul

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// randomTyped is rows×n values of type t: every bit pattern for the
// halves and bfloat16s (subnormals, infinities and NaNs included) unless
// finite, and Q8_0 blocks with finite scales.
func randomTyped(r *rand.Rand, t Type, rows, n int, finite bool) Matrix {
	raw := make([]byte, rows*t.RowBytes(n))
	for i := range raw {
		raw[i] = byte(r.Uint32())
	}
	half := func(i int) {
		for {
			h := uint16(r.Uint32())
			if !finite || (h>>10)&0x1f < 0x1e { // |v| < 32768 keeps products finite
				if finite {
					h &^= 0x4000 // and |v| < 2
				}
				binary.LittleEndian.PutUint16(raw[i:], h)
				return
			}
		}
	}
	switch t {
	case F16:
		for i := 0; i < len(raw); i += 2 {
			half(i)
		}
	case BF16:
		for i := 0; finite && i < len(raw); i += 2 {
			binary.LittleEndian.PutUint16(raw[i:], uint16(math.Float32bits(float32(r.NormFloat64()))>>16))
		}
	case Q8_0:
		for i := 0; i < len(raw); i += 34 {
			half(i)
		}
	}
	return Matrix{Type: t, Raw: raw}
}

// TestDecodersAgree: the assembly decoders of every kernel set give the
// generic decoders' bits for every type, on every bit pattern.
func TestDecodersAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sets := map[string]typedKernels{"active": active.typed}
	if active.typed.f16 == nil {
		t.Fatal("no decoders")
	}
	addArchSets(sets)
	for _, typ := range []Type{F16, BF16, Q8_0} {
		for _, n := range []int{32, 40, 64, 96, 4096 + 32} {
			if typ == Q8_0 && n%32 != 0 {
				continue
			}
			w := randomTyped(r, typ, 3, n, false)
			want := make([]float32, 3*n)
			ref := Matrix{Type: typ, Raw: w.Raw}
			restore := UseGeneric()
			ref.DecodeRows(want, n, 0, 3)
			restore()
			for name, k := range sets {
				got := make([]float32, 3*n)
				dec := map[Type]func([]float32, []byte){F16: k.f16, BF16: k.bf16, Q8_0: k.q8}[typ]
				dec(got, w.Raw)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s %s n=%d value %d: %#x, generic %#x", name, typ, n, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
					}
				}
			}
		}
	}
	if HalfToFloat(0x3c00) != 1 || HalfToFloat(0xc000) != -2 || HalfToFloat(0x0001) != float32(math.Ldexp(1, -24)) || !math.IsInf(float64(HalfToFloat(0x7c00)), 1) {
		t.Fatal("HalfToFloat is wrong on 1, -2, the least subnormal or +Inf")
	}
}

// TestTypedProductsAreTheirDecodedProducts: a product with a matrix of
// each type has, bit for bit, the results of the float32 product of its
// decoded values, for every batch size and shape, through MatMulOf and
// MatMuls alike; so batch and prefill/decode invariance carry over.
func TestTypedProductsAreTheirDecodedProducts(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range []Type{F16, BF16, Q8_0} {
		for _, shape := range [][2]int{{1, 64}, {7, 96}, {24, 384}, {100, 1024}, {37, 2048}} {
			m, n := shape[0], shape[1]
			w := randomTyped(r, typ, m, n, true)
			dec := make([]float32, m*n)
			w.DecodeRows(dec, n, 0, m)
			for _, T := range []int{1, 3, 4, 5, 8, 17} {
				x := make([]float32, T*n)
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				want, got, got2 := make([]float32, T*m), make([]float32, T*m), make([]float32, T*m)
				MatMul(want, x, T, dec, m, n)
				MatMulOf(got, x, T, w, m, n)
				MatMuls(x, T, n, Product{Out: got2, Typed: w, M: m})
				one := make([]float32, m)
				MatMulOf(one, x[(T-1)*n:], 1, w, m, n)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) || math.Float32bits(got2[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s %d×%d T=%d: out %d = %v / %v, the decoded product's %v", typ, m, n, T, i, got[i], got2[i], want[i])
					}
				}
				for j := range one {
					if math.Float32bits(one[j]) != math.Float32bits(want[(T-1)*m+j]) {
						t.Fatalf("%s %d×%d: token %d alone %v, in a batch of %d %v", typ, m, n, T-1, one[j], T, want[(T-1)*m+j])
					}
				}
			}
		}
	}
}

// TestMatrixCheck: a matrix whose data does not fit its shape is named.
func TestMatrixCheck(t *testing.T) {
	if err := (Matrix{Type: Q8_0, Raw: make([]byte, 34)}).Check(1, 32); err != nil {
		t.Fatal(err)
	}
	for _, w := range []Matrix{{Type: Q8_0, Raw: make([]byte, 34)}, {Type: F16, Raw: make([]byte, 10)}, {Type: 9, Raw: make([]byte, 64)}} {
		if err := w.Check(1, 48); err == nil {
			t.Errorf("%s of %d bytes as 1×48: no error", w.Type, len(w.Raw))
		}
	}
}
