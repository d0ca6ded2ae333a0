package kv

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/shm"
)

// fakeClock is the injected clock of owner tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type ownerEnv struct {
	opts  Options
	clock *fakeClock
}

func newOwnerEnv(t testing.TB, slots int) *ownerEnv {
	t.Helper()
	dir := t.TempDir()
	shmDir := "/dev/shm"
	if _, err := os.Stat(shmDir); err != nil {
		shmDir = dir
	}
	f, err := os.CreateTemp(shmDir, "lifeline-kvtest-*")
	if err != nil {
		t.Fatal(err)
	}
	arena := f.Name()
	f.Close()
	os.Remove(arena) // the owner creates it exclusively
	t.Cleanup(func() { os.Remove(arena) })
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	return &ownerEnv{clock: c, opts: Options{ArenaPath: arena, Geometry: shm.Geometry{Slots: slots, PayloadSize: 256},
		DBDir: filepath.Join(dir, "db"), LeaseTTL: 3 * time.Second, HighWater: 0.75, Now: c.Now}}
}

func (e *ownerEnv) open(t testing.TB) *Owner {
	t.Helper()
	o, err := Open(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

var testID = Identity{Model: "tiny", ModelRevision: "rev1", TokenizerHash: "tok1", Layout: "layout", DType: "float32",
	RopeTheta: 10000, BlockSize: 4, NumericsID: "n1"}

// writeBlock allocates, fills, seals and optionally publishes one block.
func writeBlock(t testing.TB, o *Owner, sid SessionID, key, parent BlockKey, fill byte, publish bool) Ref {
	t.Helper()
	refs, err := o.Allocate(sid, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := refs[0]
	p := o.Arena().Payload(int(r.Slot))[:100]
	for i := range p {
		p[i] = fill + byte(i)
	}
	r.PayloadLen, r.Checksum = 100, shm.Checksum(p)
	if err := o.Seal(sid, r, key, parent); err != nil {
		t.Fatal(err)
	}
	if publish {
		if err := o.Publish(sid, r); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func hello(t testing.TB, o *Owner, inst string, gen uint64) SessionID {
	t.Helper()
	sid, _, _, err := o.Hello(Writer{Instance: inst, Gen: gen}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

func TestStateMachine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		from, to State
		ok       bool
	}{
		{Free, Allocated, true}, {Allocated, Writing, true}, {Writing, Sealed, true}, {Sealed, Published, true},
		{Writing, Aborted, true}, {Writing, Published, false}, {Published, Writing, false}, {Aborted, Published, false},
		{Published, Sealed, false}, {Free, Published, false},
	} {
		if err := Transition(c.from, c.to); (err == nil) != c.ok {
			t.Errorf("%s → %s: %v", c.from, c.to, err)
		}
	}
}

func TestIdentityFieldsAllMatter(t *testing.T) {
	t.Parallel()
	tokens := []int{5, 6, 7, 8, 9, 10, 11, 12}
	base := testID.Chain(tokens, -1)
	if len(base) != 2 {
		t.Fatalf("%d keys for 8 tokens of block size 4", len(base))
	}
	for name, mut := range map[string]func(*Identity){
		"model":            func(i *Identity) { i.Model = "small" },
		"revision":         func(i *Identity) { i.ModelRevision = "rev2" },
		"tokenizer hash":   func(i *Identity) { i.TokenizerHash = "tok2" },
		"adapter":          func(i *Identity) { i.Adapter = "lora-a" },
		"adapter revision": func(i *Identity) { i.AdapterRevision = "2" },
		"layout":           func(i *Identity) { i.Layout = "other" },
		"dtype":            func(i *Identity) { i.DType = "bfloat16" },
		"rope theta":       func(i *Identity) { i.RopeTheta = 500000 },
		"block size":       func(i *Identity) { i.BlockSize = 8 },
		"numerics":         func(i *Identity) { i.NumericsID = "n2" },
	} {
		id := testID
		mut(&id)
		if k := id.Chain(tokens, -1); len(k) > 0 && k[0] == base[0] {
			t.Errorf("%s changed but the key did not", name)
		}
	}
	// The parent is part of the key: same tokens after another prefix miss.
	other := testID.Chain([]int{1, 2, 3, 4, 9, 10, 11, 12}, -1)
	if other[1] == base[1] {
		t.Error("second block key ignores its parent")
	}
}

func TestPublishLookupAndIdentityMiss(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 8)
	o := env.open(t)
	defer o.Close()
	sid := hello(t, o, "decode-1", 1)
	tokens := []int{1, 2, 3, 4, 5, 6, 7, 8}
	keys := testID.Chain(tokens, -1)
	r0 := writeBlock(t, o, sid, keys[0], BlockKey{}, 1, true)
	// Sealed but unpublished: not visible.
	writeBlock(t, o, sid, keys[1], keys[0], 2, false)
	if n := o.Lookup(keys); n != 1 {
		t.Fatalf("lookup found %d blocks, want 1 (second is only SEALED)", n)
	}
	for _, field := range []string{"revision", "tokenizer", "adapter", "dtype", "theta", "block", "parent"} {
		id := testID
		var ks []BlockKey
		switch field {
		case "revision":
			id.ModelRevision = "x"
		case "tokenizer":
			id.TokenizerHash = "x"
		case "adapter":
			id.Adapter = "x"
		case "dtype":
			id.DType = "x"
		case "theta":
			id.RopeTheta = 1e6
		case "block":
			id.BlockSize = 2
		case "parent":
			ks = []BlockKey{id.Key(BlockKey{1}, tokens[:4])}
		}
		if ks == nil {
			ks = id.Chain(tokens, -1)
		}
		if n := o.Lookup(ks); n != 0 {
			t.Errorf("%s changed: lookup hit %d blocks", field, n)
		}
	}
	other := hello(t, o, "decode-2", 1)
	refs, err := o.Acquire(other, keys)
	if err != nil || len(refs) != 1 || refs[0].Slot != r0.Slot || refs[0].Gen != r0.Gen || refs[0].Checksum != r0.Checksum {
		t.Fatalf("acquire: %+v, %v", refs, err)
	}
	// A writer cannot publish or abort another session's block.
	if err := o.Abort(other, r0); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("foreign abort: %v", err)
	}
	// A publish retried after a lost reply succeeds without acting twice;
	// another writer cannot publish the block.
	leases := o.Stats().Leases
	if err := o.Publish(sid, r0); err != nil {
		t.Fatalf("retried publish: %v", err)
	}
	if o.Stats().Leases != leases {
		t.Fatal("retried publish added a lease")
	}
	if err := o.Publish(other, r0); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("foreign publish: %v", err)
	}
}

func TestSealVerifiesChecksum(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 4)
	o := env.open(t)
	defer o.Close()
	sid := hello(t, o, "w", 1)
	refs, _ := o.Allocate(sid, 1)
	r := refs[0]
	copy(o.Arena().Payload(int(r.Slot)), "payload")
	r.PayloadLen, r.Checksum = 7, shm.Checksum([]byte("payloaX"))
	if err := o.Seal(sid, r, BlockKey{9}, BlockKey{}); !errors.Is(err, ErrChecksum) {
		t.Fatalf("seal with wrong checksum: %v", err)
	}
	if err := o.Publish(sid, r); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("publish of a WRITING block: %v", err)
	}
}

func TestStaleReferences(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 1)
	o := env.open(t)
	defer o.Close()
	sid := hello(t, o, "w", 1)
	old := writeBlock(t, o, sid, BlockKey{1}, BlockKey{}, 1, true)
	if err := o.Release(sid, old); err != nil {
		t.Fatal(err)
	}
	if err := o.Delete(old); err != nil {
		t.Fatal(err)
	}
	// The one slot is reused for a new block at a higher generation.
	fresh := writeBlock(t, o, sid, BlockKey{2}, BlockKey{}, 2, true)
	o.Release(sid, fresh)
	if fresh.Slot != old.Slot || fresh.Gen <= old.Gen {
		t.Fatalf("slot reuse: old %+v, new %+v", old, fresh)
	}
	if got := o.Arena().Gen(int(old.Slot)); got != fresh.Gen {
		t.Fatalf("header generation %d, want %d", got, fresh.Gen)
	}
	// A late delete with the old generation is refused and counted; the new
	// block survives.
	if err := o.Delete(old); !errors.Is(err, ErrStaleRef) {
		t.Fatalf("stale delete: %v", err)
	}
	if st := o.Stats(); st.StaleDeletes != 1 || o.Lookup([]BlockKey{{2}}) != 1 {
		t.Fatalf("after stale delete: %+v, lookup %d", st, o.Lookup([]BlockKey{{2}}))
	}
	if err := o.Release(sid, old); !errors.Is(err, ErrStaleRef) {
		t.Fatalf("stale release: %v", err)
	}
	if _, err := o.ReportCorrupt(old); !errors.Is(err, ErrStaleRef) {
		t.Fatalf("stale corruption report: %v", err)
	}
}

func TestCorruptPayloadDropped(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 4)
	o := env.open(t)
	defer o.Close()
	sid := hello(t, o, "w", 1)
	r := writeBlock(t, o, sid, BlockKey{1}, BlockKey{}, 1, true)
	if dropped, err := o.ReportCorrupt(r); dropped || err != nil {
		t.Fatalf("intact block reported corrupt: %v %v", dropped, err)
	}
	o.Arena().Payload(int(r.Slot))[17] ^= 0x40
	if dropped, err := o.ReportCorrupt(r); !dropped || err != nil {
		t.Fatalf("corrupt block not dropped: %v %v", dropped, err)
	}
	if o.Lookup([]BlockKey{{1}}) != 0 || o.Stats().CorruptDropped != 1 {
		t.Fatal("corrupt block still published")
	}
}

func TestSweeperReclaimsExpiredWritersNeverLeased(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 8)
	o := env.open(t)
	defer o.Close()
	env.clock.Advance(o.LeaseTTL()) // past the start-up grace
	dead := hello(t, o, "dead", 1)
	live := hello(t, o, "live", 1)
	writeBlock(t, o, dead, BlockKey{1}, BlockKey{}, 1, false) // SEALED
	if _, err := o.Allocate(dead, 2); err != nil {            // WRITING
		t.Fatal(err)
	}
	pub := writeBlock(t, o, dead, BlockKey{2}, BlockKey{}, 2, true)
	if _, err := o.Acquire(live, []BlockKey{{2}}); err != nil {
		t.Fatal(err)
	}
	env.clock.Advance(2 * time.Second)
	o.KeepAlive(live)
	env.clock.Advance(2 * time.Second) // dead's lease is over, live's is not
	res := o.Sweep()
	if res.SessionsExpired != 1 || res.OrphansReclaimed != 3 {
		t.Fatalf("sweep: %+v", res)
	}
	st := o.Stats()
	if st.SlotsInUse != 1 || st.ByState["PUBLISHED"] != 1 {
		t.Fatalf("after sweep: %+v", st)
	}
	// Above the high-water mark only unleased published blocks go, LRU first.
	var unleased []Ref
	for i := 0; i < 6; i++ {
		r := writeBlock(t, o, live, BlockKey{byte(10 + i)}, BlockKey{}, byte(i), true)
		o.Release(live, r)
		unleased = append(unleased, r)
		env.clock.Advance(time.Millisecond)
	}
	o.KeepAlive(live)
	res = o.Sweep() // 7 in use of 8, high water 6
	if res.Evicted != 1 || o.Lookup([]BlockKey{{10}}) != 0 || o.Lookup([]BlockKey{{11}}) != 1 {
		t.Fatalf("eviction: %+v; oldest should go first", res)
	}
	if o.Lookup([]BlockKey{{2}}) != 1 {
		t.Fatal("leased block was evicted")
	}
	// Allocation under pressure evicts too, but never the leased block.
	if _, err := o.Allocate(live, 3); err != nil {
		t.Fatal(err)
	}
	if o.Lookup([]BlockKey{{2}}) != 1 {
		t.Fatal("leased block was evicted by allocation")
	}
	if _, err := o.Allocate(live, 5); !errors.Is(err, ErrNoFreeSlots) {
		t.Fatalf("over-allocation: %v", err)
	}
	_ = pub
}

func TestWriterDeadReclaimsAtOnce(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 4)
	o := env.open(t)
	defer o.Close()
	sid := hello(t, o, "decode-3", 7)
	o.Allocate(sid, 2)
	writeBlock(t, o, sid, BlockKey{1}, BlockKey{}, 1, false)
	if n := o.WriterDead(Writer{Instance: "decode-3", Gen: 6}); n != 0 {
		t.Fatalf("an older generation's death reclaimed %d blocks", n)
	}
	if n := o.WriterDead(Writer{Instance: "decode-3", Gen: 7}); n != 3 {
		t.Fatalf("reclaimed %d, want 3", n)
	}
	if st := o.Stats(); st.SlotsInUse != 0 {
		t.Fatalf("slots leaked: %+v", st)
	}
}

func TestRestartVerifiesPublished(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 8)
	o := env.open(t)
	sid := hello(t, o, "w", 1)
	good := writeBlock(t, o, sid, BlockKey{1}, BlockKey{}, 1, true)
	corrupt := writeBlock(t, o, sid, BlockKey{2}, BlockKey{}, 2, true)
	sealed := writeBlock(t, o, sid, BlockKey{3}, BlockKey{}, 3, false)
	o.Arena().Payload(int(corrupt.Slot))[3] ^= 1
	o.Close()

	o = env.open(t)
	defer o.Close()
	st := o.Stats()
	if st.RecoveredAtStart != 1 || st.DroppedAtStartup != 1 {
		t.Fatalf("restart: %+v", st)
	}
	if o.Lookup([]BlockKey{{1}}) != 1 || o.Lookup([]BlockKey{{2}}) != 0 || o.Lookup([]BlockKey{{3}}) != 0 {
		t.Fatal("restart kept the wrong blocks readable")
	}
	// The sealed block's writer re-attaches within the grace and publishes.
	sid2, ok, _, err := o.Hello(Writer{Instance: "w", Gen: 1}, []Ref{sealed, {Slot: good.Slot, Gen: good.Gen}}, nil)
	if err != nil || !ok[0] || ok[1] {
		t.Fatalf("re-attach: %v %v", ok, err)
	}
	if err := o.Publish(sid2, sealed); err != nil {
		t.Fatal(err)
	}
	// Generations stay monotonic across the restart.
	refs, _ := o.Allocate(sid2, 1)
	if refs[0].Slot == corrupt.Slot && refs[0].Gen <= corrupt.Gen {
		t.Fatalf("reused slot %d at generation %d after %d", refs[0].Slot, refs[0].Gen, corrupt.Gen)
	}
}

func TestRestartReclaimsUnclaimedAfterGrace(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 4)
	o := env.open(t)
	sid := hello(t, o, "w", 1)
	o.Allocate(sid, 2)
	o.Close()
	o = env.open(t)
	defer o.Close()
	if res := o.Sweep(); res.OrphansReclaimed != 0 {
		t.Fatalf("reclaimed during grace: %+v", res)
	}
	env.clock.Advance(o.LeaseTTL())
	if res := o.Sweep(); res.OrphansReclaimed != 2 {
		t.Fatalf("after grace: %+v", res)
	}
	if o.Stats().SlotsInUse != 0 {
		t.Fatal("slots leaked")
	}
}

func FuzzDecodeManifest(f *testing.F) {
	m := Manifest{Slot: 3, SlotGen: 9, State: Published, Key: BlockKey{1, 2}, PayloadLen: 100, Checksum: 5, WriterInstance: "decode-1", WriterGen: 2, Updated: time.Unix(5, 0)}
	f.Add(m.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			if !errors.Is(err, ErrBadManifest) {
				t.Fatalf("error %v does not wrap ErrBadManifest", err)
			}
			return
		}
		if string(m.Encode()) != string(b) {
			t.Fatal("decoded manifest re-encodes differently")
		}
	})
}

// TestRetriedPublishKeepsLease: the reply of a publish is lost, the writer
// reconnects (new session) and retries: the retry succeeds and the new
// session holds the lease, so the block cannot be evicted under it.
func TestRetriedPublishKeepsLease(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 4)
	o := env.open(t)
	defer o.Close()
	old := hello(t, o, "w", 1)
	r := writeBlock(t, o, old, BlockKey{1}, BlockKey{}, 1, false)
	if err := o.Publish(old, r); err != nil { // applied, reply lost
		t.Fatal(err)
	}
	fresh, _, leased, err := o.Hello(Writer{Instance: "w", Gen: 1}, nil, nil)
	if err != nil || len(leased) != 0 {
		t.Fatal(err)
	}
	if err := o.Publish(fresh, r); err != nil {
		t.Fatalf("retried publish on a new session: %v", err)
	}
	env.clock.Advance(2 * time.Second)
	if err := o.KeepAlive(fresh); err != nil {
		t.Fatal(err)
	}
	env.clock.Advance(2 * time.Second) // the old session is past its lease
	if res := o.Sweep(); res.SessionsExpired != 1 {
		t.Fatalf("sweep: %+v", res)
	}
	if _, err := o.Allocate(fresh, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Allocate(fresh, 1); !errors.Is(err, ErrNoFreeSlots) || o.Lookup([]BlockKey{{1}}) != 1 {
		t.Fatalf("leased block evicted: %v, lookup %d", err, o.Lookup([]BlockKey{{1}}))
	}
}

// TestRestartCompletesHalfWrittenHeader: the owner died between writing a
// PUBLISHED manifest and the header (left SEALED): the restart keeps the
// block published. A header that fails its checksum keeps its generation:
// the next allocation of that slot is higher than any handed out before.
func TestRestartCompletesHalfWrittenHeader(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 2)
	o := env.open(t)
	sid := hello(t, o, "w", 1)
	r := writeBlock(t, o, sid, BlockKey{1}, BlockKey{}, 1, true)
	h, _ := o.Arena().Header(int(r.Slot))
	h.State = Sealed
	o.Arena().SetHeader(int(r.Slot), h)
	// Slot 1 goes through five generations, then its header is torn.
	other := 1 - r.Slot
	var last Ref
	for i := 0; i < 5; i++ {
		refs, err := o.Allocate(sid, 1)
		if err != nil || refs[0].Slot != other {
			t.Fatalf("allocate: %v %v", refs, err)
		}
		last = refs[0]
		o.Abort(sid, refs[0])
	}
	o.Close()
	a, err := shm.Open(env.opts.ArenaPath)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := a.Header(int(other))
	hb.WriterInstance = "torn"
	a.SetHeader(int(other), hb)
	a.Close()
	corruptHeaderByte(t, env.opts.ArenaPath, int(other), 40)

	o = env.open(t)
	defer o.Close()
	if o.Lookup([]BlockKey{{1}}) != 1 || o.Arena().State(int(r.Slot)) != Published {
		t.Fatal("a publish whose header write was lost did not survive the restart")
	}
	// The torn slot is quarantined until the grace ends, then reused above
	// its old generation.
	sid = hello(t, o, "w", 2)
	if _, err := o.Allocate(sid, 1); !errors.Is(err, ErrNoFreeSlots) {
		t.Fatalf("torn slot reused during the grace: %v", err)
	}
	env.clock.Advance(o.LeaseTTL())
	o.KeepAlive(sid)
	o.Sweep()
	sid = hello(t, o, "w", 3)
	refs, err := o.Allocate(sid, 1)
	if err != nil || refs[0].Gen <= last.Gen {
		t.Fatalf("after a torn header: %v %v, last generation was %d", refs, err, last.Gen)
	}
}

// corruptHeaderByte flips one byte of a slot header through the file; the
// header region starts one page into the arena.
func corruptHeaderByte(t *testing.T, path string, slot, off int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pos := int64(4096 + shm.SlotHeaderSize*slot + off)
	b := make([]byte, 1)
	f.ReadAt(b, pos)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, pos); err != nil {
		t.Fatal(err)
	}
}

// TestCorruptStoresAreMovedAside: a manifest store Badger cannot open and
// an arena file with a bad header are moved aside; the owner starts empty
// instead of refusing to start.
func TestCorruptStoresAreMovedAside(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 4)
	o := env.open(t)
	sid := hello(t, o, "w", 1)
	writeBlock(t, o, sid, BlockKey{1}, BlockKey{}, 1, true)
	o.Close()
	// Scribble on every file Badger keeps, and on the arena's magic.
	entries, _ := os.ReadDir(env.opts.DBDir)
	for _, e := range entries {
		p := filepath.Join(env.opts.DBDir, e.Name())
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			for i := range b {
				b[i] ^= 0x5a
			}
			os.WriteFile(p, b, 0o600)
		}
	}
	f, _ := os.OpenFile(env.opts.ArenaPath, os.O_RDWR, 0)
	f.WriteAt([]byte("XXXX"), 0)
	f.Close()

	o = env.open(t)
	defer o.Close()
	st := o.Stats()
	if len(st.Quarantined) != 2 || st.SlotsInUse != 0 || o.Lookup([]BlockKey{{1}}) != 0 {
		t.Fatalf("after corruption: %+v", st)
	}
	for _, q := range st.Quarantined {
		if _, err := os.Stat(q); err != nil {
			t.Errorf("quarantined %s is gone: %v", q, err)
		}
		t.Cleanup(func() { os.RemoveAll(q) })
	}
	sid = hello(t, o, "w", 2)
	writeBlock(t, o, sid, BlockKey{2}, BlockKey{}, 2, true)
}

func TestLongInstanceIDs(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 2)
	o := env.open(t)
	defer o.Close()
	long := "gpu-node-0001.rack-17-decode-small-3"
	sid := hello(t, o, long, 9)
	r := writeBlock(t, o, sid, BlockKey{1}, BlockKey{}, 1, false)
	h, err := o.Arena().Header(int(r.Slot))
	if err != nil || h.WriterInstance != shm.HeaderInstanceID(long) || len(h.WriterInstance) > shm.MaxInstanceID {
		t.Fatalf("header %+v %v", h, err)
	}
	if n := o.WriterDead(Writer{Instance: long, Gen: 9}); n != 1 {
		t.Fatalf("writer-dead with the long id reclaimed %d", n)
	}
	if _, _, _, err := o.Hello(Writer{Instance: strings.Repeat("x", 300), Gen: 1}, nil, nil); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("300-byte id: %v", err)
	}
}

func TestListShowsNonFreeSlots(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 4)
	o := env.open(t)
	defer o.Close()
	sid := hello(t, o, "w", 3)
	writeBlock(t, o, sid, BlockKey{7}, BlockKey{}, 1, true)
	o.Allocate(sid, 1)
	ls := o.List()
	if len(ls) != 2 || ls[0].State != "PUBLISHED" && ls[1].State != "PUBLISHED" {
		t.Fatalf("list %+v", ls)
	}
	for _, s := range ls {
		if s.Writer != "w@3" || s.Generation == 0 {
			t.Fatalf("slot %+v", s)
		}
	}
}

// TestSealPublishBatch: a batch is checked whole before anything is
// written (one bad checksum publishes nothing), a key already published
// is skipped and reported, and the published blocks survive a restart.
func TestSealPublishBatch(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 8)
	o := env.open(t)
	sid := hello(t, o, "transfer/decode-0", 3)
	keys := testID.Chain([]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, -1)
	parents := []BlockKey{{}, keys[0], keys[1]}
	fill := func() []Ref {
		refs, err := o.Allocate(sid, 3)
		if err != nil {
			t.Fatal(err)
		}
		for i := range refs {
			p := o.Arena().Payload(int(refs[i].Slot))[:64]
			for j := range p {
				p[j] = byte(i + j)
			}
			refs[i].PayloadLen, refs[i].Checksum = 64, shm.Checksum(p)
		}
		return refs
	}
	refs := fill()
	refs[2].Checksum ^= 1
	if _, err := o.SealPublish(sid, refs, keys, parents, false); !errors.Is(err, ErrChecksum) || o.Lookup(keys) != 0 {
		t.Fatalf("bad checksum in the batch: %v, %d published", err, o.Lookup(keys))
	}
	refs[2].Checksum ^= 1
	// Someone published the first key meanwhile.
	other := hello(t, o, "decode-0", 3)
	writeBlock(t, o, other, keys[0], BlockKey{}, 9, true)
	dup, err := o.SealPublish(sid, refs, keys, parents, false)
	if err != nil || !dup[0] || dup[1] || dup[2] || o.Lookup(keys) != 3 {
		t.Fatalf("batch: dup %v, err %v, %d published", dup, err, o.Lookup(keys))
	}
	if err := o.Abort(sid, refs[0]); err != nil {
		t.Fatalf("the skipped duplicate is not abortable: %v", err)
	}
	o.Close()
	o = env.open(t)
	defer o.Close()
	if o.Lookup(keys) != 3 || o.Stats().RecoveredAtStart != 3 {
		t.Fatalf("after a restart: %d published, %+v", o.Lookup(keys), o.Stats())
	}
}

// TestSweeperFencesWritersFirst: an expired session's slots are reclaimed
// only once Fence said its writer can write no more; while Fence says it
// cannot, the slots stay WRITING/SEALED under the session (no other writer
// gets them), and a later sweep reclaims them once it can.
func TestSweeperFencesWritersFirst(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 8)
	var fenced []Writer
	canFence := false
	env.opts.Fence = func(w Writer) bool {
		fenced = append(fenced, w)
		return canFence
	}
	o := env.open(t)
	defer o.Close()
	env.clock.Advance(o.LeaseTTL()) // past the start-up grace
	stuck := hello(t, o, "stuck", 4)
	writeBlock(t, o, stuck, BlockKey{1}, BlockKey{}, 1, false) // SEALED
	if _, err := o.Allocate(stuck, 2); err != nil {            // WRITING
		t.Fatal(err)
	}
	env.clock.Advance(o.LeaseTTL() + time.Second)
	if res := o.Sweep(); res.SessionsExpired != 0 || res.OrphansReclaimed != 0 {
		t.Fatalf("a writer that could not be fenced lost its slots: %+v", res)
	}
	if st := o.Stats(); st.SlotsInUse != 3 || st.Sessions != 1 || len(fenced) != 1 || fenced[0] != (Writer{Instance: "stuck", Gen: 4}) {
		t.Fatalf("after an unfenced sweep: %+v, fenced %v", st, fenced)
	}
	// A new writer gets other slots, never the stuck writer's.
	other := hello(t, o, "other", 1)
	refs, err := o.Allocate(other, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Allocate(other, 1); err == nil {
		t.Fatalf("the stuck writer's slots were handed out: %+v", refs)
	}
	canFence = true
	if res := o.Sweep(); res.SessionsExpired != 1 || res.OrphansReclaimed != 3 {
		t.Fatalf("once fenced: %+v", res)
	}
	// A writer that left a session for a new one (its client could not
	// renew and said hello again) is not fenced for the old one.
	canFence, fenced = false, nil
	old := hello(t, o, "again", 2)
	if _, err := o.Allocate(old, 1); err != nil {
		t.Fatal(err)
	}
	renewed := hello(t, o, "again", 2)
	expired := 0
	for range 4 { // sweeps a second apart: no owner stall to make up for
		env.clock.Advance(time.Second)
		o.KeepAlive(other)
		o.KeepAlive(renewed)
		expired += o.Sweep().SessionsExpired
	}
	if expired != 1 || len(fenced) != 0 {
		t.Fatalf("an abandoned session of a live writer: %d expired, fenced %v", expired, fenced)
	}
}

// TestEndReplacedEndsOnlyTheWritersOwnSession: a hello that names the
// session it replaces ends that one, with its leases and the blocks it
// still writes; a session of another writer, or the new one itself, is
// left alone, so that a writer cannot end anyone else's.
func TestEndReplacedEndsOnlyTheWritersOwnSession(t *testing.T) {
	t.Parallel()
	o := newOwnerEnv(t, 8).open(t)
	w := Writer{Instance: "w", Gen: 1}
	old := hello(t, o, "w", 1)
	pub := writeBlock(t, o, old, BlockKey{1}, BlockKey{}, 1, true)
	writing, err := o.Allocate(old, 1)
	if err != nil {
		t.Fatal(err)
	}
	other := hello(t, o, "x", 1)
	if _, err := o.Acquire(other, []BlockKey{{1}}); err != nil {
		t.Fatal(err)
	}
	sid, _, _, err := o.Hello(w, nil, []Ref{pub})
	if err != nil {
		t.Fatal(err)
	}
	if o.EndReplaced(w, sid, other) || o.EndReplaced(w, sid, sid) || o.EndReplaced(Writer{Instance: "w", Gen: 2}, sid, old) {
		t.Fatal("ended a session of another writer, or the new one itself")
	}
	if !o.EndReplaced(w, sid, old) {
		t.Fatal("the writer's own old session not ended")
	}
	if o.EndReplaced(w, sid, old) {
		t.Fatal("ended twice")
	}
	st := o.Stats()
	if st.Sessions != 2 || st.SessionsReplaced != 1 || st.Leases != 2 {
		t.Fatalf("after the replacement: %d sessions, %d replaced, %d leases (want 2, 1, 2: the new session's and the other writer's)", st.Sessions, st.SessionsReplaced, st.Leases)
	}
	if slotState(o, writing[0].Slot) != Free {
		t.Fatal("the block the old session still wrote was not freed")
	}
	if _, err := o.Acquire(old, []BlockKey{{1}}); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("acquire under the ended session: %v", err)
	}
}
