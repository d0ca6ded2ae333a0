package model

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/matmul"
)

// TestFiniteTypedFindsEveryNonFiniteValue: an infinity or NaN half,
// bfloat16 or Q8_0 scale at any position is found, and finite values of
// every other pattern pass.
func TestFiniteTypedFindsEveryNonFiniteValue(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		typ  matmul.Type
		exp  uint16
		step int
	}{{matmul.F16, 0x7c00, 2}, {matmul.BF16, 0x7f80, 2}, {matmul.Q8_0, 0x7c00, 34}} {
		raw := make([]byte, 34*40)
		for i := 0; i < len(raw); i += 2 {
			v := uint16(r.Uint32())
			if v&c.exp == c.exp {
				v &^= 0x0400 // one exponent bit off: finite
			}
			binary.LittleEndian.PutUint16(raw[i:], v)
		}
		if c.typ == matmul.Q8_0 {
			for i := 2; i < len(raw); i += 34 { // int8s may be anything
				for j := range 32 {
					raw[i+j] = 0xff
				}
			}
		}
		if !finiteTyped(c.typ, raw) {
			t.Fatalf("%s: finite values refused", c.typ)
		}
		for at := 0; at < len(raw); at += c.step {
			bad := append([]byte(nil), raw...)
			v := binary.LittleEndian.Uint16(bad[at:]) | c.exp
			binary.LittleEndian.PutUint16(bad[at:], v)
			if finiteTyped(c.typ, bad) {
				t.Fatalf("%s: a non-finite value at byte %d passes", c.typ, at)
			}
		}
	}
}
