package grammar

import (
	"slices"
	"unsafe"
)

// trie is a byte trie of a fixed set of byte strings (literal texts or
// property names); node 0 is the root.
type trie struct {
	nodes []trieNode
}

type trieNode struct {
	edges  []trieEdge // sorted by byte
	term   int        // index of the string ending here, or -1
	mask   uint64     // bits of the strings (< 64) below and at this node
	depth  int
	minEnd int // fewest bytes to a terminal
}

type trieEdge struct {
	b  byte
	to int
}

func newTrie() *trie {
	return &trie{nodes: []trieNode{{term: -1}}}
}

func finished(t *trie) *trie {
	t.finish()
	return t
}

func (t *trie) insert(s []byte, index int) {
	at := 0
	for _, b := range s {
		next := t.next(at, b)
		if next < 0 {
			next = len(t.nodes)
			t.nodes = append(t.nodes, trieNode{term: -1, depth: t.nodes[at].depth + 1})
			e := t.nodes[at].edges
			i, _ := slices.BinarySearchFunc(e, b, func(e trieEdge, b byte) int { return int(e.b) - int(b) })
			t.nodes[at].edges = slices.Insert(e, i, trieEdge{b: b, to: next})
		}
		if index < 64 {
			t.nodes[at].mask |= 1 << index
		}
		at = next
	}
	if index < 64 {
		t.nodes[at].mask |= 1 << index
	}
	if t.nodes[at].term < 0 {
		t.nodes[at].term = index
	}
}

// finish computes minEnd bottom-up (children always follow parents).
func (t *trie) finish() {
	for i := len(t.nodes) - 1; i >= 0; i-- {
		n := &t.nodes[i]
		n.minEnd = 1 << 30
		if n.term >= 0 {
			n.minEnd = 0
		}
		for _, e := range n.edges {
			n.minEnd = min(n.minEnd, 1+t.nodes[e.to].minEnd)
		}
	}
}

// next returns the child of node at along b, or -1.
func (t *trie) next(at int, b byte) int {
	for _, e := range t.nodes[at].edges {
		if e.b == b {
			return e.to
		}
		if e.b > b {
			break
		}
	}
	return -1
}

func (t *trie) footprint() int {
	if t == nil {
		return 0
	}
	size := len(t.nodes) * int(unsafe.Sizeof(trieNode{}))
	for i := range t.nodes {
		size += len(t.nodes[i].edges) * int(unsafe.Sizeof(trieEdge{}))
	}
	return size
}
