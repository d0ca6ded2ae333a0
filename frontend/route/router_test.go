package route

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/kv/blockid"
)

// t0 is the tests' epoch.
var t0 = time.Unix(1_800_000_000, 0)

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

// TestRouterAccessors: what run code reads of the router, and a failure
// notice's generation rule: a notice about an older generation never
// removes the newer one that replaced it, and 0 means the known one.
func TestRouterAccessors(t *testing.T) {
	rt := NewRouter()
	rt.Update(Instance{ID: "a", Generation: 2, Node: "n1", Model: "m", Ready: true})
	rt.Update(Instance{ID: "b", Generation: 1, Node: "n2", Model: "other"})
	if in, ok := rt.Instance("a"); !ok || in.Node != "n1" || in.Generation != 2 {
		t.Fatalf("instance a: %+v %v", in, ok)
	}
	if _, ok := rt.Instance("zz"); ok || rt.NodeOf("zz") != "" || rt.NodeOf("b") != "n2" {
		t.Fatal("unknown instance or node")
	}
	if !rt.HasModel("other") || rt.HasModel("none") || fmt.Sprint(rt.ReadyModels()) != "[m]" {
		t.Fatalf("models %v", rt.ReadyModels())
	}
	if gen := rt.Fail("a", 1, t0); gen != 1 {
		t.Fatalf("applied generation %d", gen)
	}
	if _, ok := rt.Instance("a"); !ok {
		t.Fatal("a notice about generation 1 removed generation 2")
	}
	if gen := rt.Fail("a", 0, t0); gen != 2 {
		t.Fatalf("applied generation %d", gen)
	}
	if _, ok := rt.Instance("a"); ok {
		t.Fatal("failed instance still routed to")
	}
	// Suppressed at generation 2: a re-registration at 2 is not picked, one
	// at 3 is.
	rt.Update(Instance{ID: "a", Generation: 2, Node: "n1", Model: "m", Ready: true})
	if _, err := rt.Pick("m", "", "", nil, t0); err == nil {
		t.Fatal("suppressed endpoint picked")
	}
	rt.Update(Instance{ID: "a", Generation: 3, Node: "n1", Model: "m", Ready: true})
	if in, err := rt.Pick("m", "", "", nil, t0); err != nil || in.Generation != 3 {
		t.Fatalf("restarted instance: %+v %v", in, err)
	}
}

// TestRouterConcurrentUse: the registry watch writes while requests pick
// and read (run with -race).
func TestRouterConcurrentUse(t *testing.T) {
	rt := NewRouter()
	id := &blockid.Identity{BlockSize: 16}
	keys := keyChain(4)
	done := make(chan struct{})
	var writers, readers sync.WaitGroup
	writers.Add(1)
	go func() {
		defer writers.Done()
		for i := range 500 {
			name := fmt.Sprint("i", i%7)
			rt.Update(Instance{ID: name, Generation: uint64(i), Node: fmt.Sprint("n", i%3), Model: "m", Ready: true, Role: []string{"decode", "prefill"}[i%2], KVIdentity: id})
			rt.UpdateNode(Node{Name: fmt.Sprint("n", i%3), KVAddr: "x:1", Prefixes: summary(keys[:i%4]), Updated: t0})
			switch i % 50 {
			case 10:
				rt.Fail(name, 0, t0)
			case 20:
				rt.RemoveNode("n1")
			case 30:
				rt.Replace([]Instance{{ID: "i0", Model: "m", Ready: true}})
				rt.ReplaceNodes(nil)
			case 40:
				rt.Remove(name)
			}
		}
	}()
	for range 3 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				rt.PickCached("m", "", "", nil, t0, func(Instance) []blockid.BlockKey { return keys })
				rt.PickPrefill("m", "", "", nil, t0, func(Instance) []blockid.BlockKey { return keys })
				rt.Instance("i1")
				rt.NodeOf("i2")
				rt.HasModel("m")
				rt.HasPrefill("m")
				rt.ReadyModels()
				rt.KVSources([]string{"n0"}, rt.NodeOf("i3"))
				rt.CachedBlocks("n2", keys, t0)
			}
		}()
	}
	writers.Wait()
	close(done)
	readers.Wait()
}

// TestRouterDeregisterIsNotDeath: a vanished registration is not routed
// to, but remembered at its generation (fencing an older registration,
// answering Instance for the streams on it) until it registers again or
// fails; a full read that lacks an instance departs it the same way. A
// model stays known after its instances leave.
func TestRouterDeregisterIsNotDeath(t *testing.T) {
	rt := NewRouter()
	if rt.KnowsAny() || rt.Knows("m") {
		t.Fatal("an empty router knows a model")
	}
	rt.Update(Instance{ID: "a", Generation: 3, Node: "n1", Model: "m", Ready: true})
	if rt.Routable(t0) != 1 {
		t.Fatal("a ready instance is not routable")
	}
	rt.Deregister("a")
	if _, err := rt.Pick("m", "", "", nil, t0); err == nil || rt.Routable(t0) != 0 || len(rt.ReadyModels()) != 0 {
		t.Fatal("a deregistered instance is still routed to")
	}
	if in, ok := rt.Instance("a"); !ok || in.Node != "n1" || rt.Generation("a") != 3 || !rt.Knows("m") || !rt.KnowsAny() || rt.Knows("x") {
		t.Fatalf("deregistered: %+v %v, generation %d", in, ok, rt.Generation("a"))
	}
	if rt.Update(Instance{ID: "a", Generation: 2, Model: "m", Ready: true}) {
		t.Fatal("an older generation registered over a departed one")
	}
	if !rt.Update(Instance{ID: "a", Generation: 4, Model: "m", Ready: true}) {
		t.Fatal("the re-registration refused")
	}
	if in, err := rt.Pick("m", "", "", nil, t0); err != nil || in.Generation != 4 {
		t.Fatalf("re-registered: %+v %v", in, err)
	}
	rt.Update(Instance{ID: "b", Generation: 1, Model: "m", Ready: true})
	rt.Replace([]Instance{{ID: "b", Generation: 1, Model: "m", Ready: true}})
	if in, err := rt.Pick("m", "", "", nil, t0); err != nil || in.ID != "b" || rt.Generation("a") != 4 {
		t.Fatalf("after a read without a: %+v %v, a at %d", in, err, rt.Generation("a"))
	}
	rt.Fail("a", 0, t0)
	if _, ok := rt.Instance("a"); ok || rt.Generation("a") != 0 {
		t.Fatal("a failed departed instance is remembered")
	}
	// Not ready, draining, suppressed and prefill-only instances are not
	// routable.
	rt.Update(Instance{ID: "c", Generation: 1, Model: "m", Ready: false})
	rt.Update(Instance{ID: "d", Generation: 1, Model: "m", Ready: true, Draining: true})
	rt.Update(Instance{ID: "e", Generation: 1, Model: "m", Ready: true, Role: "prefill"})
	rt.Suppress("b", 1, t0)
	if n := rt.Routable(t0); n != 0 {
		t.Fatalf("%d routable", n)
	}
	if n := rt.Routable(t0.Add(time.Minute)); n != 1 {
		t.Fatalf("%d routable after the suppression", n)
	}
}

// TestRouterKeepsToCapacity: an instance that registered what it holds
// (running and queued) gets no more of this frontend's open streams than
// that, for each priority; the request beyond every instance's capacity
// is refused without an attempt (ErrInstancesFull); a stream that ends
// makes room again.
func TestRouterKeepsToCapacity(t *testing.T) {
	rt := NewRouter()
	rt.Update(Instance{ID: "a", Generation: 1, Model: "m", Ready: true, Capacity: 3, BatchCapacity: 2})
	rt.Update(Instance{ID: "b", Generation: 1, Model: "m", Ready: true})
	rt.Update(Instance{ID: "c", Generation: 1, Model: "x", Ready: true, Capacity: 1, BatchCapacity: 1})
	pick := func(model, priority string) (string, error) {
		in, _, _, err := rt.PickCachedBelow(model, "", "", nil, t0, func(Instance) []blockid.BlockKey { return nil }, 0, priority, true)
		return in.ID, err
	}
	var closers []func()
	for range 2 {
		closers = append(closers, rt.Opened("a"))
	}
	if id, err := pick("m", PriorityBatch); err != nil || id != "b" {
		t.Fatalf("batch with a at its batch capacity: %q %v, want b (no capacity said)", id, err)
	}
	if id, err := pick("m", PriorityInteractive); err != nil || id != "a" && id != "b" {
		t.Fatalf("interactive: %q %v", id, err)
	}
	closers = append(closers, rt.Opened("c"))
	if _, err := pick("x", PriorityInteractive); !errors.Is(err, ErrInstancesFull) {
		t.Fatalf("the only instance at capacity: %v, want ErrInstancesFull", err)
	}
	closers[len(closers)-1]()
	if id, err := pick("x", PriorityInteractive); err != nil || id != "c" {
		t.Fatalf("after its stream ended: %q %v", id, err)
	}
	closers = append(closers, rt.Opened("a"))
	rt.Update(Instance{ID: "b", Generation: 1, Model: "m", Ready: true, Capacity: 1, BatchCapacity: 1})
	closers = append(closers, rt.Opened("b"))
	if _, err := pick("m", PriorityInteractive); !errors.Is(err, ErrInstancesFull) {
		t.Fatalf("a at 3 of 3, b at 1 of 1: %v, want ErrInstancesFull", err)
	}
	for _, c := range closers {
		c()
	}
}

// TestRouterMigrationIgnoresCapacity: a request with tokens out is sent
// to an instance at its capacity all the same (its worker queues or
// refuses it): the capacity only holds fresh requests back.
func TestRouterMigrationIgnoresCapacity(t *testing.T) {
	rt := NewRouter()
	rt.Update(Instance{ID: "a", Generation: 1, Model: "m", Ready: true, Capacity: 1, BatchCapacity: 1})
	defer rt.Opened("a")()
	none := func(Instance) []blockid.BlockKey { return nil }
	if _, _, _, err := rt.PickCachedBelow("m", "", "", nil, t0, none, 0, "", true); !errors.Is(err, ErrInstancesFull) {
		t.Fatalf("fresh: %v, want ErrInstancesFull", err)
	}
	if in, _, _, err := rt.PickCachedBelow("m", "", "", nil, t0, none, 0, "", false); err != nil || in.ID != "a" {
		t.Fatalf("a migration: %+v %v", in, err)
	}
}

// TestFencedUntilRegistered: an instance that refused because its agent
// could not prove its lease is avoided until it registers again (the
// lease renewed) or SuppressFor passes; NextLift says when a waiting
// request should look again. A failure's suppression is not lifted by a
// registration of the same generation.
func TestFencedUntilRegistered(t *testing.T) {
	rt := NewRouter()
	a := Instance{ID: "a", Model: "m", Ready: true, Role: "decode", Generation: 2}
	rt.Update(a)
	pick := func(now time.Time) string {
		in, err := rt.Pick("m", "", "", nil, now)
		if err != nil {
			return ""
		}
		return in.ID
	}
	rt.Fenced("a", 2, t0)
	if got := pick(t0); got != "" {
		t.Fatalf("a fenced instance was picked: %q", got)
	}
	if lift := rt.NextLift(t0); !lift.Equal(t0.Add(rt.SuppressFor)) {
		t.Fatalf("NextLift %v, want %v", lift, t0.Add(rt.SuppressFor))
	}
	rt.Update(a) // the agent kept its lease and wrote its registrations again
	if got := pick(t0); got != "a" {
		t.Fatalf("after its registration: picked %q", got)
	}
	if lift := rt.NextLift(t0); !lift.IsZero() {
		t.Fatalf("NextLift %v with nothing suppressed", lift)
	}
	rt.Fenced("a", 2, t0)
	if got := pick(t0.Add(rt.SuppressFor)); got != "a" {
		t.Fatalf("still avoided after SuppressFor: %q", got)
	}
	rt.Suppress("a", 2, t0)
	rt.Update(a)
	if got := pick(t0); got != "" {
		t.Fatalf("a failure's suppression was lifted by a registration at the same generation: picked %q", got)
	}
}
