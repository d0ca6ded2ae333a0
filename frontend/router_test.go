package frontend

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/kv/blockid"
)

func keyChain(n int) []blockid.BlockKey {
	keys := make([]blockid.BlockKey, n)
	for i := range keys {
		keys[i] = sha256.Sum256([]byte(fmt.Sprint("block", i)))
	}
	return keys
}

func summary(keys []blockid.BlockKey) map[string]bool {
	m := map[string]bool{}
	for _, k := range keys {
		m[hex.EncodeToString(k[:8])] = true
	}
	return m
}

// TestCacheAwareRouting: the instance whose node holds the longest prefix
// wins unless its load outweighs the prefix; stale or missing summaries
// fall back to load-only routing.
func TestCacheAwareRouting(t *testing.T) {
	id := &blockid.Identity{BlockSize: 16}
	keys := keyChain(6)
	rt := NewRouter()
	for _, in := range []Instance{
		{ID: "a", Node: "n1", Model: "m", Ready: true, Role: "decode", KVIdentity: id},
		{ID: "b", Node: "n2", Model: "m", Ready: true, Role: "decode", KVIdentity: id},
		{ID: "p", Node: "n2", Model: "m", Ready: true, Role: "prefill", KVIdentity: id},
	} {
		rt.Update(in)
	}
	keysFor := func(Instance) []blockid.BlockKey { return keys }
	// No summaries: load only, lowest id.
	if in, n, used, _ := rt.PickCached("m", "", "", nil, t0, keysFor); in.ID != "a" || n != 0 || used {
		t.Fatalf("no summaries: %s %d %v", in.ID, n, used)
	}
	rt.UpdateNode(Node{Name: "n1", Prefixes: summary(keys[:1]), Updated: t0})
	rt.UpdateNode(Node{Name: "n2", Prefixes: summary(keys[:4]), Updated: t0})
	if in, n, used, _ := rt.PickCached("m", "", "", nil, t0, keysFor); in.ID != "b" || n != 4 || !used {
		t.Fatalf("longest prefix: %s %d", in.ID, n)
	}
	// A prefix hole ends the match: n2 holds blocks 0-3, not 0-5.
	if n, _ := rt.CachedBlocks("n2", keys, t0); n != 4 {
		t.Fatalf("cached %d", n)
	}
	// Load outweighs the cache: 48 more cached positions, 1 more
	// outstanding sequence (64) on b.
	rt.Update(Instance{ID: "b", Node: "n2", Model: "m", Ready: true, Role: "decode", KVIdentity: id, Outstanding: 1})
	if in, _, _, _ := rt.PickCached("m", "", "", nil, t0, keysFor); in.ID != "a" {
		t.Fatalf("busy instance with the cache chosen: %s", in.ID)
	}
	rt.Update(Instance{ID: "b", Node: "n2", Model: "m", Ready: true, Role: "decode", KVIdentity: id})
	// Stale summaries are ignored.
	later := t0.Add(SummaryMaxAge + time.Second)
	if in, n, used, _ := rt.PickCached("m", "", "", nil, later, keysFor); in.ID != "a" || n != 0 || used {
		t.Fatalf("stale summaries: %s %d %v", in.ID, n, used)
	}
	// Without identity keys (a tokenizer the router cannot reproduce).
	if in, _, _, _ := rt.PickCached("m", "", "", nil, t0, func(Instance) []blockid.BlockKey { return nil }); in.ID != "a" {
		t.Fatalf("no keys: %s", in.ID)
	}
	// Prefill instances are never picked for decode; sources skip the
	// destination's node and start with the named ones.
	rt.UpdateNode(Node{Name: "n3", KVAddr: "c:3", Updated: t0})
	rt.UpdateNode(Node{Name: "n1", KVAddr: "a:1", Updated: t0})
	rt.UpdateNode(Node{Name: "n2", KVAddr: "b:2", Updated: t0})
	if got := fmt.Sprint(rt.KVSources([]string{"n3", "gone"}, "n1")); got != "[c:3 b:2]" {
		t.Fatalf("sources %s", got)
	}
	if p, err := rt.PickPrefill("m", "", "", nil, t0, nil); err != nil || p.ID != "p" {
		t.Fatalf("prefill pick %v %v", p, err)
	}
	// Between two prefill instances, the one whose node holds the prompt.
	rt.Update(Instance{ID: "p0", Node: "n1", Model: "m", Ready: true, Role: "prefill", KVIdentity: id})
	rt.UpdateNode(Node{Name: "n1", KVAddr: "a:1", Prefixes: summary(keys[:3]), Updated: t0})
	rt.UpdateNode(Node{Name: "n2", KVAddr: "b:2", Prefixes: summary(keys[:1]), Updated: t0})
	if p, _ := rt.PickPrefill("m", "", "", nil, t0, keysFor); p.ID != "p0" {
		t.Fatalf("prefill pick ignores the cached prompt: %s", p.ID)
	}
	if p, _ := rt.PickPrefill("m", "", "", nil, t0, nil); p.ID != "p" {
		t.Fatalf("load-only prefill pick: %s", p.ID)
	}
}
