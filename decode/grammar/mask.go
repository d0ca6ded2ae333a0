package grammar

// Vocab is a vocabulary prepared for masking: a byte trie of its pieces,
// built once and shared by every automaton and request.
type Vocab struct {
	pieces [][]byte
	nodes  []vnode
	edges  []vedge
	ids    []int32
	eos    int
	size   int
}

type vnode struct {
	firstEdge, numEdges int32
	firstID, numIDs     int32
}

type vedge struct {
	b  byte
	to int32
}

// NewVocab prepares pieces (token id → the bytes it stands for mid-stream)
// with eos the end-of-sequence id. Tokens with no bytes other than eos
// (specials) are never allowed.
func NewVocab(pieces [][]byte, eos int) *Vocab {
	type build struct {
		kids map[byte]int
		ids  []int32
	}
	tree := []build{{kids: map[byte]int{}}}
	for id, p := range pieces {
		if len(p) == 0 {
			continue
		}
		at := 0
		for _, b := range p {
			next, ok := tree[at].kids[b]
			if !ok {
				next = len(tree)
				tree = append(tree, build{kids: map[byte]int{}})
				tree[at].kids[b] = next
			}
			at = next
		}
		tree[at].ids = append(tree[at].ids, int32(id))
	}
	v := &Vocab{pieces: pieces, eos: eos, size: len(pieces), nodes: make([]vnode, len(tree))}
	for i, t := range tree {
		n := &v.nodes[i]
		n.firstEdge, n.firstID = int32(len(v.edges)), int32(len(v.ids))
		for b := 0; b < 256; b++ { // byte order: no map order leaks out
			if to, ok := t.kids[byte(b)]; ok {
				v.edges = append(v.edges, vedge{b: byte(b), to: int32(to)})
			}
		}
		v.ids = append(v.ids, t.ids...)
		n.numEdges = int32(len(v.edges)) - n.firstEdge
		n.numIDs = int32(len(t.ids))
	}
	return v
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return v.size }

// Piece returns the bytes of token id (nil for specials and ids outside
// the vocabulary). The caller must not modify them.
func (v *Vocab) Piece(id int) []byte {
	if id < 0 || id >= v.size {
		return nil
	}
	return v.pieces[id]
}

// EOS is the end-of-sequence id.
func (v *Vocab) EOS() int { return v.eos }

// Mask sets allowed[id] to whether token id may follow s: every byte of its
// piece advances the automaton; eos only once s is accepting. allowed must
// have v.Size() entries.
func (a *Automaton) Mask(s State, v *Vocab, allowed []bool) {
	a.MaskBudget(s, v, allowed, -1)
}

// MaskBudget is Mask under a budget of remaining tokens (this one
// included; negative: unbounded): a token is allowed only if the value can
// still be closed in the tokens left after it (see MinClose).
func (a *Automaton) MaskBudget(s State, v *Vocab, allowed []bool, remaining int) {
	clear(allowed[:v.size])
	w := walker{a: a, v: v, allowed: allowed, limit: -1}
	if remaining >= 0 {
		w.limit = max(remaining-1, a.MinClose(s)-1)
		w.base = a.MinClose(s)
	}
	w.walk(0, s, 0)
	if a.Accepting(s) && v.eos >= 0 && v.eos < v.size {
		allowed[v.eos] = true
	}
}

type walker struct {
	a       *Automaton
	v       *Vocab
	allowed []bool
	limit   int // the largest MinClose allowed after a token; -1: any
	base    int // MinClose before the token
}

// walk visits the vocabulary trie below node at together with the
// automaton: a subtree is cut at the first byte the automaton refuses.
func (w *walker) walk(at int32, s State, depth int) {
	n := w.v.nodes[at]
	for _, e := range w.v.edges[n.firstEdge : n.firstEdge+n.numEdges] {
		t := s
		if !w.a.step(&t, e.b) {
			continue
		}
		c := w.v.nodes[e.to]
		if c.numIDs > 0 && w.fits(t, depth+1) {
			for _, id := range w.v.ids[c.firstID : c.firstID+c.numIDs] {
				w.allowed[id] = true
			}
		}
		if c.numEdges > 0 {
			w.walk(e.to, t, depth+1)
		}
	}
}

// fits applies the budget. MinClose grows by at most 2*maxLen+8 per byte (a
// key and its value at their shortest),
// so it is computed only when a token could reach the limit.
func (w *walker) fits(t State, bytes int) bool {
	if w.limit < 0 || w.base+bytes*(2*w.a.maxLen+8) <= w.limit {
		return true
	}
	return w.a.MinClose(t) <= w.limit
}
