package grammar

// MinClose returns the fewest bytes that complete the value from s, so that
// a sampler can force closure before its token budget runs out.
//
// It is exact: some byte b has MinClose(Advance(s, b)) == MinClose(s)-1, so
// a vocabulary with every single byte as a token (the built-in one) can
// always close the value in MinClose(s) tokens. The policy (MaskBudget):
// with r tokens left, this one included, a token is allowed only if
// MinClose after it is at most r-1. Starting from a budget of at least
// MinClose(Start()) tokens, the output is then a complete value when the
// budget runs out; with less, MaskBudget still only allows progress and
// the output is cut as short as it can be.
func (a *Automaton) MinClose(s State) int {
	if s.depth == 0 && !s.done {
		return a.nodes[a.root].minLen
	}
	cost := 0
	switch s.val.kind {
	case valNone:
	case valKey:
		cost = a.keyClose(s) // it closes the object too; frameClose(oKey) is 0
	default:
		cost = a.scalarClose(s.val)
	}
	if s.depth == 0 {
		return cost
	}
	cost += a.frameClose(s.top)
	for o := s.outer; len(o) > 0; o = o[frameSize:] {
		cost += a.frameClose(decodeFrame(o))
	}
	return cost
}

func (a *Automaton) scalarClose(v scalar) int {
	switch v.kind {
	case valString:
		switch {
		case v.esc == 1:
			return 2 // one escaped character, the quote
		case v.esc > 1:
			return int(v.esc-1) + 1
		}
		return u8Pending[v.u8] + 1
	case valNumber:
		switch v.u8 {
		case nSign, nDot, nE, nESign:
			return 1
		}
		return 0
	}
	return a.nodes[v.node].lits.nodes[v.pos].minEnd
}

// frameClose is the fewest bytes that close the container f (the inner
// ones closed already).
func (a *Automaton) frameClose(f frame) int {
	n := &a.nodes[f.node]
	if n.kind == kArray {
		m := a.nodes[n.items].minLen
		left := max(0, n.minItems-int(f.count))
		switch f.phase {
		case aOpen:
			return max(1, n.minItems*(m+1))
		case aNext:
			return left*(m+1) + 1
		}
		return max(1, left) * (m + 1) // after ',': an item is due
	}
	req := dueCost(a.nodes, n, f.seen)
	switch f.phase {
	case oOpen:
		return max(1, req)
	case oNext:
		return req + 1
	case oComma, oCommaSp:
		if req > 0 {
			return req
		}
		return a.cheapestKey(n, f.seen) + 1
	case oColon:
		return 1 + a.nodes[f.prop].minLen + req + 1
	case oValue, oValueSp:
		return a.nodes[f.prop].minLen + req + 1
	}
	return 0 // oKey: keyClose accounts for the object
}

// cheapestKey is the fewest bytes of `"key":value` for a key not present.
func (a *Automaton) cheapestKey(n *node, seen uint64) int {
	best := 1 << 30
	if n.addl >= 0 {
		best = 3 + a.nodes[n.addl].minLen
	}
	for i, name := range n.names {
		if seen&(1<<i) == 0 {
			best = min(best, len(name)+3+a.nodes[n.propNode[i]].minLen)
		}
	}
	return best
}

// keyClose is the fewest bytes that finish the key being scanned, its
// value and its object.
func (a *Automaton) keyClose(s State) int {
	v, f := s.val, s.top
	n := &a.nodes[f.node]
	best := 1 << 30
	declared, addl := keyRoom(n, f)
	if v.pos != offTrie {
		t := &n.keys.nodes[v.pos]
		for i, name := range n.names {
			bit := uint64(1) << i
			if t.mask&bit != 0 && declared&bit != 0 {
				rest := len(name) - t.depth + 2 + a.nodes[n.propNode[i]].minLen
				best = min(best, rest+dueCost(a.nodes, n, f.seen|bit)+1)
			}
		}
	}
	if addl {
		extra := u8Pending[v.u8]
		if v.pos != offTrie && n.keys.nodes[v.pos].term >= 0 {
			extra = 1 // a declared name already present: one more character
		}
		best = min(best, extra+2+a.nodes[n.addl].minLen+dueCost(a.nodes, n, f.seen)+1)
	}
	return best
}
