package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/lifeline-llm/lifeline/decode/matmul"
)

// revisionChunk is the number of values hashed as one piece of a tensor:
// the pieces are hashed on every core, since one SHA-256 pass over a
// checkpoint costs more than reading it (the start-up goal is to be
// ready in twice the time of one read).
const revisionChunk = 1 << 18

// revision hashes the shape and every weight: two models with the same
// revision compute the same function. It is the SHA-256 of the shape and,
// per tensor, of its name and the SHA-256 of each revisionChunk values of
// it (little-endian float32 bits), in order.
//
// The same pass refuses a NaN or an infinity anywhere (ErrNonFinite): each
// chunk is looked at while it is in cache, so a checkpoint's weights are
// read from memory once, not once per check.
func revision(c Config, w *Weights) (string, error) {
	ts := w.tensors(c)
	pieces := chunks(ts, revisionChunk)
	sums := make([][sha256.Size]byte, len(pieces))
	var bad atomic.Int64
	bad.Store(-1)
	forEachChunk(pieces, func(i int, buf []byte) {
		p := pieces[i]
		if p.raw != nil || p.typ != matmul.F32 {
			if !finiteTyped(p.typ, p.raw) {
				bad.CompareAndSwap(-1, int64(p.tensor))
				return
			}
			sums[i] = sha256.Sum256(p.raw)
			return
		}
		if !finite(p.data) {
			bad.CompareAndSwap(-1, int64(p.tensor))
			return
		}
		sums[i] = sha256.Sum256(float32Bytes(p.data, buf))
	})
	if t := bad.Load(); t >= 0 {
		return "", fmt.Errorf("%w in %s", ErrNonFinite, ts[t].name)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s;dim=%d;hidden=%d;layers=%d;heads=%d;kv_heads=%d;vocab=%d;ctx=%d;theta=%v;eps=%v;chunk=%d\x00",
		EngineVersion, c.Dim, c.HiddenDim, c.Layers, c.Heads, c.KVHeads, c.VocabSize, c.ContextLen, c.RopeTheta, c.NormEps, revisionChunk)
	if c.RopeNeox {
		h.Write([]byte("rope=neox\x00"))
	}
	if c.RopeFreqFactors != nil {
		fmt.Fprintf(h, "rope_freq_factors=%v\x00", c.RopeFreqFactors)
	}
	for i, p := range pieces {
		if p.first {
			h.Write([]byte(ts[p.tensor].name))
			if p.typ != matmul.F32 { // F32 tensors hash as they always have
				h.Write([]byte(":" + p.typ.String()))
			}
		}
		h.Write(sums[i][:])
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// ErrNonFinite is wrapped by the error of a model with a NaN or an
// infinity among its weights.
var ErrNonFinite = errors.New("model: non-finite weight")

// chunk is at most n consecutive values of one tensor: float32 data, or
// the bytes of a typed matrix (whole Q8_0 blocks).
type chunk struct {
	tensor int
	first  bool // the tensor's first chunk (an empty tensor has one, empty)
	data   []float32
	raw    []byte
	typ    matmul.Type
}

// chunks cuts every tensor into pieces of at most n values (typed ones
// into pieces of at most 4n bytes).
func chunks(tensors []namedTensor, n int) []chunk {
	var out []chunk
	for t, nt := range tensors {
		if raw := nt.typed.Raw; raw != nil {
			step := 4 * n
			if nt.typed.Type == matmul.Q8_0 {
				step = step / 34 * 34
			}
			out = append(out, chunk{tensor: t, first: true, raw: raw[:min(step, len(raw))], typ: nt.typed.Type})
			for i := step; i < len(raw); i += step {
				out = append(out, chunk{tensor: t, raw: raw[i:min(i+step, len(raw))], typ: nt.typed.Type})
			}
			continue
		}
		v := nt.data
		out = append(out, chunk{tensor: t, first: true, data: v[:min(n, len(v))]})
		for i := n; i < len(v); i += n {
			out = append(out, chunk{tensor: t, data: v[i:min(i+n, len(v))]})
		}
	}
	return out
}

// finite16 says whether no 16-bit value of raw has every bit of the
// exponent mask exp set, four values at a time: a lane of (v&exp)^exp is
// zero exactly for such a value, and the borrow trick finds a zero lane.
func finite16(raw []byte, exp uint64) bool {
	mask := exp * 0x0001000100010001
	i := 0
	for ; i+8 <= len(raw); i += 8 {
		y := binary.LittleEndian.Uint64(raw[i:])&mask ^ mask
		if (y-0x0001000100010001)&^y&0x8000800080008000 != 0 {
			return false
		}
	}
	for ; i+1 < len(raw); i += 2 {
		if uint64(binary.LittleEndian.Uint16(raw[i:]))&exp == exp {
			return false
		}
	}
	return true
}

// finiteTyped says whether every value of raw, of type t, is finite:
// no half or bfloat16 (a Q8_0 block's scale) with an all-ones exponent.
func finiteTyped(t matmul.Type, raw []byte) bool {
	switch t {
	case matmul.F16:
		return finite16(raw, 0x7c00)
	case matmul.BF16:
		return finite16(raw, 0x7f80)
	case matmul.Q8_0:
		for i := 1; i < len(raw); i += 34 {
			if raw[i]&0x7c == 0x7c {
				return false
			}
		}
	}
	return true
}

// forEachChunk calls fn for every chunk, on up to GOMAXPROCS goroutines;
// buf is fn's goroutine's scratch of 4*revisionChunk bytes.
func forEachChunk(pieces []chunk, fn func(i int, buf []byte)) {
	workers := min(runtime.GOMAXPROCS(0), len(pieces))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			if cpu.IsBigEndian {
				buf = make([]byte, 0, 4*revisionChunk)
			}
			for i := int(next.Add(1) - 1); i < len(pieces); i = int(next.Add(1) - 1) {
				fn(i, buf)
			}
		}()
	}
	wg.Wait()
}

// float32Bytes is v as little-endian bytes: v's own memory on a
// little-endian host, else encoded into buf.
func float32Bytes(v []float32, buf []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	if !cpu.IsBigEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
	}
	buf = buf[:0]
	for _, x := range v {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
	}
	return buf
}
