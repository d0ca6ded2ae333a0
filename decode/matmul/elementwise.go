package matmul

import (
	"math"
	"unsafe"
)

// The elementwise work of a layer — SwiGLU's gate, softmax's exponentials
// and divisions, attention's weighted sum of value rows — in 8-float steps
// like the products, with a fixed order for every sum and maximum.
//
// The exponential (expNeg) is the Cephes expf recipe in single precision:
// n = ⌊x·log₂e + ½⌋, r = x − n·ln2hi − n·ln2lo, a degree-5 polynomial in r,
// scaled by 2ⁿ. It uses multiplies and adds only, each rounded to float32,
// so the portable functions here and the assembly give the same bits: the
// exponential does not depend on the CPU having FMA, as math.Exp does.

const (
	expLo    float32 = -87 // 2^n stays normal for every n this clamp allows
	expLog2e float32 = 1.44269504088896341
	expLn2Hi float32 = 0.693359375 // few bits: n·ln2Hi is exact
	expLn2Lo float32 = -2.12194440e-4
	expP0    float32 = 1.9875691500e-4
	expP1    float32 = 1.3981999507e-3
	expP2    float32 = 8.3334519073e-3
	expP3    float32 = 4.1665795894e-2
	expP4    float32 = 1.6666665459e-1
	expP5    float32 = 5.0000001201e-1
)

// expNeg returns e^x for x clamped to [-87, 0] (NaN stays NaN), within two
// units in the last place of float32 over that range. Every product is
// converted explicitly so that no compiler fuses it into an add.
func expNeg(x float32) float32 {
	if x != x {
		return x
	}
	x = min(max(x, expLo), 0)
	fx := float32(math.Floor(float64(float32(x*expLog2e) + 0.5)))
	x -= float32(fx * expLn2Hi)
	x -= float32(fx * expLn2Lo)
	z := float32(x * x)
	y := float32(expP0*x) + expP1
	y = float32(y*x) + expP2
	y = float32(y*x) + expP3
	y = float32(y*x) + expP4
	y = float32(y*x) + expP5
	y = float32(y*z) + x
	y++
	return float32(y * math.Float32frombits(uint32(int32(fx)+127)<<23))
}

// silu is h·σ(h) from e = e^-|h|, which never overflows: h/(1+e) for h ≥ 0,
// h·e/(1+e) below.
func silu(h float32) float32 {
	e := expNeg(math.Float32frombits(math.Float32bits(h) | 1<<31))
	num := h
	if math.Signbit(float64(h)) {
		num = float32(h * e)
	}
	return num / (e + 1)
}

// vmax is the maximum as the assembly's VMAXPS(m, x) keeps it: x unless m
// is greater (so a NaN x replaces m, a NaN m is replaced).
func vmax(m, x float32) float32 {
	if m > x {
		return m
	}
	return x
}

// hmax8 folds eight lane maxima in hsum8's order.
func hmax8(l []float32) float32 {
	_ = l[7]
	return vmax(vmax(vmax(l[0], l[4]), vmax(l[2], l[6])), vmax(vmax(l[1], l[5]), vmax(l[3], l[7])))
}

// SiLUMul sets a[i] = silu(a[i]) · b[i] for i < len(a): SwiGLU's gate.
func SiLUMul(a, b []float32) {
	n := len(a)
	if n == 0 {
		return
	}
	_ = b[n-1]
	n8 := n / 8
	if n8 > 0 {
		active.siluMul(&a[0], &b[0], uintptr(n8))
	}
	for i := n8 * 8; i < n; i++ {
		a[i] = float32(silu(a[i]) * b[i])
	}
}

// SoftmaxExp sets s[i] = Exp(s[i] - shift) and returns their sum: eight lane
// sums in 8-float steps folded as hsum8, then the tail in index order.
func SoftmaxExp(s []float32, shift float32) float32 {
	n8 := len(s) / 8
	var sum float32
	if n8 > 0 {
		sum = active.expSum(&s[0], shift, uintptr(n8))
	}
	for i := n8 * 8; i < len(s); i++ {
		s[i] = expNeg(s[i] - shift)
		sum += s[i]
	}
	return sum
}

// DivMax sets s[i] /= d and returns the largest quotient (-Inf for none):
// eight lane maxima folded as hsum8 folds sums, then the tail in index
// order. A NaN is not reliably propagated to the result.
func DivMax(s []float32, d float32) float32 {
	n8 := len(s) / 8
	m := float32(math.Inf(-1))
	if n8 > 0 {
		m = active.divMax(&s[0], d, uintptr(n8))
	}
	for i := n8 * 8; i < len(s); i++ {
		s[i] /= d
		m = vmax(m, s[i])
	}
	return m
}

// AxpyRows adds a[r]·v[r*stride:][:len(dst)] to dst for every r in order:
// the same bits as one Axpy per row, with dst kept in registers across the
// rows.
func AxpyRows(dst, a, v []float32, stride int) {
	n := len(dst)
	if n == 0 || len(a) == 0 {
		return
	}
	_ = v[(len(a)-1)*stride+n-1]
	n8 := n / 8
	if n8 > 0 {
		active.axpyRows(&dst[0], &a[0], &v[0], uintptr(stride)*4, uintptr(len(a)), uintptr(n8))
	}
	if n8*8 == n {
		return
	}
	for r, ar := range a {
		row := v[r*stride:][:n]
		for i := n8 * 8; i < n; i++ {
			dst[i] += float32(ar * row[i])
		}
	}
}

func siluMulGeneric(a, b *float32, n8 uintptr) {
	n := int(n8) * 8
	as, bs := unsafe.Slice(a, n), unsafe.Slice(b, n)
	for i, h := range as {
		as[i] = float32(silu(h) * bs[i])
	}
}

func expSumGeneric(p *float32, shift float32, n8 uintptr) float32 {
	var lanes [8]float32
	for i, v := range unsafe.Slice(p, int(n8)*8) {
		e := expNeg(v - shift)
		unsafe.Slice(p, int(n8)*8)[i] = e
		lanes[i%8] += e
	}
	return hsum8(lanes[:])
}

func divMaxGeneric(p *float32, d float32, n8 uintptr) float32 {
	lanes := [8]float32{}
	for l := range lanes {
		lanes[l] = float32(math.Inf(-1))
	}
	s := unsafe.Slice(p, int(n8)*8)
	for i := range s {
		s[i] /= d
		lanes[i%8] = vmax(lanes[i%8], s[i])
	}
	return hmax8(lanes[:])
}

func axpyRowsGeneric(dst, a, v *float32, vstride, rows, n8 uintptr) {
	as := unsafe.Slice(a, rows)
	for r := range as {
		axpyGeneric(dst, as[r], (*float32)(unsafe.Add(unsafe.Pointer(v), uintptr(r)*vstride)), n8)
	}
}
