package grammar

// scalar is the string, key, number or literal being scanned.
type scalar struct {
	kind uint8
	u8   uint8  // string, key: UTF-8 state (utf8*); number: numState
	esc  uint8  // string: 0 none, 1 after '\', 2..5 hex digits left + 1
	node uint16 // the value's node; for a key, the object's
	pos  uint16 // key, literal: trie node (offTrie: none); number: digits in the part
}

const (
	valNone uint8 = iota
	valString
	valKey
	valNumber
	valLiteral
)

const offTrie = 0xFFFF

type scanResult uint8

const (
	scanTaken   scanResult = iota // the byte belongs to the scalar
	scanRefused                   // the byte is not allowed here
	scanEnded                     // the scalar ended before the byte
)

// Number states.
const (
	nBegin uint8 = iota
	nSign
	nZero
	nInt
	nDot
	nFrac
	nE
	nESign
	nExp
)

// UTF-8 states: continuation bytes still due, and the special ranges of
// the first continuation byte after E0, ED, F0 and F4 (no overlongs, no
// surrogates, nothing above U+10FFFF).
const (
	u8Start uint8 = iota
	u8Need1
	u8Need2
	u8Need3
	u8E0
	u8ED
	u8F0
	u8F4
)

// u8Pending is the continuation bytes each UTF-8 state still needs.
var u8Pending = [...]int{0, 1, 2, 3, 2, 2, 3, 3}

// utf8Step advances the UTF-8 state by c, which is not ASCII or is a
// continuation; ok false for an invalid sequence.
func utf8Step(st uint8, c byte) (uint8, bool) {
	cont := c >= 0x80 && c <= 0xBF
	switch st {
	case u8Need1, u8Need2, u8Need3:
		return st - 1, cont
	case u8E0:
		return u8Need1, c >= 0xA0 && c <= 0xBF
	case u8ED:
		return u8Need1, c >= 0x80 && c <= 0x9F
	case u8F0:
		return u8Need2, c >= 0x90 && c <= 0xBF
	case u8F4:
		return u8Need2, c >= 0x80 && c <= 0x8F
	}
	switch {
	case c < 0x80:
		return u8Start, true
	case c >= 0xC2 && c <= 0xDF:
		return u8Need1, true
	case c == 0xE0:
		return u8E0, true
	case c == 0xED:
		return u8ED, true
	case c >= 0xE1 && c <= 0xEF:
		return u8Need2, true
	case c == 0xF0:
		return u8F0, true
	case c >= 0xF1 && c <= 0xF3:
		return u8Need3, true
	case c == 0xF4:
		return u8F4, true
	}
	return 0, false
}

func (a *Automaton) scan(s *State, c byte) scanResult {
	v := &s.val
	switch v.kind {
	case valString:
		return scanString(s, c)
	case valKey:
		return a.scanKey(s, c)
	case valNumber:
		return a.scanNumber(v, a.nodes[v.node].kind == kInteger, c)
	}
	lits := a.nodes[v.node].lits
	if next := lits.next(int(v.pos), c); next >= 0 {
		v.pos = uint16(next)
		a.literalEnd(s)
		return scanTaken
	}
	if lits.nodes[v.pos].term >= 0 {
		return scanEnded
	}
	return scanRefused
}

// literalEnd ends a literal at a terminal nothing can extend, so that its
// end does not wait for the next byte.
func (a *Automaton) literalEnd(s *State) {
	t := &a.nodes[s.val.node].lits.nodes[s.val.pos]
	if t.term >= 0 && len(t.edges) == 0 {
		s.val = scalar{}
	}
}

func (a *Automaton) canEnd(v scalar) bool {
	switch v.kind {
	case valNumber:
		return v.u8 == nZero || v.u8 == nInt || v.u8 == nFrac || v.u8 == nExp
	case valLiteral:
		return a.nodes[v.node].lits.nodes[v.pos].term >= 0
	}
	return false
}

func scanString(s *State, c byte) scanResult {
	v := &s.val
	switch {
	case v.esc == 1:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			v.esc = 0
		case 'u':
			v.esc = 5
		default:
			return scanRefused
		}
		return scanTaken
	case v.esc > 1:
		if !isHex(c) {
			return scanRefused
		}
		if v.esc--; v.esc == 1 {
			v.esc = 0
		}
		return scanTaken
	case v.u8 != u8Start:
	case c == '"':
		s.val = scalar{}
		return scanTaken
	case c == '\\':
		v.esc = 1
		return scanTaken
	case c < 0x20:
		return scanRefused
	}
	st, ok := utf8Step(v.u8, c)
	if !ok {
		return scanRefused
	}
	v.u8 = st
	return scanTaken
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// scanKey scans an object key: the declared names (only those not yet
// present), or with additional properties any string without escapes.
func (a *Automaton) scanKey(s *State, c byte) scanResult {
	v, f := &s.val, &s.top
	n := &a.nodes[v.node]
	if c == '"' && v.u8 == u8Start {
		return a.endKey(s, n)
	}
	declared, addl := keyRoom(n, *f)
	next := -1
	if v.pos != offTrie {
		next = n.keys.next(int(v.pos), c)
	}
	if !addl {
		if next < 0 || n.keys.nodes[next].mask&declared == 0 {
			return scanRefused
		}
		v.pos = uint16(next)
		return scanTaken
	}
	if c == '\\' || c < 0x20 || (c == '"' && v.u8 != u8Start) {
		return scanRefused
	}
	st, ok := utf8Step(v.u8, c)
	if !ok {
		return scanRefused
	}
	v.u8 = st
	v.pos = offTrie
	if next >= 0 {
		v.pos = uint16(next)
	}
	return scanTaken
}

func (a *Automaton) endKey(s *State, n *node) scanResult {
	v, f := &s.val, &s.top
	term := -1
	if v.pos != offTrie {
		term = n.keys.nodes[v.pos].term
	}
	declared, addl := keyRoom(n, *f)
	switch {
	case term >= 0 && declared&(1<<term) == 0:
		return scanRefused // a property twice, or one that leaves no room
	case term >= 0:
		f.seen |= 1 << term
		f.prop = n.propNode[term]
	case addl:
		f.prop = uint16(n.addl)
	default:
		return scanRefused
	}
	f.phase = oColon
	s.val = scalar{}
	return scanTaken
}

func (a *Automaton) scanNumber(v *scalar, integer bool, c byte) scanResult {
	digit := c >= '0' && c <= '9'
	set := func(st uint8, digits uint16) scanResult {
		v.u8, v.pos = st, digits
		return scanTaken
	}
	frac := !integer && c == '.'
	exp := !integer && (c == 'e' || c == 'E')
	switch v.u8 {
	case nBegin, nSign:
		switch {
		case c == '-' && v.u8 == nBegin:
			return set(nSign, 0)
		case c == '0':
			return set(nZero, 1)
		case digit:
			return set(nInt, 1)
		}
		return scanRefused
	case nZero, nInt:
		switch {
		case digit && v.u8 == nInt && v.pos < maxIntDigits:
			return set(nInt, v.pos+1)
		case frac:
			return set(nDot, 0)
		case exp:
			return set(nE, 0)
		}
		return scanEnded
	case nDot:
		if digit {
			return set(nFrac, 1)
		}
		return scanRefused
	case nFrac:
		switch {
		case digit && v.pos < maxFracDigits:
			return set(nFrac, v.pos+1)
		case exp:
			return set(nE, 0)
		}
		return scanEnded
	case nE, nESign:
		switch {
		case (c == '+' || c == '-') && v.u8 == nE:
			return set(nESign, 0)
		case digit:
			return set(nExp, 1)
		}
		return scanRefused
	}
	if digit && v.pos < maxExpDigits {
		return set(nExp, v.pos+1)
	}
	return scanEnded
}
