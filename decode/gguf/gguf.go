// Package gguf reads the header of a GGUF model file — its metadata and
// its tensor directory, not its weights — and writes GGUF files. The
// header is what the worker, `lifeline agent --check-config` and
// `lifeline up` check before anything starts: a file that is not GGUF,
// is cut short, names an architecture or a tensor type llama.cpp does not
// know is refused with an error that says which, never a crash loop.
//
// Every length the file states is checked against the bytes left in it
// before anything is allocated: a hostile header costs at most its own
// size.
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"strings"
)

// Magic is the first four bytes of a GGUF file.
const Magic = "GGUF"

// LlamaCppCommit is the llama.cpp that Lifeline links: the copy in the
// ollama module OllamaModule (go.mod), whose architectures and tensor
// types this package knows.
const (
	LlamaCppCommit = "ec98e2002"
	OllamaModule   = "v0.17.4"
)

//go:generate go run ./genarch

// DefaultAlignment is the tensor data's alignment when general.alignment
// does not say.
const DefaultAlignment = 32

// Errors of Read and Check; each *Error wraps one.
var (
	ErrNotGGUF     = errors.New("not a GGUF file")
	ErrTruncated   = errors.New("truncated")
	ErrMalformed   = errors.New("malformed")
	ErrUnsupported = errors.New("unsupported")
)

// Error is a file refused: what is wrong, where.
type Error struct {
	Path   string // "" when read from a reader
	Err    error  // one of the Err* above
	Detail string
}

func (e *Error) Error() string {
	where := "gguf"
	if e.Path != "" {
		where = "gguf: " + e.Path
	}
	return fmt.Sprintf("%s: %v: %s", where, e.Err, e.Detail)
}

func (e *Error) Unwrap() error { return e.Err }

// ValueType is a metadata value's type.
type ValueType uint32

// Metadata value types.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

// size is a scalar type's size in bytes (0: string, array or unknown).
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// KV is one metadata entry. Value is a uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64 or float64, or an
// Array.
type KV struct {
	Key   string
	Value any
}

// Array is an array value: its element type and elements.
type Array struct {
	Type   ValueType
	Values []any
}

// Tensor is one entry of the tensor directory.
type Tensor struct {
	Name string
	Dims []uint64
	Type TensorType
	// Offset is where its data starts, from the start of the data
	// section.
	Offset uint64
}

// Elements is the product of its dimensions (math.MaxUint64 when it
// overflows: no file holds such a tensor).
func (t Tensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return math.MaxUint64
		}
		n = lo
	}
	return n
}

// File is a GGUF file's header.
type File struct {
	Path    string
	Version uint32
	KV      []KV
	Tensors []Tensor
	// DataOffset is where the data section starts; Size the file's size.
	DataOffset, Size int64
	align            int64
}

// Limits on what a header may state, beyond fitting in the file.
const (
	maxTensors    = 1 << 20
	maxKV         = 1 << 16
	maxDims       = 4
	maxArrayDepth = 2
	maxStringLen  = 1 << 26
)

// Open reads the header of the GGUF file at path.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, &Error{Path: path, Err: ErrNotGGUF, Detail: "not a regular file"}
	}
	h, err := Read(f, st.Size())
	if e := (*Error)(nil); errors.As(err, &e) {
		e.Path = path
	}
	if h != nil {
		h.Path = path
	}
	return h, err
}

// reader reads a header, counting the bytes read and left.
type reader struct {
	r    *bufio.Reader
	off  int64
	size int64
}

func (r *reader) left() int64 { return r.size - r.off }

func (r *reader) bytes(n int64, what string) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, &Error{Err: ErrTruncated, Detail: fmt.Sprintf("%s of %d bytes at offset %d, with %d bytes left in the file", what, n, r.off, r.left())}
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		return nil, &Error{Err: ErrTruncated, Detail: fmt.Sprintf("%s at offset %d: %v", what, r.off, err)}
	}
	r.off += n
	return b, nil
}

func (r *reader) u32(what string) (uint32, error) {
	b, err := r.bytes(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64(what string) (uint64, error) {
	b, err := r.bytes(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (r *reader) str(what string) (string, error) {
	n, err := r.u64(what + "'s length")
	if err != nil {
		return "", err
	}
	if n > maxStringLen {
		return "", &Error{Err: ErrMalformed, Detail: fmt.Sprintf("%s of %d bytes at offset %d (at most %d)", what, n, r.off, maxStringLen)}
	}
	b, err := r.bytes(int64(n), what)
	return string(b), err
}

func (r *reader) value(t ValueType, what string, depth int) (any, error) {
	if s := t.size(); s > 0 {
		b, err := r.bytes(int64(s), what)
		if err != nil {
			return nil, err
		}
		switch t {
		case TypeUint8:
			return b[0], nil
		case TypeInt8:
			return int8(b[0]), nil
		case TypeBool:
			if b[0] > 1 {
				return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("%s: bool %d", what, b[0])}
			}
			return b[0] == 1, nil
		case TypeUint16:
			return binary.LittleEndian.Uint16(b), nil
		case TypeInt16:
			return int16(binary.LittleEndian.Uint16(b)), nil
		case TypeUint32:
			return binary.LittleEndian.Uint32(b), nil
		case TypeInt32:
			return int32(binary.LittleEndian.Uint32(b)), nil
		case TypeFloat32:
			return math.Float32frombits(binary.LittleEndian.Uint32(b)), nil
		case TypeUint64:
			return binary.LittleEndian.Uint64(b), nil
		case TypeInt64:
			return int64(binary.LittleEndian.Uint64(b)), nil
		case TypeFloat64:
			return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
		}
	}
	switch t {
	case TypeString:
		return r.str(what)
	case TypeArray:
		if depth >= maxArrayDepth {
			return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("%s: arrays nested deeper than %d", what, maxArrayDepth)}
		}
		et, err := r.u32(what + "'s element type")
		if err != nil {
			return nil, err
		}
		n, err := r.u64(what + "'s length")
		if err != nil {
			return nil, err
		}
		// Every element takes a byte at least (a string its 8-byte
		// length): a count the file cannot hold is refused before any
		// allocation.
		least := int64(max(ValueType(et).size(), 1))
		if ValueType(et) == TypeString || ValueType(et) == TypeArray {
			least = 8
		}
		if n > uint64(r.left()/least) {
			return nil, &Error{Err: ErrTruncated, Detail: fmt.Sprintf("%s: %d elements of type %d cannot fit in the %d bytes left", what, n, et, r.left())}
		}
		// Grown as elements are read: a count the header's own bytes
		// cannot back costs no more than those bytes.
		a := Array{Type: ValueType(et), Values: make([]any, 0, min(n, 1<<12))}
		for range n {
			v, err := r.value(ValueType(et), what, depth+1)
			if err != nil {
				return nil, err
			}
			a.Values = append(a.Values, v)
		}
		return a, nil
	}
	return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("%s: unknown value type %d at offset %d", what, t, r.off)}
}

// Read reads a GGUF header from r, a file of size bytes. It checks that
// the header is well formed and that every tensor's data lies inside the
// file; Check says whether llama.cpp can serve it.
func Read(ra io.ReaderAt, size int64) (*File, error) {
	r := &reader{r: bufio.NewReaderSize(io.NewSectionReader(ra, 0, size), 1<<16), size: size}
	magic, err := r.bytes(4, "the magic")
	if err != nil {
		return nil, &Error{Err: ErrNotGGUF, Detail: fmt.Sprintf("%d bytes, not even the 4-byte magic", size)}
	}
	if string(magic) != Magic {
		return nil, &Error{Err: ErrNotGGUF, Detail: fmt.Sprintf("it starts with %q, not %q (a llama2.c checkpoint, safetensors or a Hugging Face directory must be converted to GGUF first)", magic, Magic)}
	}
	f := &File{Size: size}
	if f.Version, err = r.u32("the version"); err != nil {
		return nil, err
	}
	if f.Version < 2 || f.Version > 3 {
		return nil, &Error{Err: ErrUnsupported, Detail: fmt.Sprintf("GGUF version %d (2 and 3 are read)", f.Version)}
	}
	nt, err := r.u64("the tensor count")
	if err != nil {
		return nil, err
	}
	nkv, err := r.u64("the metadata count")
	if err != nil {
		return nil, err
	}
	if nt > maxTensors || nkv > maxKV {
		return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("%d tensors and %d metadata entries (at most %d and %d)", nt, nkv, maxTensors, maxKV)}
	}
	if f.KV, err = r.kvs(nkv); err != nil {
		return nil, err
	}
	if f.Tensors, err = r.tensors(nt); err != nil {
		return nil, err
	}
	align := int64(DefaultAlignment)
	if v, ok := f.Uint("general.alignment"); ok {
		if v == 0 || v > 1<<20 || v&(v-1) != 0 {
			return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("general.alignment %d (a power of two)", v)}
		}
		align = int64(v)
	}
	f.DataOffset, f.align = (r.off+align-1)/align*align, align
	if err := f.checkData(); err != nil {
		return nil, err
	}
	return f, nil
}

// kvs reads n metadata entries.
func (r *reader) kvs(n uint64) ([]KV, error) {
	var kvs []KV
	seen := map[string]bool{}
	for i := uint64(0); i < n; i++ {
		key, err := r.str(fmt.Sprintf("metadata key %d", i))
		if err != nil {
			return nil, err
		}
		if seen[key] {
			return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("metadata key %q twice", key)}
		}
		seen[key] = true
		t, err := r.u32(key + "'s type")
		if err != nil {
			return nil, err
		}
		v, err := r.value(ValueType(t), key, 0)
		if err != nil {
			return nil, err
		}
		kvs = append(kvs, KV{key, v})
	}
	return kvs, nil
}

// tensors reads n tensor directory entries.
func (r *reader) tensors(n uint64) ([]Tensor, error) {
	var ts []Tensor
	for i := uint64(0); i < n; i++ {
		var t Tensor
		var err error
		if t.Name, err = r.str(fmt.Sprintf("tensor %d's name", i)); err != nil {
			return nil, err
		}
		nd, err := r.u32(t.Name + "'s dimension count")
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > maxDims {
			return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("tensor %s has %d dimensions (1 to %d)", t.Name, nd, maxDims)}
		}
		for d := uint32(0); d < nd; d++ {
			n, err := r.u64(t.Name + "'s dimension")
			if err != nil {
				return nil, err
			}
			if n == 0 || n > 1<<40 {
				return nil, &Error{Err: ErrMalformed, Detail: fmt.Sprintf("tensor %s: dimension %d is %d", t.Name, d, n)}
			}
			t.Dims = append(t.Dims, n)
		}
		typ, err := r.u32(t.Name + "'s type")
		if err != nil {
			return nil, err
		}
		t.Type = TensorType(typ)
		if t.Offset, err = r.u64(t.Name + "'s offset"); err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// checkData checks every tensor's type and that its data lies inside the
// file, after the header, without overlapping another's.
func (f *File) checkData() error {
	type span struct {
		from, to uint64
		name     string
	}
	var spans []span
	for _, t := range f.Tensors {
		info, ok := t.Type.info()
		if !ok {
			return &Error{Err: ErrUnsupported, Detail: fmt.Sprintf("tensor %s has type %d, which llama.cpp does not know (a newer file?)", t.Name, uint32(t.Type))}
		}
		n := t.Elements()
		if n == math.MaxUint64 || n%uint64(info.block) != 0 || (len(t.Dims) > 0 && t.Dims[0]%uint64(info.block) != 0) {
			return &Error{Err: ErrMalformed, Detail: fmt.Sprintf("tensor %s of %v elements is not whole %s blocks of %d", t.Name, t.Dims, t.Type, info.block)}
		}
		if t.Offset%uint64(f.align) != 0 {
			return &Error{Err: ErrMalformed, Detail: fmt.Sprintf("tensor %s at offset %d, not a multiple of the alignment %d", t.Name, t.Offset, f.align)}
		}
		hi, bytes := bits.Mul64(n/uint64(info.block), uint64(info.size))
		start, c1 := bits.Add64(uint64(f.DataOffset), t.Offset, 0)
		end, c2 := bits.Add64(start, bytes, 0)
		if hi != 0 || c1 != 0 || c2 != 0 || end > uint64(f.Size) {
			return &Error{Err: ErrTruncated, Detail: fmt.Sprintf("tensor %s (%s, %v) at offset %d ends past the %d-byte file", t.Name, t.Type, t.Dims, t.Offset, f.Size)}
		}
		spans = append(spans, span{t.Offset, t.Offset + bytes, t.Name})
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.from < b.from {
			return -1
		} else if a.from > b.from {
			return 1
		}
		return 0
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].from < spans[i-1].to {
			return &Error{Err: ErrMalformed, Detail: fmt.Sprintf("tensors %s and %s overlap", spans[i-1].name, spans[i].name)}
		}
	}
	return nil
}

// Get is the value of key (nil, false when absent).
func (f *File) Get(key string) (any, bool) {
	for _, kv := range f.KV {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// String is key's string value.
func (f *File) String(key string) (string, bool) {
	v, ok := f.Get(key)
	s, isStr := v.(string)
	return s, ok && isStr
}

// Uint is key's value when it is an unsigned or non-negative integer.
func (f *File) Uint(key string) (uint64, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	switch x := v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8:
		return uint64(x), x >= 0
	case int16:
		return uint64(x), x >= 0
	case int32:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

// Architecture is general.architecture ("" when absent).
func (f *File) Architecture() string {
	a, _ := f.String("general.architecture")
	return a
}

// ContextLength is <architecture>.context_length (0 when absent).
func (f *File) ContextLength() int {
	n, _ := f.Uint(f.Architecture() + ".context_length")
	return int(min(n, math.MaxInt32))
}

// Check says whether llama.cpp (the build Lifeline links) can serve the
// file as a text generator: a known architecture that generates text, a
// vocabulary and at least one tensor.
func (f *File) Check() error {
	fail := func(format string, args ...any) error {
		return &Error{Path: f.Path, Err: ErrUnsupported, Detail: fmt.Sprintf(format, args...)}
	}
	arch := f.Architecture()
	switch {
	case arch == "":
		return fail("no general.architecture")
	case !slices.Contains(Architectures, arch):
		return fail("architecture %q, which llama.cpp %s does not know", arch, LlamaCppCommit)
	case slices.Contains(encoderOnly, arch):
		return fail("architecture %q encodes (embeddings, vision); it does not generate text", arch)
	case len(f.Tensors) == 0:
		return fail("no tensors")
	}
	if _, ok := f.String("tokenizer.ggml.model"); !ok {
		return fail("no tokenizer (tokenizer.ggml.model): Lifeline takes the vocabulary from the file")
	}
	return nil
}

// encoderOnly are the architectures llama.cpp knows that produce no text.
var encoderOnly = []string{"clip", "bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "t5encoder", "wavtokenizer-dec"}

// Summary is a one-line description: architecture, tensors, their types.
func (f *File) Summary() string {
	types := map[TensorType]int{}
	for _, t := range f.Tensors {
		types[t.Type]++
	}
	var parts []string
	for t, n := range types {
		parts = append(parts, fmt.Sprintf("%d %s", n, t))
	}
	slices.Sort(parts)
	return fmt.Sprintf("%s, GGUF v%d, %d tensors (%s), context %d", f.Architecture(), f.Version, len(f.Tensors), strings.Join(parts, ", "), f.ContextLength())
}
