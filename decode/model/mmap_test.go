package model

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// mapsHere says whether LoadLlama2C maps checkpoints on this host.
var mapsHere = runtime.GOOS == "linux" && !cpu.IsBigEndian

// writeCheckpoint writes tiny's weights (no output bias; the classifier
// shared with the embedding or not) as a model.bin and returns its path,
// its bytes and the model.
func writeCheckpoint(t *testing.T, shared bool) (string, []byte, *Model) {
	t.Helper()
	w := tinyModel(t).W
	w.OutputBias = nil
	if shared {
		w.Classifier = w.Embedding
	}
	m, err := New(tinyModel(t).Config, &w)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteLlama2C(&buf, m); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.bin")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, buf.Bytes(), m
}

// mappedFrom reports whether v lies in a mapping of path in this process
// (/proc/self/maps).
func mappedFrom(t *testing.T, v []float32, path string) bool {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := uintptr(unsafe.Pointer(&v[0])), uintptr(unsafe.Pointer(&v[len(v)-1]))
	for _, line := range strings.Split(string(maps), "\n") {
		var from, to uintptr
		if !strings.HasSuffix(line, " "+path) {
			continue
		}
		if _, err := fmt.Sscanf(line, "%x-%x", &from, &to); err == nil && from <= lo && hi < to {
			return true
		}
	}
	return false
}

// decodeGreedy prefills prompt in one call, then decodes n tokens one
// position at a time, each the argmax of the previous logits; it returns
// every position's logits and the tokens.
func decodeGreedy(t *testing.T, m *Model, prompt []int, n int) ([][]float32, []int) {
	t.Helper()
	toks := append([]int{}, prompt...)
	r := newSeqRunner(t, m, len(prompt)+n)
	logits := r.run(t, toks, 0, len(toks))
	for range n {
		last := logits[len(logits)-1]
		next := 0
		for i, x := range last {
			if x > last[next] {
				next = i
			}
		}
		toks = append(toks, next)
		logits = append(logits, r.run(t, toks, len(toks)-1, len(toks))...)
	}
	return logits, toks[len(prompt):]
}

// TestLoadLlama2CMapsAndMatchesTheReader: the loaded weights lie in the
// file's mapping, and the model computes bit for bit what the copying
// reader's does, with the same revision.
func TestLoadLlama2CMapsAndMatchesTheReader(t *testing.T) {
	for _, shared := range []bool{false, true} {
		path, data, src := writeCheckpoint(t, shared)
		mapped, err := LoadLlama2C(path)
		if err != nil {
			t.Fatal(err)
		}
		read, err := ReadLlama2C(bufio.NewReader(bytes.NewReader(data)), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		if mapsHere {
			for name, v := range map[string][]float32{"embedding": mapped.W.Embedding, "classifier": mapped.W.Classifier, "last w3": mapped.W.Layers[len(mapped.W.Layers)-1].W3} {
				if !mappedFrom(t, v, path) {
					t.Fatalf("shared=%v: %s is not in a mapping of %s", shared, name, path)
				}
			}
			if mappedFrom(t, read.W.Embedding, path) {
				t.Fatal("the reader's weights are in the mapping")
			}
		}
		if mapped.Revision != read.Revision || mapped.Revision != src.Revision {
			t.Fatalf("shared=%v: revisions mapped %s, read %s, written %s", shared, mapped.Revision, read.Revision, src.Revision)
		}
		if got := &mapped.W.Classifier[0] == &mapped.W.Embedding[0]; got != shared {
			t.Fatalf("shared=%v: mapped classifier aliases the embedding: %v", shared, got)
		}
		la, ta := decodeGreedy(t, mapped, testTokens(12, 5), 12)
		lb, tb := decodeGreedy(t, read, testTokens(12, 5), 12)
		for p := range la {
			if i := sameBits(la[p], lb[p]); i >= 0 {
				t.Fatalf("shared=%v position %d logit %d: mapped %v, read %v", shared, p, i, la[p][i], lb[p][i])
			}
		}
		if fmt.Sprint(ta) != fmt.Sprint(tb) {
			t.Fatalf("shared=%v: tokens mapped %v, read %v", shared, ta, tb)
		}
	}
}

// TestMappedCheckpointIsNotWritten: decoding with the model, its
// self-draft and a tensor-parallel shard leaves the file's bytes as they
// were, and a write into a weight faults (the pages are read-only).
func TestMappedCheckpointIsNotWritten(t *testing.T) {
	if !mapsHere {
		t.Skip("checkpoints are mapped on little-endian linux only; this host reads them")
	}
	path, data, _ := writeCheckpoint(t, false)
	before := sha256.Sum256(data)
	m, err := LoadLlama2C(path)
	if err != nil {
		t.Fatal(err)
	}
	draft, err := m.FirstLayers(1)
	if err != nil {
		t.Fatal(err)
	}
	shard, err := m.Shard(0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, mm := range []*Model{m, draft, shard} {
		decodeGreedy(t, mm, testTokens(8, 2), 8)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(after) != before {
		t.Fatal("decoding changed the mapped checkpoint")
	}
	if faulted := writeFaults(&m.W.Layers[0].Wq[3]); !faulted {
		t.Fatal("a write into a mapped weight did not fault")
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, data) {
		t.Fatal("the file changed")
	}
}

// writeFaults writes into *p and reports whether that faulted.
func writeFaults(p *float32) (faulted bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() { faulted = recover() != nil }()
	*p = 1
	return false
}

// TestLoadLlama2CRefusesBadFiles: a file of the wrong size, a cut header
// or a non-finite weight is ErrBadCheckpoint on the mapping path as on the
// reader's, never a panic; a non-finite value in the unused RoPE tables is
// no error on either.
func TestLoadLlama2CRefusesBadFiles(t *testing.T) {
	_, data, m := writeCheckpoint(t, false)
	c := m.Config
	at := func(floats int) int { return 4*llama2CHeaderInts + 4*floats }
	ropeAt := at(len(data)/4 - llama2CHeaderInts - c.VocabSize*c.Dim - c.ContextLen*c.HeadSize())
	withNaN := func(off int) []byte {
		b := append([]byte{}, data...)
		copy(b[off:], []byte{0, 0, 0xc0, 0x7f})
		return b
	}
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		data []byte
		ok   bool
	}{
		"empty":                 {data: nil},
		"cut header":            {data: data[:10]},
		"header only":           {data: data[:at(0)]},
		"truncated":             {data: data[:len(data)-4]},
		"truncated by half":     {data: data[:len(data)/2]},
		"one float too many":    {data: append(append([]byte{}, data...), 0, 0, 0, 0)},
		"one byte too many":     {data: append(append([]byte{}, data...), 0)},
		"nan in the embedding":  {data: withNaN(at(5))},
		"nan in the classifier": {data: withNaN(len(data) - 4)},
		"nan in the rope table": {data: withNaN(ropeAt), ok: true},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(path, tc.data, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadLlama2C(path)
		_, rerr := ReadLlama2C(bytes.NewReader(tc.data), int64(len(tc.data)))
		switch {
		case tc.ok && (err != nil || rerr != nil):
			t.Errorf("%s: mapped %v, read %v; want both loaded", name, err, rerr)
		case !tc.ok && (!errors.Is(err, ErrBadCheckpoint) || !errors.Is(rerr, ErrBadCheckpoint)):
			t.Errorf("%s: mapped %v, read %v; want ErrBadCheckpoint from both", name, err, rerr)
		}
	}
}

// TestRevisionSeesEveryChunk: a change in any chunk of a tensor longer
// than one chunk changes the revision; equal weights give equal ones.
func TestRevisionSeesEveryChunk(t *testing.T) {
	c := Config{Name: "wide", Dim: 64, HiddenDim: 64, Layers: 1, Heads: 2, KVHeads: 2, VocabSize: 3*revisionChunk/64 + 5, ContextLen: 8, RopeTheta: 10000, NormEps: 1e-5}
	m, err := Random(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Random(c, 1)
	if again.Revision != m.Revision {
		t.Fatal("equal weights, different revisions")
	}
	for _, i := range []int{0, revisionChunk - 1, revisionChunk, 2*revisionChunk + 17, len(m.W.Classifier) - 1} {
		w := m.W
		w.Classifier = append([]float32{}, m.W.Classifier...)
		w.Classifier[i] = math.Nextafter32(w.Classifier[i], 2)
		changed, err := New(c, &w)
		if err != nil {
			t.Fatal(err)
		}
		if changed.Revision == m.Revision {
			t.Fatalf("classifier value %d changed, revision did not", i)
		}
	}
}

// FuzzLlama2CFromBytes: the in-place decoder of a mapping and the reader
// agree on every input: both refuse it with ErrBadCheckpoint, or both
// decode it to the same revision.
func FuzzLlama2CFromBytes(f *testing.F) {
	if cpu.IsBigEndian {
		f.Skip("the in-place decoder runs on little-endian hosts only")
	}
	for _, shared := range []bool{true, false} {
		var buf bytes.Buffer
		if err := WriteLlama2C(&buf, microModel(f, shared)); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// A mapping is page-aligned: so is a float32 buffer, enough.
		aligned := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(make([]float32, len(data)/4+1)))), len(data))
		copy(aligned, data)
		a, err := llama2CFromBytes(aligned, "")
		b, rerr := ReadLlama2C(bytes.NewReader(data), int64(len(data)))
		switch {
		case (err == nil) != (rerr == nil):
			t.Fatalf("in place %v, reader %v", err, rerr)
		case err != nil && (!errors.Is(err, ErrBadCheckpoint) || !errors.Is(rerr, ErrBadCheckpoint)):
			t.Fatalf("in place %v, reader %v: want ErrBadCheckpoint", err, rerr)
		case err == nil && a.Revision != b.Revision:
			t.Fatalf("revisions in place %s, reader %s", a.Revision, b.Revision)
		}
	})
}

// TestFiniteMatchesIsNaNIsInf: the two-at-a-time check agrees with
// math.IsNaN and math.IsInf at every length, alignment and position.
func TestFiniteMatchesIsNaNIsInf(t *testing.T) {
	values := []uint32{0, 0x80000000, 1, 0x007fffff, 0x7f7fffff, 0xff7fffff, 0x3f800000, 0x7f000000, // finite
		0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0xffffffff} // infinities and NaNs
	backing := make([]float32, 12)
	for off := 0; off < 2; off++ {
		for n := 0; n <= 10; n++ {
			for pos := 0; pos < n; pos++ {
				for _, bits := range values {
					v := backing[off : off+n]
					for i := range v {
						v[i] = float32(i) - 3.5
					}
					v[pos] = math.Float32frombits(bits)
					x := float64(v[pos])
					if want := !math.IsNaN(x) && !math.IsInf(x, 0); finite(v) != want {
						t.Fatalf("offset %d length %d: %#08x at %d: finite %v, want %v", off, n, bits, pos, !want, want)
					}
				}
			}
		}
	}
	if !finite(nil) {
		t.Fatal("an empty tensor is not finite")
	}
}
