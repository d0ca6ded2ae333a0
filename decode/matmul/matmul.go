// Package matmul holds the float32 kernels of the reference engine: a
// batched matrix-vector product, strided dot products and axpy.
//
// Every output element is reduced over the inner dimension in one fixed
// order — eight lane accumulators fed in 8-float steps, folded by hsum8, then
// the tail in index order — no matter how many tokens are in the batch or
// which tile computed it. That is what makes the engine batch-invariant and
// prefill/decode-invariant bit for bit, while tiles of 4 tokens × 3 rows
// still reuse each weight load four times so that batching pays.
package matmul

import (
	"runtime"
	"sync"
)

type kernels struct {
	name   string
	dot4x3 func(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, acc *[96]float32, pf *float32)
	dot1x4 func(x *float32, w *float32, wstride uintptr, n8 uintptr, acc *[32]float32)
	axpy   func(dst *float32, a float32, x *float32, n8 uintptr)
}

var active = genericKernels

// KernelName names the kernel set in use; it is part of the engine's
// numerics id, since different kernels round differently.
func KernelName() string { return active.name }

// UseGeneric switches to the portable kernels and returns a function that
// restores the previous set. Tests use it to check that the invariances hold
// for both; it must not be called while a product is running.
func UseGeneric() (restore func()) {
	prev := active
	active = genericKernels
	return func() { active = prev }
}

// hsum8 folds eight lanes in the order the AVX2 reduction tree would:
// halves, then quarters, then pairs.
func hsum8(l []float32) float32 {
	_ = l[7]
	a0 := l[0] + l[4]
	a1 := l[1] + l[5]
	a2 := l[2] + l[6]
	a3 := l[3] + l[7]
	return (a0 + a2) + (a1 + a3)
}

// tail adds the products past the last full 8-float step, in index order.
func tail(s float32, x, w []float32, from int) float32 {
	for i := from; i < len(x); i++ {
		s += float32(x[i] * w[i])
	}
	return s
}

// Dot returns the dot product of x and w (len(w) >= len(x)) with the same
// rounding as every other kernel in this package.
func Dot(x, w []float32) float32 {
	var out [1]float32
	DotRows(out[:], x, w, 0)
	return out[0]
}

// DotRows sets out[i] = Dot(x, w[i*stride:]) for i < len(out). A stride of
// zero is allowed and repeats the first row.
func DotRows(out []float32, x, w []float32, stride int) {
	n := len(x)
	if len(out) == 0 || n == 0 {
		clear(out)
		return
	}
	_ = w[(len(out)-1)*stride+n-1]
	n8 := n / 8
	var acc [32]float32
	r := 0
	for ; r+4 <= len(out); r += 4 {
		active.dot1x4(&x[0], &w[r*stride], uintptr(stride)*4, uintptr(n8), &acc)
		for j := 0; j < 4; j++ {
			out[r+j] = tail(hsum8(acc[j*8:j*8+8]), x, w[(r+j)*stride:], n8*8)
		}
	}
	for ; r < len(out); r++ {
		active.dot1x4(&x[0], &w[r*stride], 0, uintptr(n8), &acc)
		out[r] = tail(hsum8(acc[:8]), x, w[r*stride:], n8*8)
	}
}

// Axpy sets dst[i] += a*x[i] for i < len(dst), fused where the kernel fuses.
func Axpy(dst []float32, a float32, x []float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	_ = x[n-1]
	n8 := n / 8
	if n8 > 0 {
		active.axpy(&dst[0], a, &x[0], uintptr(n8))
	}
	for i := n8 * 8; i < n; i++ {
		dst[i] += float32(a * x[i])
	}
}

// minParallelMACs is the work below which splitting a product across
// goroutines costs more than it saves.
const minParallelMACs = 1 << 16

// MatMul sets out[t*m+j] = Dot(x[t*n:(t+1)*n], w[j*n:(j+1)*n]) for t < T and
// j < m: T activation rows times the transpose of an m×n weight matrix.
// Rows of w are split across GOMAXPROCS goroutines; the split never changes
// a result, only who computes it.
func MatMul(out, x []float32, T int, w []float32, m, n int) {
	if T == 0 || m == 0 {
		return
	}
	_ = out[T*m-1]
	_ = x[T*n-1]
	_ = w[m*n-1]
	workers := runtime.GOMAXPROCS(0)
	if T*m*n < minParallelMACs || workers == 1 {
		matmulRows(out, x, T, w, m, n, 0, m)
		return
	}
	// Chunks are multiples of 12 rows so that full tiles stay full.
	chunk := (m + workers - 1) / workers
	chunk = (chunk + 11) / 12 * 12
	var wg sync.WaitGroup
	for r0 := chunk; r0 < m; r0 += chunk {
		r1 := min(r0+chunk, m)
		wg.Add(1)
		go func() {
			defer wg.Done()
			matmulRows(out, x, T, w, m, n, r0, r1)
		}()
	}
	matmulRows(out, x, T, w, m, n, 0, min(chunk, m))
	wg.Wait()
}

func matmulRows(out, x []float32, T int, w []float32, m, n, r0, r1 int) {
	if n == 0 {
		for t := 0; t < T; t++ {
			clear(out[t*m+r0 : t*m+r1])
		}
		return
	}
	n8 := n / 8
	xs := uintptr(n) * 4
	T4 := T &^ 3
	var acc [96]float32
	store := func(t, r, k int) {
		out[t*m+r] = tail(hsum8(acc[k*8:k*8+8]), x[t*n:(t+1)*n], w[r*n:], n8*8)
	}
	r := r0
	for ; r+3 <= r1; r += 3 {
		// Prefetch the next three rows while the first token group runs;
		// the later groups find this triple in cache.
		next := &w[r*n]
		if r+6 <= r1 {
			next = &w[(r+3)*n]
		}
		for t := 0; t < T4; t += 4 {
			pf := next
			if t > 0 {
				pf = &w[r*n]
			}
			active.dot4x3(&x[t*n], xs, &w[r*n], xs, uintptr(n8), &acc, pf)
			for i := 0; i < 4; i++ {
				for j := 0; j < 3; j++ {
					store(t+i, r+j, i*3+j)
				}
			}
		}
	}
	for ; r < r1; r++ {
		for t := 0; t < T4; t += 4 {
			// A zero weight stride computes the one row three times.
			active.dot4x3(&x[t*n], xs, &w[r*n], 0, uintptr(n8), &acc, &w[r*n])
			for i := 0; i < 4; i++ {
				store(t+i, r, i*3)
			}
		}
	}
	for t := T4; t < T; t++ {
		DotRows(out[t*m+r0:t*m+r1], x[t*n:(t+1)*n], w[r0*n:], n)
	}
}
