package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// sample is a small valid file: every value type, arrays, two tensors.
func sample(t testing.TB, arch string) []byte {
	t.Helper()
	kvs := []KV{
		{"general.architecture", arch},
		{"general.name", "sample"},
		{arch + ".context_length", uint32(2048)},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", Strings([]string{"<unk>", "<s>", "</s>", "▁hello", "世界"})},
		{"tokenizer.ggml.scores", Float32s([]float32{0, 0, 0, -1.5, -2})},
		{"tokenizer.ggml.token_type", Int32s([]int32{2, 3, 3, 1, 1})},
		{"u8", uint8(7)}, {"i8", int8(-7)}, {"u16", uint16(700)}, {"i16", int16(-700)},
		{"i32", int32(-70000)}, {"f32", float32(1.5)}, {"b", true}, {"u64", uint64(1 << 40)},
		{"i64", int64(-1 << 40)}, {"f64", 2.25},
	}
	q8 := make([]byte, 2*34) // 64 elements of Q8_0: two blocks
	f32 := make([]byte, 3*4*4)
	var b bytes.Buffer
	if err := Write(&b, kvs, []TensorData{
		{Tensor: Tensor{Name: "token_embd.weight", Dims: []uint64{64}, Type: Q8_0}, Data: q8},
		{Tensor: Tensor{Name: "output_norm.weight", Dims: []uint64{4, 3}, Type: F32}, Data: f32},
	}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func write(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRoundTrip: what Write writes, Open reads back, value for value,
// with the tensors where they are.
func TestRoundTrip(t *testing.T) {
	f, err := Open(write(t, sample(t, "llama")))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Check(); err != nil {
		t.Fatal(err)
	}
	if f.Architecture() != "llama" || f.ContextLength() != 2048 || f.Version != 3 || len(f.KV) != 17 {
		t.Fatalf("%+v", f)
	}
	for key, want := range map[string]any{"u8": uint8(7), "i8": int8(-7), "u16": uint16(700), "i16": int16(-700), "i32": int32(-70000),
		"f32": float32(1.5), "b": true, "u64": uint64(1 << 40), "i64": int64(-1 << 40), "f64": 2.25} {
		if got, ok := f.Get(key); !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, want %#v", key, got, want)
		}
	}
	toks, _ := f.Get("tokenizer.ggml.tokens")
	if a := toks.(Array); a.Type != TypeString || !reflect.DeepEqual(a.Values, []any{"<unk>", "<s>", "</s>", "▁hello", "世界"}) {
		t.Fatalf("tokens %#v", toks)
	}
	if len(f.Tensors) != 2 || f.Tensors[1].Offset != 96 || f.DataOffset%32 != 0 || f.Tensors[0].Type != Q8_0 {
		t.Fatalf("tensors %+v at %d", f.Tensors, f.DataOffset)
	}
	if s := f.Summary(); !strings.Contains(s, "llama, GGUF v3, 2 tensors (1 F32, 1 Q8_0), context 2048") {
		t.Fatal(s)
	}
}

// TestRefusals: each bad file is refused with the error that names it.
func TestRefusals(t *testing.T) {
	good := sample(t, "llama")
	llama2c := binary.LittleEndian.AppendUint32(nil, 288) // a llama2.c header starts with dim
	unknownType := sample(t, "llama")
	// The second tensor's type: after its name, dimension count and dims.
	i := bytes.LastIndex(unknownType, []byte("output_norm.weight")) + len("output_norm.weight") + 4 + 16
	binary.LittleEndian.PutUint32(unknownType[i:], 31)
	bigArray := append([]byte(nil), good[:24]...)
	binary.LittleEndian.PutUint64(bigArray[8:], 0)  // no tensors
	binary.LittleEndian.PutUint64(bigArray[16:], 1) // one key
	bigArray = binary.LittleEndian.AppendUint64(bigArray, 1)
	bigArray = append(bigArray, 'a')
	bigArray = binary.LittleEndian.AppendUint32(bigArray, uint32(TypeArray))
	bigArray = binary.LittleEndian.AppendUint32(bigArray, uint32(TypeUint64))
	bigArray = binary.LittleEndian.AppendUint64(bigArray, 1<<60)
	// A tensor of 2^63 F32 elements: its byte size overflows to 0 and
	// must not pass as fitting in a tiny file.
	hb := sample(t, "llama")
	d := bytes.LastIndex(hb, []byte("output_norm.weight")) + len("output_norm.weight") + 4
	binary.LittleEndian.PutUint64(hb[d:], 1<<32)
	binary.LittleEndian.PutUint64(hb[d+8:], 1<<31)
	misaligned := sample(t, "llama")
	j := bytes.LastIndex(misaligned, []byte("output_norm.weight")) + len("output_norm.weight") + 4 + 16 + 4
	binary.LittleEndian.PutUint64(misaligned[j:], 97)
	for name, c := range map[string]struct {
		b      []byte
		err    error
		says   string
		header bool // refused by Check, not Read
	}{
		"empty":             {nil, ErrNotGGUF, "not even the 4-byte magic", false},
		"llama2.c":          {append(llama2c, make([]byte, 64)...), ErrNotGGUF, `must be converted to GGUF first`, false},
		"version 9":         {append([]byte("GGUF\x09\x00\x00\x00"), make([]byte, 16)...), ErrUnsupported, "GGUF version 9", false},
		"truncated data":    {good[:len(good)-1], ErrTruncated, "tensor output_norm.weight (F32, [4 3]) at offset 96 ends past the", false},
		"truncated header":  {good[:100], ErrTruncated, "", false},
		"unknown type":      {unknownType, ErrUnsupported, "tensor output_norm.weight has type 31, which llama.cpp does not know", false},
		"array beyond file": {bigArray, ErrTruncated, "1152921504606846976 elements of type 10 cannot fit", false},
		"overflowing size":  {hb, ErrTruncated, "tensor output_norm.weight (F32, [4294967296 2147483648]) at offset 96 ends past", false},
		"misaligned":        {misaligned, ErrMalformed, "tensor output_norm.weight at offset 97, not a multiple of the alignment 32", false},
		"unknown arch":      {sample(t, "gpt9"), ErrUnsupported, `architecture "gpt9", which llama.cpp ec98e2002 does not know`, true},
		"encoder":           {sample(t, "bert"), ErrUnsupported, `"bert" encodes`, true},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := Open(write(t, c.b))
			if c.header {
				if err != nil {
					t.Fatal(err)
				}
				err = f.Check()
			}
			var e *Error
			if !errors.Is(err, c.err) || !errors.As(err, &e) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "m.gguf") {
				t.Fatalf("%v, want %v saying %q and the path", err, c.err, c.says)
			}
		})
	}
	// A missing file is the OS's error; a directory is not GGUF.
	if _, err := Open(filepath.Join(t.TempDir(), "none.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if _, err := Open(t.TempDir()); !errors.Is(err, ErrNotGGUF) {
		t.Fatal(err)
	}
}

// TestEveryCutIsRefused: the file cut at every byte is refused, with a
// typed error and no panic.
func TestEveryCutIsRefused(t *testing.T) {
	good := sample(t, "llama")
	for n := range len(good) {
		_, err := Read(bytes.NewReader(good[:n]), int64(n))
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("cut at %d: %v", n, err)
		}
	}
}

func FuzzRead(f *testing.F) {
	f.Add(sample(f, "llama"))
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Read(bytes.NewReader(b), int64(len(b)))
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("untyped error %v", err)
		}
		if err == nil {
			h.Check()
			h.Summary()
		}
	})
}
