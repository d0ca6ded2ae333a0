// Package grammar is a byte-level pushdown automaton that accepts the JSON
// texts of a schema (a subset of JSON Schema) or any JSON object, for
// structured output: a sampler masks the logits with it so that only
// tokens whose bytes keep the output a valid prefix may be drawn.
//
// The automaton's State is a comparable value and a pure function of the
// bytes fed since Start: no counters outside it, no map iteration, no
// allocation that shows. A worker that takes over a request replays the
// state from the output tokens so far (Replay) and continues exactly as
// the first worker would have.
//
// The language is canonical-ish, to bound lengths: no whitespace except at
// most one space after ':' and after ','; keys without escapes; numbers
// with at most 15 digits before and after the point and 2 in the exponent;
// containers of untyped values nest at most MaxDepth deep.
package grammar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Automaton is a compiled schema. It is immutable and safe for concurrent
// use.
type Automaton struct {
	nodes  []node
	root   uint16
	maxLen int // the largest minLen or name length: bounds MinClose growth per byte
}

func newAutomaton(nodes []node, root uint16) *Automaton {
	a := &Automaton{nodes: nodes, root: root}
	for _, n := range nodes {
		a.maxLen = max(a.maxLen, n.minLen)
		for _, name := range n.names {
			a.maxLen = max(a.maxLen, len(name))
		}
	}
	return a
}

// State is the automaton's state after a byte prefix. It is a comparable
// value: equal prefixes give == states.
type State struct {
	outer string // the frames below top, encoded
	top   frame  // the innermost open container; valid when depth > 0
	val   scalar // the scalar or key being scanned
	depth uint8  // open containers
	done  bool   // the root value has started
}

// frame is one open object or array.
type frame struct {
	node  uint16
	phase uint8
	count uint16 // array: items started; object with maxProperties: keys started
	prop  uint16 // object: the node of the value after the current key
	seen  uint64 // object: declared properties present
}

const frameSize = 15

// Object and array phases: what the next byte may be.
const (
	oOpen    uint8 = iota // after '{': a key or '}'
	oKey                  // in a key
	oColon                // after a key: ':'
	oValue                // after ':': ' ' or a value
	oValueSp              // after ': ': a value
	oNext                 // after a value: ',' or '}'
	oComma                // after ',': ' ' or a key
	oCommaSp              // after ', ': a key
	aOpen                 // after '[': a value or ']'
	aNext                 // after a value: ',' or ']'
	aComma                // after ',': ' ' or a value
	aCommaSp              // after ', ': a value
)

func (f frame) appendTo(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, f.node)
	b = append(b, f.phase)
	b = binary.LittleEndian.AppendUint16(b, f.count)
	b = binary.LittleEndian.AppendUint16(b, f.prop)
	return binary.LittleEndian.AppendUint64(b, f.seen)
}

func decodeFrame(s string) frame {
	b := []byte(s[:frameSize])
	return frame{
		node:  binary.LittleEndian.Uint16(b),
		phase: b[2],
		count: binary.LittleEndian.Uint16(b[3:]),
		prop:  binary.LittleEndian.Uint16(b[5:]),
		seen:  binary.LittleEndian.Uint64(b[7:]),
	}
}

// maxStack bounds open containers: declared ones by the schema's depth,
// those of untyped values by refusing '{' and '[' at the bound.
const maxStack = MaxDepth

func (s *State) push(f frame) {
	if s.depth > 0 {
		s.outer += string(s.top.appendTo(make([]byte, 0, frameSize)))
	}
	s.top = f
	s.depth++
}

func (s *State) pop() {
	s.depth--
	if s.depth == 0 {
		s.top = frame{}
		return
	}
	k := len(s.outer) - frameSize
	s.top = decodeFrame(s.outer[k:])
	s.outer = s.outer[:k]
}

// Start is the state before any byte.
func (a *Automaton) Start() State { return State{} }

// Advance feeds the bytes of one token. It returns the new state and true,
// or s and false when some byte is not allowed.
func (a *Automaton) Advance(s State, b []byte) (State, bool) {
	t := s
	for _, c := range b {
		if !a.step(&t, c) {
			return s, false
		}
	}
	return t, true
}

// Accepting reports whether the bytes so far are a complete value.
func (a *Automaton) Accepting(s State) bool {
	return s.depth == 0 && s.done && (s.val.kind == valNone || a.canEnd(s.val))
}

// Closed reports whether the value is complete and no byte can extend it:
// the root object, array, string or literal has ended, or a root number
// is at its longest. A root number that may go on is accepting but not
// closed; it ends with end-of-sequence or the token budget.
func (a *Automaton) Closed(s State) bool {
	if s.depth > 0 || !s.done {
		return false
	}
	v := s.val
	switch v.kind {
	case valNone:
		return true
	case valNumber:
		integer := a.nodes[v.node].kind == kInteger
		return v.u8 == nExp && v.pos >= maxExpDigits ||
			integer && (v.u8 == nZero || v.u8 == nInt && v.pos >= maxIntDigits)
	}
	return false
}

// ErrRejected is wrapped by Replay's error for a prefix the automaton
// does not accept.
var ErrRejected = errors.New("grammar: token not allowed")

// Replay returns the state after tokens, fed from Start: what a worker
// that takes a request over computes from the output so far.
func (a *Automaton) Replay(tokens [][]byte) (State, error) {
	s := a.Start()
	for i, t := range tokens {
		var ok bool
		if s, ok = a.Advance(s, t); !ok {
			return s, fmt.Errorf("%w: token %d (%q)", ErrRejected, i, t)
		}
	}
	return s, nil
}

// step feeds one byte; on false s is garbage (callers work on a copy).
func (a *Automaton) step(s *State, c byte) bool {
	if s.val.kind != valNone {
		switch a.scan(s, c) {
		case scanTaken:
			return true
		case scanRefused:
			return false
		}
		// The scalar ended before c (a number or literal has no closing
		// byte): c belongs to the container.
		s.val = scalar{}
	}
	if s.depth == 0 {
		if s.done {
			return false
		}
		s.done = true
		return a.start(s, a.root, c)
	}
	n := &a.nodes[s.top.node]
	if n.kind == kObject {
		return a.objectStep(s, n, c)
	}
	return a.arrayStep(s, n, c)
}

// start begins a value of node id with its first byte c. The container's
// phase has already moved past the value.
func (a *Automaton) start(s *State, id uint16, c byte) bool {
	n := &a.nodes[id]
	switch n.kind {
	case kUnion:
		for _, alt := range n.alts {
			if a.startsWith(alt, c) {
				return a.start(s, alt, c)
			}
		}
		return false
	case kObject, kArray:
		if c != "{["[n.kind-kObject] || s.depth >= maxStack {
			return false
		}
		phase := oOpen
		if n.kind == kArray {
			phase = aOpen
		}
		s.push(frame{node: id, phase: phase})
		return true
	case kString:
		s.val = scalar{kind: valString, node: id}
		return c == '"'
	case kNumber, kInteger:
		s.val = scalar{kind: valNumber, node: id}
		return a.scanNumber(&s.val, n.kind == kInteger, c) == scanTaken
	}
	next := n.lits.next(0, c)
	if next < 0 {
		return false
	}
	s.val = scalar{kind: valLiteral, node: id, pos: uint16(next)}
	a.literalEnd(s)
	return true
}

// startsWith reports whether a value of node id may begin with c.
func (a *Automaton) startsWith(id uint16, c byte) bool {
	n := &a.nodes[id]
	switch n.kind {
	case kObject:
		return c == '{'
	case kArray:
		return c == '['
	case kString:
		return c == '"'
	case kNumber, kInteger:
		return c == '-' || (c >= '0' && c <= '9')
	case kLiteral:
		return n.lits.next(0, c) >= 0
	}
	for _, alt := range n.alts {
		if a.startsWith(alt, c) {
			return true
		}
	}
	return false
}

func (a *Automaton) objectStep(s *State, n *node, c byte) bool {
	f := &s.top
	switch f.phase {
	case oOpen:
		if c == '}' && due(n, 0) == 0 {
			s.pop()
			return true
		}
		return c == '"' && a.startKey(s, n)
	case oNext:
		switch {
		case c == ',' && a.canAddKey(n, *f):
			f.phase = oComma
			return true
		case c == '}' && due(n, f.seen) == 0:
			s.pop()
			return true
		}
		return false
	case oComma, oCommaSp:
		if c == ' ' && f.phase == oComma {
			f.phase = oCommaSp
			return true
		}
		return c == '"' && a.startKey(s, n)
	case oColon:
		f.phase = oValue
		return c == ':'
	case oValue, oValueSp:
		if c == ' ' && f.phase == oValue {
			f.phase = oValueSp
			return true
		}
		f.phase = oNext
		return a.start(s, f.prop, c)
	}
	return false
}

func (a *Automaton) startKey(s *State, n *node) bool {
	if !a.canAddKey(n, s.top) {
		return false
	}
	if n.maxProps != unbounded {
		s.top.count++ // below maxProps <= unbounded: no overflow
	}
	s.top.phase = oKey
	s.val = scalar{kind: valKey, node: s.top.node}
	return true
}

func (a *Automaton) arrayStep(s *State, n *node, c byte) bool {
	f := &s.top
	switch f.phase {
	case aOpen:
		if c == ']' && n.minItems == 0 {
			s.pop()
			return true
		}
		if n.maxItems == 0 {
			return false
		}
	case aNext:
		switch {
		case c == ',' && int(f.count) < n.maxItems:
			f.phase = aComma
			return true
		case c == ']' && int(f.count) >= n.minItems:
			s.pop()
			return true
		}
		return false
	case aComma:
		if c == ' ' {
			f.phase = aCommaSp
			return true
		}
	}
	f.count++
	f.phase = aNext
	return a.start(s, n.items, c)
}

// Footprint estimates the bytes the automaton holds, for a cache that
// bounds what it keeps by memory.
func (a *Automaton) Footprint() int {
	size := int(unsafe.Sizeof(*a)) + len(a.nodes)*int(unsafe.Sizeof(node{}))
	for i := range a.nodes {
		n := &a.nodes[i]
		size += n.lits.footprint() + n.keys.footprint() + 2*(len(n.propNode)+len(n.alts)) + len(n.optByCost)
		for _, name := range n.names {
			size += int(unsafe.Sizeof(name)) + len(name)
		}
	}
	return size
}
