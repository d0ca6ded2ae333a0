package matmul

import (
	"math"
	"unsafe"
)

// The generic kernels follow the lane schedule of the assembly ones, but Go
// has no single-precision fused multiply-add: math.FMA in float64 followed
// by a rounding to float32 rounds twice, which differs from a true float32
// FMA in rare cases. They therefore carry their own kernel name, and bit-exact
// continuation is only promised between instances with the same numerics id.

func fma32(a, b, c float32) float32 {
	return float32(math.FMA(float64(a), float64(b), float64(c)))
}

func dot4x3Generic(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, out *float32, ostride uintptr, _ *float32) {
	n := int(n8) * 8
	for t := 0; t < 4; t++ {
		xr := unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(x), uintptr(t)*xstride)), n)
		o := unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(out), uintptr(t)*ostride)), 3)
		for r := 0; r < 3; r++ {
			wr := unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(w), uintptr(r)*wstride)), n)
			var lanes [8]float32
			for i := 0; i < n; i += 8 {
				for l := 0; l < 8; l++ {
					lanes[l] = fma32(wr[i+l], xr[i+l], lanes[l])
				}
			}
			o[r] = hsum8(lanes[:])
		}
	}
}

func dot1x4Generic(x *float32, w *float32, wstride uintptr, n8 uintptr, out *[4]float32, _ *float32) {
	n := int(n8) * 8
	xr := unsafe.Slice(x, n)
	for r := 0; r < 4; r++ {
		wr := unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(w), uintptr(r)*wstride)), n)
		var lanes [8]float32
		for i := 0; i < n; i += 8 {
			for l := 0; l < 8; l++ {
				lanes[l] = fma32(wr[i+l], xr[i+l], lanes[l])
			}
		}
		out[r] = hsum8(lanes[:])
	}
}

func axpyGeneric(dst *float32, a float32, x *float32, n8 uintptr) {
	n := int(n8) * 8
	d := unsafe.Slice(dst, n)
	xs := unsafe.Slice(x, n)
	for i := range d {
		d[i] = fma32(a, xs[i], d[i])
	}
}

var genericKernels = kernels{
	name:   "generic-fma64",
	dot4x3: dot4x3Generic,
	dot1x4: dot1x4Generic,
	axpy:   axpyGeneric,
	sum:    sumGeneric,

	siluMul:  siluMulGeneric,
	expSum:   expSumGeneric,
	divMax:   divMaxGeneric,
	axpyRows: axpyRowsGeneric,

	typed: genericTyped,
}

func sumGeneric(p *float32, n32 uintptr) float32 {
	var acc [32]float32
	for i, v := range unsafe.Slice(p, int(n32)*32) {
		acc[i%32] += v
	}
	var s float32
	for _, v := range acc {
		s += v
	}
	return s
}
