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

import "runtime"

type kernels struct {
	name string
	// dot4x3 stores four tokens' folded sums (no tail) for three rows:
	// token i's for row j at out + i*ostride + 4*j.
	dot4x3 func(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, out *float32, ostride uintptr, pf *float32)
	// dot8x3, where the CPU has it, is dot4x3 for eight tokens, rounding
	// every sum exactly as dot4x3 does (nil: none).
	dot8x3 func(x *float32, xstride uintptr, w *float32, wstride uintptr, n8 uintptr, out *float32, ostride uintptr, pf *float32)
	// dot1x4 stores four rows' folded sums (hsum8 of their lanes, no
	// tail) and prefetches pf, the next four rows.
	dot1x4 func(x *float32, w *float32, wstride uintptr, n8 uintptr, out *[4]float32, pf *float32)
	// dotRow, where the kernel set has it, stores rows rows' folded sums
	// (no tail) at out[0..rows) with dot1x4's bits, reading the rows one
	// after the other (nil: none).
	dotRow func(x *float32, w *float32, wstride uintptr, n8 uintptr, rows uintptr, out *float32)
	axpy   func(dst *float32, a float32, x *float32, n8 uintptr)
	// The elementwise kernels (elementwise.go) over 8*n8 floats.
	siluMul  func(a, b *float32, n8 uintptr)
	expSum   func(p *float32, shift float32, n8 uintptr) float32
	divMax   func(p *float32, d float32, n8 uintptr) float32
	axpyRows func(dst, a, v *float32, vstride, rows, n8 uintptr)
	// sum reads 32 floats per step: the read-bandwidth baseline.
	sum func(p *float32, n32 uintptr) float32
	// typed decodes rows of the weight types other than F32.
	typed typedKernels
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

// rowByRowMax is the longest row DotRows reads one row after the other
// (dotRow) rather than four side by side (dot1x4). Four rows side by side
// are four streams of a row's length each, too short for the hardware
// prefetcher to follow: on rows of 288 and 384 floats, dot1x4 read 60 MB at
// 81-83 % of the read-only stream's rate, dotRow at 97-99 %; on rows of 768
// it is the other way round (93 % against 86 %), the single chain of FMAs
// per row being too long for the next row's to overlap it.
const rowByRowMax = 512

// wideMaxN is the longest row the eight-token tile (dot8x3) is used for.
// A tile reads its tokens' activations once per three rows; eight tokens of
// up to 768 floats (24 KB) stay in a 32 KB L1 beside the rows, eight of
// 1,024 (32 KB) do not, and the tile then reads them from L2 at every
// step. Longer rows take the four-token tile (16 KB of activations at
// 1,024), which rounds every sum the same way: on a Zen 4 core, 16 and 448
// tokens times 1,024-float rows ran at 70 GFLOP/s with the eight-token tile
// and 78-83 with the four-token one (384-float rows: ~90 with either).
const wideMaxN = 768

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
	if active.dotRow != nil && n <= rowByRowMax {
		active.dotRow(&x[0], &w[0], uintptr(stride)*4, uintptr(n8), uintptr(len(out)), &out[0])
		if n8*8 != n {
			for r := range out {
				out[r] = tail(out[r], x, w[r*stride:], n8*8)
			}
		}
		return
	}
	var sums [4]float32
	r := 0
	for ; r+4 <= len(out); r += 4 {
		pf := &w[r*stride]
		if r+8 <= len(out) {
			pf = &w[(r+4)*stride]
		}
		active.dot1x4(&x[0], &w[r*stride], uintptr(stride)*4, uintptr(n8), &sums, pf)
		for j := 0; j < 4; j++ {
			out[r+j] = tail(sums[j], x, w[(r+j)*stride:], n8*8)
		}
	}
	for ; r < len(out); r++ {
		active.dot1x4(&x[0], &w[r*stride], 0, uintptr(n8), &sums, &w[r*stride])
		out[r] = tail(sums[0], x, w[r*stride:], n8*8)
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

// partsPerWorker is how many chunks a parallel product is split into per
// goroutine that may run it.
const partsPerWorker = 4

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
	// Chunks are multiples of 12 rows so that full tiles stay full, and
	// several per worker: a helper that loses its CPU mid-product holds
	// up only its chunk, the others are taken by whoever is running.
	chunk := (m + partsPerWorker*workers - 1) / (partsPerWorker * workers)
	chunk = max(12, (chunk+11)/12*12)
	Parallel((m+chunk-1)/chunk, func(part int) {
		r0 := part * chunk
		matmulRows(out, x, T, w, m, n, r0, min(r0+chunk, m))
	})
}

// Product is one of several products of the same activations: Out = x
// times the transpose of the M×n matrix W (as MatMul). Then, when not nil,
// is called with each range of rows [r0, r1) once those rows of Out are
// computed for every token, on the goroutine that computed them: for
// elementwise work on them.
type Product struct {
	Out, W []float32
	// Typed, when W is nil, is the weight matrix in another type.
	Typed Matrix
	M     int
	Then  func(r0, r1 int)
}

// MatMuls computes every product of x (T rows of n) in one parallel call:
// one wait for all of them instead of one each. Each product is split
// into the same number of row ranges as MatMul would split it; which
// goroutine computes a range never changes a result.
func MatMuls(x []float32, T, n int, prods ...Product) {
	if T == 0 {
		return
	}
	_ = x[T*n-1]
	macs, chunks := 0, make([]int, len(prods))
	for _, p := range prods {
		_ = p.Out[T*p.M-1]
		if p.W != nil {
			_ = p.W[p.M*n-1]
		} else if err := p.Typed.Check(p.M, n); err != nil {
			panic(err)
		}
		macs += T * p.M * n
	}
	workers := runtime.GOMAXPROCS(0)
	parts := partsPerWorker * workers
	if macs < minParallelMACs || workers == 1 {
		parts = 1
	}
	for i, p := range prods {
		chunks[i] = max(12, ((p.M+parts-1)/parts+11)/12*12)
	}
	Parallel(parts, func(part int) {
		for i, p := range prods {
			r0 := min(part*chunks[i], p.M)
			r1 := min(r0+chunks[i], p.M)
			if r0 == r1 {
				continue
			}
			if p.W != nil {
				matmulRows(p.Out, x, T, p.W, p.M, n, r0, r1)
			} else if p.Typed.Type == F32 {
				matmulRows(p.Out, x, T, p.Typed.F32, p.M, n, r0, r1)
			} else {
				typedRows(p.Out, p.M, x, T, p.Typed, n, r0, r1)
			}
			if p.Then != nil {
				p.Then(r0, r1)
			}
		}
	})
}

// Stream reads every element of buf once, with the widest loads of the
// kernel set and on the same goroutines as MatMul, and returns their sum so
// that no read can be skipped. It is the read-bandwidth baseline the
// products are measured against: a read-only stream over as many bytes as
// a product's weights.
func Stream(buf []float32) float32 {
	parts := min(runtime.GOMAXPROCS(0), maxHelpers+1)
	if len(buf) < minParallelMACs {
		parts = 1
	}
	chunk := (len(buf)/parts + 31) / 32 * 32
	var sums [maxHelpers + 1]float32
	Parallel(parts, func(part int) {
		lo := min(part*chunk, len(buf))
		hi := min(lo+chunk, len(buf))
		n32 := (hi - lo) / 32
		var s float32
		if n32 > 0 {
			s = active.sum(&buf[lo], uintptr(n32))
		}
		for _, v := range buf[lo+n32*32 : hi] {
			s += v
		}
		sums[part] = s
	})
	var s float32
	for _, v := range sums[:parts] {
		s += v
	}
	return s
}

func matmulRows(out, x []float32, T int, w []float32, m, n, r0, r1 int) {
	stridedRows(out, m, x, n, T, w, n, n, r0, r1)
}

// MatMulStrided sets out[t*ostride+j] = Dot(x[t*xstride:t*xstride+n],
// w[j*wstride:j*wstride+n]) for t < T and j < m, with the rounding of every
// other product in this package, on the calling goroutine: rows of x and w
// may lie apart in larger arrays (a head's queries among all heads' of a
// token, a KV block's keys among its values). Strides must be at least n,
// ostride at least m.
func MatMulStrided(out []float32, ostride int, x []float32, xstride, T int, w []float32, wstride, m, n int) {
	if T == 0 || m == 0 {
		return
	}
	if ostride < m || xstride < n || wstride < n {
		panic("matmul: MatMulStrided stride shorter than its row")
	}
	_ = out[(T-1)*ostride+m-1]
	if n > 0 {
		_ = x[(T-1)*xstride+n-1]
		_ = w[(m-1)*wstride+n-1]
	}
	stridedRows(out, ostride, x, xstride, T, w, wstride, n, 0, m)
}

// stridedRows computes rows [r0, r1) of the product: token t's row r at
// out[t*ostride+r], from x[t*xstride:] and w[r*wstride:], n floats each.
func stridedRows(out []float32, ostride int, x []float32, xstride, T int, w []float32, wstride, n, r0, r1 int) {
	if n == 0 {
		for t := 0; t < T; t++ {
			clear(out[t*ostride+r0 : t*ostride+r1])
		}
		return
	}
	n8 := n / 8
	xs, ws, os := uintptr(xstride)*4, uintptr(wstride)*4, uintptr(ostride)*4
	T4 := T &^ 3
	// addTails adds the products past the last 8-float step to the sums
	// the kernel stored; all our dimensions are multiples of 8, so it
	// rarely has anything to do.
	addTails := func(t, r, rows int) {
		if n8*8 == n {
			return
		}
		for i := 0; i < 4; i++ {
			for j := 0; j < rows; j++ {
				o := &out[(t+i)*ostride+r+j]
				*o = tail(*o, x[(t+i)*xstride:(t+i)*xstride+n], w[(r+j)*wstride:], n8*8)
			}
		}
	}
	r := r0
	for ; r+3 <= r1; r += 3 {
		// Prefetch what follows this triple into L2 while the first token
		// group runs (the kernels prefetch 3-4 rows' worth from the next
		// row on: the next rows themselves when they are contiguous); the
		// later groups find this triple in cache.
		next := &w[r*wstride]
		if r+6 <= r1 {
			next = &w[(r+3)*wstride]
		}
		t := 0
		if active.dot8x3 != nil && n <= wideMaxN {
			for ; t+8 <= T4; t += 8 {
				pf := next
				if t > 0 {
					pf = &w[r*wstride]
				}
				active.dot8x3(&x[t*xstride], xs, &w[r*wstride], ws, uintptr(n8), &out[t*ostride+r], os, pf)
				addTails(t, r, 3)
				addTails(t+4, r, 3)
			}
		}
		for ; t < T4; t += 4 {
			pf := next
			if t > 0 {
				pf = &w[r*wstride]
			}
			active.dot4x3(&x[t*xstride], xs, &w[r*wstride], ws, uintptr(n8), &out[t*ostride+r], os, pf)
			addTails(t, r, 3)
		}
	}
	var one [12]float32
	for ; r < r1; r++ {
		for t := 0; t < T4; t += 4 {
			// A zero weight stride computes the one row three times.
			active.dot4x3(&x[t*xstride], xs, &w[r*wstride], 0, uintptr(n8), &one[0], 12, &w[r*wstride])
			for i := 0; i < 4; i++ {
				out[(t+i)*ostride+r] = one[i*3]
			}
			addTails(t, r, 1)
		}
	}
	for t := T4; t < T; t++ {
		DotRows(out[t*ostride+r0:t*ostride+r1], x[t*xstride:t*xstride+n], w[r0*wstride:], wstride)
	}
}
