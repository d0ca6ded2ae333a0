package llamacpptest

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// TestHalfAndQ8 checks the encoders against values whose halves are
// known, and a Q8_0 block dequantized back within its step.
func TestHalfAndQ8(t *testing.T) {
	for v, want := range map[float32]uint16{1: 0x3c00, -2: 0xc000, 65504: 0x7bff, 0.5: 0x3800, 1e-9: 0, 1e6: 0x7c00, 1.0009765625: 0x3c01} {
		if got := half(v); got != want {
			t.Errorf("half(%v) = %#04x, want %#04x", v, got, want)
		}
	}
	vs := make([]float32, 32)
	for i := range vs {
		vs[i] = float32(i-16) / 8
	}
	b := encode(gguf.Q8_0, vs)
	if len(b) != 34 {
		t.Fatalf("%d bytes", len(b))
	}
	d := float32(2) / 127 // max |v| is 2; d in f16 is close
	for i, v := range vs {
		got := float32(int8(b[2+i])) * d
		if math.Abs(float64(got-v)) > float64(d) {
			t.Fatalf("element %d: %v back as %v", i, v, got)
		}
	}
	if h := binary.LittleEndian.Uint16(b); h != half(float32(2)/127) {
		t.Fatalf("scale %#04x", h)
	}
}
