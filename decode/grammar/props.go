package grammar

import (
	"math/bits"
	"slices"
)

// Property counts (minProperties, maxProperties). The state cannot tell
// additional property names apart (it would have to remember them), so
// minProperties is met by declared properties only (which are distinct by
// construction), and maxProperties counts every key as written: a text the
// automaton accepts then has at least minProperties and at most
// maxProperties distinct keys however a parser merges duplicates.
//
// A key is allowed only if it leaves room, within maxProperties, for every
// property still due (see keyRoom): the automaton never reaches a state
// it cannot close.

// due is the number of declared properties still needed before '}':
// every required one not present, and enough to reach minProperties.
func due(n *node, seen uint64) int {
	r := bits.OnesCount64(n.required &^ seen)
	m := n.minProps - bits.OnesCount64(seen)
	return max(r, m, 0)
}

// allNames is the bit set of n's declared properties.
func allNames(n *node) uint64 {
	if len(n.names) >= 64 {
		return ^uint64(0)
	}
	return 1<<len(n.names) - 1
}

// canAddKey reports whether a new key may start in the object frame f.
func (a *Automaton) canAddKey(n *node, f frame) bool {
	if n.maxProps != unbounded && int(f.count) >= n.maxProps {
		return false
	}
	return n.addl >= 0 || allNames(n)&^f.seen != 0
}

// keyRoom returns the declared properties the key being scanned in f may
// name, and whether it may be an additional one. f.count already counts
// this key.
func keyRoom(n *node, f frame) (declared uint64, addl bool) {
	unseen := allNames(n) &^ f.seen
	if n.maxProps == unbounded {
		return unseen, n.addl >= 0
	}
	r := bits.OnesCount64(n.required &^ f.seen)
	m := n.minProps - bits.OnesCount64(f.seen)
	left := n.maxProps - int(f.count) // keys allowed after this one
	switch {
	case left >= max(r, m): // an additional key leaves both due
		return unseen, n.addl >= 0
	case left >= max(r, m-1): // a declared one counts towards minProperties
		return unseen, false
	}
	return n.required &^ f.seen, false // only a required one keeps room
}

// dueCost is the fewest bytes of `,"name":value` (or `"name":value}`) for
// the properties still due after seen: the required ones not present, then
// the cheapest optional ones up to minProperties.
func dueCost(nodes []node, n *node, seen uint64) int {
	cost := 0
	for i, name := range n.names {
		if n.required&^seen&(1<<i) != 0 {
			cost += propCost(nodes, n, i, name)
		}
	}
	extra := due(n, seen) - bits.OnesCount64(n.required&^seen)
	for _, i := range n.optByCost {
		if extra <= 0 {
			break
		}
		if seen&(1<<i) == 0 {
			cost += propCost(nodes, n, int(i), n.names[i])
			extra--
		}
	}
	return cost
}

func propCost(nodes []node, n *node, i int, name string) int {
	return len(name) + 4 + nodes[n.propNode[i]].minLen
}

// sortOptional orders n's optional properties by cost (then index), for
// dueCost.
func sortOptional(nodes []node, n *node) {
	n.optByCost = n.optByCost[:0]
	for i := range n.names {
		if n.required&(1<<i) == 0 {
			n.optByCost = append(n.optByCost, uint8(i))
		}
	}
	slices.SortStableFunc(n.optByCost, func(x, y uint8) int {
		return propCost(nodes, n, int(x), n.names[x]) - propCost(nodes, n, int(y), n.names[y])
	})
}
