package matmul

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// Type is how a weight matrix's values are stored.
type Type uint8

// Weight types: float32; IEEE half; bfloat16; and ggml's Q8_0, blocks of
// 32 int8s after their half-precision scale.
const (
	F32 Type = iota
	F16
	BF16
	Q8_0
)

func (t Type) String() string {
	switch t {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case BF16:
		return "BF16"
	case Q8_0:
		return "Q8_0"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// RowBytes is the size of one row of n values (n a multiple of 32 for
// Q8_0).
func (t Type) RowBytes(n int) int {
	switch t {
	case F16, BF16:
		return 2 * n
	case Q8_0:
		return n / 32 * 34
	}
	return 4 * n
}

// Matrix is a row-major weight matrix: float32 values (F32), or rows of
// another type encoded in Raw. The products decode a few rows at a time
// into float32 and reduce them with the float32 kernels, so that a typed
// matrix rounds exactly as the float32 matrix of its decoded values
// would: every invariance of the engine holds for every type.
type Matrix struct {
	Type Type
	F32  []float32
	Raw  []byte
}

// Of wraps float32 weights.
func Of(w []float32) Matrix { return Matrix{Type: F32, F32: w} }

// Check reports whether w holds rows×n values of its type.
func (w Matrix) Check(rows, n int) error {
	switch {
	case w.Type == F32 && len(w.F32) == rows*n:
		return nil
	case w.Type == Q8_0 && n%32 != 0:
		return fmt.Errorf("matmul: Q8_0 rows of %d values (a multiple of 32)", n)
	case w.Type != F32 && w.Type <= Q8_0 && len(w.Raw) == rows*w.Type.RowBytes(n):
		return nil
	}
	return fmt.Errorf("matmul: %s matrix of %d floats / %d bytes for %d×%d", w.Type, len(w.F32), len(w.Raw), rows, n)
}

// DecodeRows writes rows [r0, r1) of w, n values each, to dst as float32.
func (w Matrix) DecodeRows(dst []float32, n, r0, r1 int) {
	if w.Type == F32 {
		copy(dst, w.F32[r0*n:r1*n])
		return
	}
	rb := w.Type.RowBytes(n)
	src := w.Raw[r0*rb : r1*rb]
	dst = dst[:(r1-r0)*n]
	switch w.Type {
	case F16:
		active.typed.f16(dst, src)
	case BF16:
		active.typed.bf16(dst, src)
	case Q8_0:
		active.typed.q8(dst, src)
	}
}

// typedKernels decode len(dst) values (a multiple of 32 for q8).
// dotRowQ8, where the kernel set has it, dots x with rows Q8_0 rows of
// blocks blocks each, decoding in registers with the bits of q8 and
// dotRow (nil: none); dotRow16 the same for F16 and BF16 rows of 8·n8
// values.
type typedKernels struct {
	f16, bf16, q8 func(dst []float32, src []byte)
	dotRowQ8      func(x *float32, w *byte, rowBytes, blocks, rows uintptr, out *float32)
	dotRow16      [2]func(x *float32, w *byte, rowBytes, n8, rows uintptr, out *float32)
}

var genericTyped = typedKernels{f16: f16Generic, bf16: bf16Generic, q8: q8Generic}

// HalfToFloat is IEEE half h as a float32 (exact), as VCVTPH2PS converts
// it.
func HalfToFloat(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if mant != 0 {
			mant |= 0x200 // a NaN comes out quiet
		}
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

func f16Generic(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = HalfToFloat(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

func bf16Generic(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

func q8Generic(dst []float32, src []byte) {
	for b := 0; b < len(dst)/32; b++ {
		blk := src[34*b : 34*b+34]
		d := HalfToFloat(binary.LittleEndian.Uint16(blk))
		for j := range 32 {
			dst[32*b+j] = float32(int8(blk[2+j])) * d
		}
	}
}

// tileFloats bounds the rows a typed product decodes at once: 24 KB of
// float32 stay in L1 while every token of the batch reads them.
const tileFloats = 6144

var tiles = sync.Pool{New: func() any { return new([]float32) }}

// typedRows computes rows [r0, r1) of the product of x (T rows of n) and
// w: a tile of rows decoded, then reduced for every token by the float32
// kernels, then the next tile.
func typedRows(out []float32, ostride int, x []float32, T int, w Matrix, n, r0, r1 int) {
	if k, steps := fusedRow(w.Type, n); k != nil && T < 4 {
		// Fewer tokens than a tile: each reads the rows itself, decoded
		// in registers, with the same bits as a decoded tile's DotRows.
		rb := w.Type.RowBytes(n)
		for t := range T {
			k(&x[t*n], &w.Raw[r0*rb], uintptr(rb), uintptr(steps), uintptr(r1-r0), &out[t*ostride+r0])
		}
		return
	}
	rows := max(3, tileFloats/n/3*3)
	buf := tiles.Get().(*[]float32)
	defer tiles.Put(buf)
	if cap(*buf) < rows*n {
		*buf = make([]float32, rows*n)
	}
	tile := (*buf)[:rows*n]
	for r := r0; r < r1; r += rows {
		e := min(r+rows, r1)
		w.DecodeRows(tile, n, r, e)
		stridedRows(out[r:], ostride, x, n, T, tile, n, n, 0, e-r)
	}
}

// fusedRow is the kernel set's row-by-row dot product over rows of type
// t, n values each, decoding in registers, and its step count (nil when
// there is none, or n has a tail the kernels do not take).
func fusedRow(t Type, n int) (func(x *float32, w *byte, rowBytes, steps, rows uintptr, out *float32), int) {
	k := active.typed
	switch {
	case t == Q8_0 && n >= 32:
		return k.dotRowQ8, n / 32
	case (t == F16 || t == BF16) && n >= 8 && n%8 == 0:
		return k.dotRow16[t-F16], n / 8
	}
	return nil, 0
}

// MatMulOf is MatMul for a weight matrix of any type: out[t*m+j] = Dot(x
// row t, decoded row j of w), with MatMul's split and roundings.
func MatMulOf(out, x []float32, T int, w Matrix, m, n int) {
	if w.Type == F32 {
		MatMul(out, x, T, w.F32, m, n)
		return
	}
	MatMuls(x, T, n, Product{Out: out, Typed: w, M: m})
}
