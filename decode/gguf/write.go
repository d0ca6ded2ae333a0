package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// TensorData is a tensor Write writes: its directory entry (Offset is
// set by Write) and its bytes.
type TensorData struct {
	Tensor
	Data []byte
}

// Strings, Int32s and Float32s are array values.
func Strings(v []string) Array   { return arrayOf(TypeString, v) }
func Int32s(v []int32) Array     { return arrayOf(TypeInt32, v) }
func Float32s(v []float32) Array { return arrayOf(TypeFloat32, v) }

func arrayOf[T any](t ValueType, v []T) Array {
	a := Array{Type: t, Values: make([]any, len(v))}
	for i, x := range v {
		a.Values[i] = x
	}
	return a
}

// Write writes a GGUF version 3 file: the metadata in order, then the
// tensor directory, then each tensor's data at the alignment
// (general.alignment, or DefaultAlignment). Each tensor's data must be
// exactly its type's size for its dimensions.
func Write(out io.Writer, kvs []KV, tensors []TensorData) error {
	w := &writer{w: bufio.NewWriter(out)}
	w.raw([]byte(Magic))
	w.u32(3)
	w.u64(uint64(len(tensors)))
	w.u64(uint64(len(kvs)))
	align := uint64(DefaultAlignment)
	for _, kv := range kvs {
		w.str(kv.Key)
		if err := w.value(kv.Value, true); err != nil {
			return fmt.Errorf("gguf: %s: %w", kv.Key, err)
		}
		if kv.Key == "general.alignment" {
			if a, ok := kv.Value.(uint32); ok && a > 0 {
				align = uint64(a)
			}
		}
	}
	offset := uint64(0)
	for i := range tensors {
		t := &tensors[i]
		info, ok := t.Type.info()
		if !ok {
			return fmt.Errorf("gguf: tensor %s: unknown type %d", t.Name, t.Type)
		}
		if want := t.Elements() / uint64(info.block) * uint64(info.size); uint64(len(t.Data)) != want {
			return fmt.Errorf("gguf: tensor %s: %d bytes of data, its %s %v takes %d", t.Name, len(t.Data), t.Type, t.Dims, want)
		}
		t.Offset = offset
		offset = (offset + uint64(len(t.Data)) + align - 1) / align * align
		w.str(t.Name)
		w.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w.u64(d)
		}
		w.u32(uint32(t.Type))
		w.u64(t.Offset)
	}
	w.pad(align)
	for i, t := range tensors {
		if i > 0 {
			w.pad(align)
		}
		w.raw(t.Data)
	}
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

type writer struct {
	w   *bufio.Writer
	n   uint64
	err error
}

func (w *writer) raw(b []byte) {
	if w.err == nil {
		_, w.err = w.w.Write(b)
		w.n += uint64(len(b))
	}
}

func (w *writer) u32(v uint32) { w.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *writer) u64(v uint64) { w.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *writer) str(s string) { w.u64(uint64(len(s))); w.raw([]byte(s)) }

func (w *writer) pad(align uint64) {
	if r := w.n % align; r != 0 {
		w.raw(make([]byte, align-r))
	}
}

// value writes v, preceded by its type when typed.
func (w *writer) value(v any, typed bool) error {
	t, b := ValueType(0), []byte(nil)
	switch x := v.(type) {
	case uint8:
		t, b = TypeUint8, []byte{x}
	case int8:
		t, b = TypeInt8, []byte{byte(x)}
	case bool:
		t, b = TypeBool, []byte{0}
		if x {
			b[0] = 1
		}
	case uint16:
		t, b = TypeUint16, binary.LittleEndian.AppendUint16(nil, x)
	case int16:
		t, b = TypeInt16, binary.LittleEndian.AppendUint16(nil, uint16(x))
	case uint32:
		t, b = TypeUint32, binary.LittleEndian.AppendUint32(nil, x)
	case int32:
		t, b = TypeInt32, binary.LittleEndian.AppendUint32(nil, uint32(x))
	case float32:
		t, b = TypeFloat32, binary.LittleEndian.AppendUint32(nil, math.Float32bits(x))
	case uint64:
		t, b = TypeUint64, binary.LittleEndian.AppendUint64(nil, x)
	case int64:
		t, b = TypeInt64, binary.LittleEndian.AppendUint64(nil, uint64(x))
	case float64:
		t, b = TypeFloat64, binary.LittleEndian.AppendUint64(nil, math.Float64bits(x))
	case string:
		if typed {
			w.u32(uint32(TypeString))
		}
		w.str(x)
		return nil
	case Array:
		if typed {
			w.u32(uint32(TypeArray))
		}
		w.u32(uint32(x.Type))
		w.u64(uint64(len(x.Values)))
		for _, e := range x.Values {
			if err := w.value(e, false); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("a %T is no GGUF value", v)
	}
	if typed {
		w.u32(uint32(t))
	}
	w.raw(b)
	return nil
}
