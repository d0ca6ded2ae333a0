package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/internal/failpoint"
	"github.com/lifeline-llm/lifeline/shm"
)

// MaxInstanceID bounds a writer's instance id (the manifest stores its
// length in one byte).
const MaxInstanceID = 255

// FailOwnerAfterPublishManifest is hit in the owner between the PUBLISHED
// manifest write and the header write.
const FailOwnerAfterPublishManifest = "kv.owner.after-publish-manifest"

var (
	// ErrStaleRef is returned for a (slot, generation) reference whose slot
	// has been reused since: the block it named is gone.
	ErrStaleRef = errors.New("kv: stale block reference")
	// ErrNotOwner is returned when a session changes a block it does not write.
	ErrNotOwner = errors.New("kv: block belongs to another writer")
	// ErrChecksum is returned when a payload does not match its checksum.
	ErrChecksum = errors.New("kv: payload checksum mismatch")
	// ErrDuplicate is returned when publishing a key that is already published.
	ErrDuplicate = errors.New("kv: block key already published")
	// ErrNoFreeSlots is returned when every slot is in use or leased.
	ErrNoFreeSlots = errors.New("kv: no free slots")
	// ErrLeased is returned by Delete for a block that holds a live lease.
	ErrLeased = errors.New("kv: block is leased")
	// ErrUnknownSession is returned for a session that expired or never existed.
	ErrUnknownSession = errors.New("kv: unknown or expired session")
	// ErrBadRequest is wrapped by errors about malformed arguments.
	ErrBadRequest = errors.New("kv: bad request")
)

// Writer is a worker instance at one generation.
type Writer struct {
	Instance string
	Gen      uint64
}

func (w Writer) String() string { return fmt.Sprintf("%s@%d", w.Instance, w.Gen) }

// Ref names one block: a slot at one generation. Checksum and PayloadLen
// let a reader verify the bytes it maps.
type Ref struct {
	Slot       uint32
	Gen        uint64
	Checksum   uint32
	PayloadLen uint32
}

// SessionID names a connected writer's session; leases and WRITING blocks
// belong to a session and die with it.
type SessionID uint64

// Options configure an Owner.
type Options struct {
	ArenaPath string
	Geometry  shm.Geometry
	DBDir     string
	// LeaseTTL is how long a session lives without a keepalive (default 3s).
	LeaseTTL time.Duration
	// HighWater is the fraction of slots in use above which the sweeper
	// evicts unleased published blocks, least recently used first
	// (default 0.9).
	HighWater float64
	// Now is the clock (default time.Now); tests inject one.
	Now func() time.Time
}

// Stats counts slots by state and what the owner refused or reclaimed.
type Stats struct {
	Slots      int
	ByState    map[string]int
	Sessions   int
	Leases     int
	SlotsInUse int

	StaleRejects      uint64 // reads or changes through a stale reference
	StaleDeletes      uint64 // compare-and-deletes refused for a stale generation
	ChecksumFailures  uint64 // seals or reads whose payload did not verify
	CorruptDropped    uint64 // published blocks dropped for a bad payload
	OrphansReclaimed  uint64 // WRITING/SEALED/ALLOCATED blocks of dead or expired writers
	Evicted           uint64 // unleased published blocks evicted under pressure
	DroppedAtStartup  uint64 // manifests that did not verify when the owner started
	RecoveredAtStart  uint64 // published manifests that verified when the owner started
	DuplicatePublish  uint64
	SessionsExpired   uint64
	WritersReportDead uint64
	// Quarantined lists an arena file or manifest directory that could not
	// be opened at start-up and was moved aside (the owner started empty).
	Quarantined []string
}

type slot struct {
	gen        uint64
	state      State
	key        BlockKey
	parent     BlockKey
	writer     Writer
	session    SessionID // writer's session while WRITING/SEALED; 0 if recovered
	payloadLen uint32
	checksum   uint32
	leases     map[SessionID]struct{}
	lastUsed   time.Time
}

type session struct {
	id      SessionID
	writer  Writer
	expires time.Time
	owned   map[uint32]struct{} // WRITING/SEALED slots
	leased  map[uint32]struct{} // published slots it holds
}

// Owner is the arena owner: the only process that changes slot headers and
// manifests. Its methods are safe for concurrent use.
type Owner struct {
	opts  Options
	arena *shm.Arena
	db    *badger.DB

	mu         sync.Mutex
	slots      []slot
	free       []uint32
	byKey      map[BlockKey]uint32
	sessions   map[SessionID]*session
	graceUntil time.Time
	lastSweep  time.Time
	stats      Stats
}

func manifestKey(slot uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte("s/"), slot)
}

// Open starts an owner on the arena and manifest store, creating them when
// they do not exist. On a restart it keeps exactly the published blocks
// whose slot header and payload checksum verify against their manifests;
// other published manifests are dropped. Blocks that were being written are
// kept unreadable for one lease TTL so that a live writer can re-attach
// (see Hello); after that the sweeper reclaims them.
func Open(opts Options) (*Owner, error) {
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 3 * time.Second
	}
	if opts.HighWater == 0 {
		opts.HighWater = 0.9
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	switch {
	case opts.ArenaPath == "":
		return nil, fmt.Errorf("%w: arena path is empty", ErrBadRequest)
	case opts.DBDir == "":
		return nil, fmt.Errorf("%w: manifest directory is empty", ErrBadRequest)
	case opts.LeaseTTL < 0 || opts.HighWater <= 0 || opts.HighWater > 1:
		return nil, fmt.Errorf("%w: lease TTL %v, high water %v", ErrBadRequest, opts.LeaseTTL, opts.HighWater)
	}
	// KV is derived state: an arena or manifest store that cannot be
	// opened is moved aside and the owner starts empty, rather than refuse
	// to start and take the node's reuse (and its writers) down with it.
	var quarantined []string
	arena, _, err := shm.OpenOrCreate(opts.ArenaPath, opts.Geometry)
	if errors.Is(err, shm.ErrBadArena) {
		aside, rerr := quarantine(opts.ArenaPath)
		if rerr != nil {
			return nil, fmt.Errorf("%w (and moving it aside failed: %v)", err, rerr)
		}
		quarantined = append(quarantined, aside)
		arena, _, err = shm.OpenOrCreate(opts.ArenaPath, opts.Geometry)
	}
	if err != nil {
		return nil, err
	}
	bopts := badger.DefaultOptions(opts.DBDir).
		WithLogger(nil).
		WithMemTableSize(8 << 20).
		WithValueLogFileSize(16 << 20).
		WithBlockCacheSize(8 << 20).
		WithIndexCacheSize(8 << 20).
		WithNumVersionsToKeep(1)
	db, err := badger.Open(bopts)
	if err != nil {
		aside, rerr := quarantine(opts.DBDir)
		if rerr == nil {
			quarantined = append(quarantined, aside)
			db, err = badger.Open(bopts)
		}
	}
	if err != nil {
		arena.Close()
		return nil, fmt.Errorf("kv: open manifests %s: %w", opts.DBDir, err)
	}
	o := &Owner{
		opts: opts, arena: arena, db: db,
		slots:    make([]slot, opts.Geometry.Slots),
		byKey:    make(map[BlockKey]uint32),
		sessions: make(map[SessionID]*session),
	}
	o.stats.Quarantined = quarantined
	if err := o.recover(); err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

// quarantine renames path aside (path.corrupt-<unix nanos>) for a person to
// look at, and returns the new name.
func quarantine(path string) (string, error) {
	aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().UnixNano())
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, nil
}

// Close releases the arena mapping and the manifest store. The arena file
// stays: workers keep using it, and the next owner re-opens it.
func (o *Owner) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	err := o.db.Close()
	if e := o.arena.Close(); err == nil {
		err = e
	}
	return err
}

// StartGrace restarts the start-up grace: Serve calls it once its socket
// accepts connections, so that a large arena's recovery scan does not eat
// the time workers have to re-attach.
func (o *Owner) StartGrace() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.graceUntil = o.opts.Now().Add(o.opts.LeaseTTL)
}

// Arena is the owner's mapping (for tests and benchmarks).
func (o *Owner) Arena() *shm.Arena { return o.arena }

// LeaseTTL is the session lease duration.
func (o *Owner) LeaseTTL() time.Duration { return o.opts.LeaseTTL }

func (o *Owner) recover() error {
	manifests := map[uint32]Manifest{}
	var bad [][]byte
	err := o.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("s/")})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			m, err := DecodeManifest(v)
			if err != nil || int(m.Slot) >= len(o.slots) || !slices.Equal(item.Key(), manifestKey(m.Slot)) {
				bad = append(bad, item.KeyCopy(nil))
				continue
			}
			manifests[m.Slot] = m
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kv: read manifests: %w", err)
	}
	now := o.opts.Now()
	o.graceUntil = now.Add(o.opts.LeaseTTL)
	var quarantine []uint32
	for i := range o.slots {
		s := &o.slots[i]
		h, herr := o.arena.Header(i)
		// The generation is read even from a header that fails its
		// checksum: SetHeader stores it last, so a torn header still holds
		// the highest generation ever handed out for the slot.
		s.gen = o.arena.Gen(i)
		m, ok := manifests[uint32(i)]
		if ok {
			s.gen = max(s.gen, m.SlotGen)
		}
		if !ok {
			if herr == nil && h.State == Free {
				o.resetSlot(uint32(i), true)
			} else {
				// Possibly in a live writer's hands (ALLOCATED, or a header
				// we cannot read): out of use until the grace ends.
				quarantine = append(quarantine, uint32(i))
			}
			continue
		}
		keep := false
		// The manifest is written before the header, so a crash between the
		// two leaves the header one state behind at the same generation.
		headerOK := herr == nil && h.Gen == m.SlotGen && (h.State == m.State ||
			(m.State == Published && h.State == Sealed) || (m.State == Sealed && h.State == Writing) ||
			(m.State == Writing && h.State == Allocated))
		switch m.State {
		case Published:
			_, dup := o.byKey[m.Key]
			keep = headerOK && !dup && o.payloadVerifies(uint32(i), m.PayloadLen, m.Checksum)
			if keep {
				o.stats.RecoveredAtStart++
				o.byKey[m.Key] = uint32(i)
			}
		case Writing, Sealed:
			// Possibly a live writer's block: unreadable, reclaimable after grace.
			keep = headerOK
		}
		if !keep {
			o.stats.DroppedAtStartup++
			bad = append(bad, manifestKey(uint32(i)))
			quarantine = append(quarantine, uint32(i))
			continue
		}
		*s = slot{gen: m.SlotGen, state: m.State, key: m.Key, parent: m.Parent, writer: Writer{m.WriterInstance, m.WriterGen},
			payloadLen: m.PayloadLen, checksum: m.Checksum, lastUsed: m.Updated}
		if err := o.setHeader(uint32(i)); err != nil {
			return err
		}
	}
	// Dropped and unreadable slots may still be in a live writer's hands:
	// they return to the pool only after the grace (see Sweep).
	for _, i := range quarantine {
		s := &o.slots[i]
		*s = slot{gen: s.gen, state: Aborted}
		if err := o.setHeader(i); err != nil {
			return err
		}
	}
	if len(bad) > 0 {
		wb := o.db.NewWriteBatch()
		for _, k := range bad {
			wb.Delete(k)
		}
		if err := wb.Flush(); err != nil {
			return fmt.Errorf("kv: drop bad manifests: %w", err)
		}
	}
	return nil
}

func (o *Owner) payloadVerifies(slot, n, sum uint32) bool {
	got, err := o.arena.PayloadChecksum(int(slot), int(n))
	return err == nil && got == sum
}

// resetSlot marks a slot free in memory and in its header. Its generation
// is kept; the next allocation bumps it, fencing every old reference.
func (o *Owner) resetSlot(i uint32, headerAlreadyFree bool) {
	s := &o.slots[i]
	if s.key != (BlockKey{}) && o.byKey[s.key] == i && s.state == Published {
		delete(o.byKey, s.key)
	}
	*s = slot{gen: s.gen, state: Free}
	if !headerAlreadyFree {
		o.arena.SetHeader(int(i), shm.SlotHeader{Gen: s.gen, State: Free})
	}
	o.free = append(o.free, i)
}

func (o *Owner) manifestOf(i uint32, now time.Time) *Manifest {
	s := &o.slots[i]
	return &Manifest{Slot: i, SlotGen: s.gen, State: s.state, Key: s.key, Parent: s.parent, PayloadLen: s.payloadLen,
		Checksum: s.checksum, WriterInstance: s.writer.Instance, WriterGen: s.writer.Gen, Updated: now}
}

func (o *Owner) persist(i uint32) error {
	m := o.manifestOf(i, o.opts.Now())
	return o.db.Update(func(txn *badger.Txn) error { return txn.Set(manifestKey(i), m.Encode()) })
}

func (o *Owner) setHeader(i uint32) error {
	s := &o.slots[i]
	if err := o.arena.SetHeader(int(i), shm.SlotHeader{Gen: s.gen, State: s.state, PayloadLen: s.payloadLen, Checksum: s.checksum,
		WriterGen: s.writer.Gen, WriterInstance: shm.HeaderInstanceID(s.writer.Instance)}); err != nil {
		return fmt.Errorf("kv: slot %d header: %w", i, err)
	}
	return nil
}

// freeSlot deletes a block's manifest and returns its slot to the pool.
func (o *Owner) freeSlot(i uint32) error {
	s := &o.slots[i]
	for sid := range s.leases {
		if ss := o.sessions[sid]; ss != nil {
			delete(ss.leased, i)
		}
	}
	if ss := o.sessions[s.session]; ss != nil {
		delete(ss.owned, i)
	}
	err := o.db.Update(func(txn *badger.Txn) error { return txn.Delete(manifestKey(i)) })
	o.resetSlot(i, false)
	return err
}

func (o *Owner) sessionLocked(sid SessionID) (*session, error) {
	s := o.sessions[sid]
	if s == nil || !o.opts.Now().Before(s.expires) {
		return nil, fmt.Errorf("%w: %d", ErrUnknownSession, sid)
	}
	return s, nil
}

// Hello opens a session for writer. owned lists WRITING/SEALED blocks the
// writer had before (its previous session, or the previous owner process),
// leased the published blocks it still reads; each is re-attached if the
// reference still names the same block, and the answers say which were.
func (o *Owner) Hello(w Writer, owned, leased []Ref) (SessionID, []bool, []bool, error) {
	if w.Instance == "" || len(w.Instance) > MaxInstanceID || strings.IndexByte(w.Instance, 0) >= 0 {
		return 0, nil, nil, fmt.Errorf("%w: writer instance id %q (1..%d bytes, no NUL)", ErrBadRequest, w.Instance, MaxInstanceID)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	sid := SessionID(rand.Uint64() | 1)
	s := &session{id: sid, writer: w, expires: o.opts.Now().Add(o.opts.LeaseTTL), owned: map[uint32]struct{}{}, leased: map[uint32]struct{}{}}
	o.sessions[sid] = s
	ownedOK := make([]bool, len(owned))
	for i, r := range owned {
		if !o.refLive(r) {
			continue
		}
		sl := &o.slots[r.Slot]
		if (sl.state != Writing && sl.state != Sealed) || sl.writer != w {
			continue
		}
		if old := o.sessions[sl.session]; old != nil {
			delete(old.owned, r.Slot)
		}
		sl.session = sid
		s.owned[r.Slot] = struct{}{}
		ownedOK[i] = true
	}
	leasedOK := make([]bool, len(leased))
	for i, r := range leased {
		if o.refLive(r) && o.slots[r.Slot].state == Published {
			o.leaseLocked(s, r.Slot)
			leasedOK[i] = true
		}
	}
	return sid, ownedOK, leasedOK, nil
}

func (o *Owner) refLive(r Ref) bool {
	return int(r.Slot) < len(o.slots) && o.slots[r.Slot].gen == r.Gen && o.slots[r.Slot].state != Free
}

func (o *Owner) leaseLocked(s *session, i uint32) {
	sl := &o.slots[i]
	if sl.leases == nil {
		sl.leases = map[SessionID]struct{}{}
	}
	sl.leases[s.id] = struct{}{}
	s.leased[i] = struct{}{}
	sl.lastUsed = o.opts.Now()
}

// KeepAlive renews a session's lease.
func (o *Owner) KeepAlive(sid SessionID) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return err
	}
	s.expires = o.opts.Now().Add(o.opts.LeaseTTL)
	return nil
}

// Allocate hands the session n slots in WRITING state, each at a new
// generation. When no slot is free it evicts unleased published blocks,
// least recently used first; when none is evictable it fails with
// ErrNoFreeSlots and allocates nothing.
func (o *Owner) Allocate(sid SessionID, n int) ([]Ref, error) {
	if n <= 0 || n > len(o.slots) {
		return nil, fmt.Errorf("%w: allocate %d slots", ErrBadRequest, n)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return nil, err
	}
	if len(o.free) < n {
		o.evictLocked(n - len(o.free))
	}
	if len(o.free) < n {
		return nil, fmt.Errorf("%w: need %d, %d free", ErrNoFreeSlots, n, len(o.free))
	}
	// Bump every generation in the headers first (ALLOCATED fences old
	// references at once), then persist all manifests in one batch, then
	// mark the headers WRITING. A crash in between leaves ALLOCATED headers
	// without manifests, which a restart frees at the bumped generation.
	taken := o.free[len(o.free)-n:]
	o.free = o.free[:len(o.free)-n]
	undo := func() {
		for _, i := range taken {
			o.resetSlot(i, false)
		}
	}
	wb := o.db.NewWriteBatch()
	defer wb.Cancel()
	now := o.opts.Now()
	for _, i := range taken {
		sl := &o.slots[i]
		sl.gen++
		sl.state, sl.writer, sl.session = Allocated, s.writer, sid
		if err := o.setHeader(i); err != nil {
			undo()
			return nil, err
		}
		sl.state = Writing
		wb.Set(manifestKey(i), o.manifestOf(i, now).Encode())
	}
	if err := wb.Flush(); err != nil {
		undo()
		return nil, fmt.Errorf("kv: persist allocation: %w", err)
	}
	refs := make([]Ref, 0, n)
	for _, i := range taken {
		if err := o.setHeader(i); err != nil {
			return nil, err
		}
		s.owned[i] = struct{}{}
		refs = append(refs, Ref{Slot: i, Gen: o.slots[i].gen})
	}
	return refs, nil
}

// ownedLocked checks that r names a live block the session writes.
func (o *Owner) ownedLocked(sid SessionID, r Ref) (*slot, error) {
	if _, err := o.sessionLocked(sid); err != nil {
		return nil, err
	}
	if int(r.Slot) >= len(o.slots) {
		return nil, fmt.Errorf("%w: slot %d", ErrBadRequest, r.Slot)
	}
	sl := &o.slots[r.Slot]
	if sl.gen != r.Gen {
		o.stats.StaleRejects++
		return nil, fmt.Errorf("%w: slot %d is at generation %d, not %d", ErrStaleRef, r.Slot, sl.gen, r.Gen)
	}
	if sl.session != sid || (sl.state != Writing && sl.state != Sealed) {
		return nil, fmt.Errorf("%w: slot %d (%s)", ErrNotOwner, r.Slot, sl.state)
	}
	return sl, nil
}

// Seal records a fully written block under its key. The owner checksums
// the payload in the arena itself; a mismatch with the writer's checksum
// fails the seal and leaves the block WRITING.
func (o *Owner) Seal(sid SessionID, r Ref, key, parent BlockKey) error {
	if int(r.PayloadLen) > o.opts.Geometry.PayloadSize || key.IsZero() {
		return fmt.Errorf("%w: seal of %d bytes, key %s", ErrBadRequest, r.PayloadLen, key)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	sl, err := o.ownedLocked(sid, r)
	if err != nil {
		return err
	}
	if sl.state == Sealed && sl.key == key && sl.parent == parent && sl.checksum == r.Checksum && sl.payloadLen == r.PayloadLen {
		return nil // a retry of a seal whose answer was lost
	}
	if err := Transition(sl.state, Sealed); err != nil {
		return err
	}
	if !o.payloadVerifies(r.Slot, r.PayloadLen, r.Checksum) {
		o.stats.ChecksumFailures++
		return fmt.Errorf("%w: sealing slot %d", ErrChecksum, r.Slot)
	}
	sl.state, sl.key, sl.parent, sl.payloadLen, sl.checksum = Sealed, key, parent, r.PayloadLen, r.Checksum
	if err := o.persist(r.Slot); err != nil {
		sl.state = Writing
		return fmt.Errorf("kv: persist seal: %w", err)
	}
	return o.setHeader(r.Slot)
}

// Publish makes a sealed block readable with one manifest write. The
// publishing session keeps a lease on it (its sequence still reads it).
func (o *Owner) Publish(sid SessionID, r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ok, err := o.republishedLocked(sid, r); ok || err != nil {
		return err
	}
	sl, err := o.ownedLocked(sid, r)
	if err != nil {
		return err
	}
	if err := Transition(sl.state, Published); err != nil {
		return err
	}
	if _, dup := o.byKey[sl.key]; dup {
		o.stats.DuplicatePublish++
		return fmt.Errorf("%w: %s", ErrDuplicate, sl.key)
	}
	sl.state = Published
	if err := o.persist(r.Slot); err != nil {
		sl.state = Sealed
		return fmt.Errorf("kv: persist publish: %w", err)
	}
	// A crash here leaves a PUBLISHED manifest over a SEALED header at the
	// same generation; a restarted owner completes the publish.
	failpoint.Hit(FailOwnerAfterPublishManifest)
	if err := o.setHeader(r.Slot); err != nil {
		return err
	}
	o.byKey[sl.key] = r.Slot
	s := o.sessions[sid]
	delete(s.owned, r.Slot)
	sl.session = 0
	o.leaseLocked(s, r.Slot)
	return nil
}

// SealPublish seals and publishes a batch of blocks the session wrote, in
// order, with one manifest batch write: the path for blocks that arrive
// whole (a KV transfer), where a separate seal and publish per block
// would cost two writes each. A block whose payload does not match its
// checksum fails the batch before anything is written; a block whose key
// is already published is skipped (left WRITING, for the caller to abort)
// and reported in dup. verified says the caller, in this process, has
// already checked every payload against its checksum (nobody else writes
// a session's WRITING slots): the owner then does not checksum the bytes
// a second time under its lock.
func (o *Owner) SealPublish(sid SessionID, refs []Ref, keys, parents []BlockKey, verified bool) (dup []bool, err error) {
	if len(keys) != len(refs) || len(parents) != len(refs) {
		return nil, fmt.Errorf("%w: %d refs, %d keys, %d parents", ErrBadRequest, len(refs), len(keys), len(parents))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return nil, err
	}
	dup = make([]bool, len(refs))
	seen := map[BlockKey]bool{}
	for i, r := range refs {
		if int(r.PayloadLen) > o.opts.Geometry.PayloadSize || keys[i].IsZero() {
			return nil, fmt.Errorf("%w: seal of %d bytes, key %s", ErrBadRequest, r.PayloadLen, keys[i])
		}
		sl, err := o.ownedLocked(sid, r)
		if err != nil {
			return nil, err
		}
		if sl.state != Writing {
			return nil, fmt.Errorf("%w: slot %d is %s", ErrBadRequest, r.Slot, sl.state)
		}
		if !verified && !o.payloadVerifies(r.Slot, r.PayloadLen, r.Checksum) {
			o.stats.ChecksumFailures++
			return nil, fmt.Errorf("%w: sealing slot %d", ErrChecksum, r.Slot)
		}
		if _, published := o.byKey[keys[i]]; published || seen[keys[i]] {
			o.stats.DuplicatePublish++
			dup[i] = true
		}
		seen[keys[i]] = true
	}
	wb := o.db.NewWriteBatch()
	defer wb.Cancel()
	now := o.opts.Now()
	for i, r := range refs {
		if dup[i] {
			continue
		}
		sl := &o.slots[r.Slot]
		sl.state, sl.key, sl.parent, sl.payloadLen, sl.checksum = Published, keys[i], parents[i], r.PayloadLen, r.Checksum
		wb.Set(manifestKey(r.Slot), o.manifestOf(r.Slot, now).Encode())
	}
	if err := wb.Flush(); err != nil {
		for i, r := range refs {
			if !dup[i] {
				o.slots[r.Slot].state = Writing
			}
		}
		return nil, fmt.Errorf("kv: persist publish: %w", err)
	}
	for i, r := range refs {
		if dup[i] {
			continue
		}
		if err := o.setHeader(r.Slot); err != nil {
			return nil, err
		}
		o.byKey[keys[i]] = r.Slot
		delete(s.owned, r.Slot)
		o.slots[r.Slot].session = 0
		o.leaseLocked(s, r.Slot)
	}
	return dup, nil
}

// republishedLocked answers a Publish retried after its reply was lost: the
// block is already PUBLISHED at the same generation by the same writer, so
// the retry succeeds and the (possibly new) session takes the lease.
func (o *Owner) republishedLocked(sid SessionID, r Ref) (bool, error) {
	s, err := o.sessionLocked(sid)
	if err != nil || int(r.Slot) >= len(o.slots) {
		return false, nil
	}
	sl := &o.slots[r.Slot]
	if sl.gen != r.Gen || sl.state != Published || sl.writer != s.writer || o.byKey[sl.key] != r.Slot {
		return false, nil
	}
	o.leaseLocked(s, r.Slot)
	return true, nil
}

// Abort discards a WRITING or SEALED block and frees its slot.
func (o *Owner) Abort(sid SessionID, r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	sl, err := o.ownedLocked(sid, r)
	if err != nil {
		return err
	}
	if err := Transition(sl.state, Aborted); err != nil {
		return err
	}
	sl.state = Aborted
	return o.freeSlot(r.Slot)
}

// Lookup returns how many leading keys are published, without leasing.
func (o *Owner) Lookup(keys []BlockKey) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, k := range keys {
		if _, ok := o.byKey[k]; !ok {
			break
		}
		n++
	}
	return n
}

// Acquire leases the published blocks of the longest published prefix of
// keys to the session and returns their references.
func (o *Owner) Acquire(sid SessionID, keys []BlockKey) ([]Ref, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return nil, err
	}
	var refs []Ref
	for _, k := range keys {
		i, ok := o.byKey[k]
		if !ok {
			break
		}
		sl := &o.slots[i]
		o.leaseLocked(s, i)
		refs = append(refs, Ref{Slot: i, Gen: sl.gen, Checksum: sl.checksum, PayloadLen: sl.payloadLen})
	}
	return refs, nil
}

// Release drops the session's lease on a published block.
func (o *Owner) Release(sid SessionID, r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return err
	}
	if int(r.Slot) >= len(o.slots) || o.slots[r.Slot].gen != r.Gen {
		o.stats.StaleRejects++
		return fmt.Errorf("%w: release slot %d gen %d", ErrStaleRef, r.Slot, r.Gen)
	}
	delete(o.slots[r.Slot].leases, sid)
	delete(s.leased, r.Slot)
	return nil
}

// Delete removes a published block by compare-and-delete on (slot,
// generation): a late delete from an old generation never removes the
// block that now lives in the slot. A leased block is not deleted.
func (o *Owner) Delete(r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if int(r.Slot) >= len(o.slots) {
		return fmt.Errorf("%w: slot %d", ErrBadRequest, r.Slot)
	}
	sl := &o.slots[r.Slot]
	if sl.gen != r.Gen || sl.state != Published {
		o.stats.StaleDeletes++
		return fmt.Errorf("%w: delete slot %d gen %d (slot is %s at %d)", ErrStaleRef, r.Slot, r.Gen, sl.state, sl.gen)
	}
	if len(sl.leases) > 0 {
		return fmt.Errorf("%w: slot %d has %d leases", ErrLeased, r.Slot, len(sl.leases))
	}
	return o.freeSlot(r.Slot)
}

// ReportCorrupt is how a reader says a published block did not verify. The
// owner checks the payload itself and drops the block if it is corrupt.
func (o *Owner) ReportCorrupt(r Ref) (dropped bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.refLive(r) || o.slots[r.Slot].state != Published {
		o.stats.StaleRejects++
		return false, fmt.Errorf("%w: slot %d gen %d", ErrStaleRef, r.Slot, r.Gen)
	}
	sl := &o.slots[r.Slot]
	if o.payloadVerifies(r.Slot, sl.payloadLen, sl.checksum) {
		return false, nil
	}
	o.stats.ChecksumFailures++
	o.stats.CorruptDropped++
	return true, o.freeSlot(r.Slot)
}

// WriterDead is how the agent reports that a writer's process died: its
// unpublished blocks are reclaimed and its leases released at once,
// without waiting for the lease to expire.
func (o *Owner) WriterDead(w Writer) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stats.WritersReportDead++
	n := 0
	for sid, s := range o.sessions {
		if s.writer == w {
			n += o.endSessionLocked(sid)
		}
	}
	// Blocks recovered from before a restart have no session yet.
	for i := range o.slots {
		sl := &o.slots[i]
		if sl.session == 0 && sl.writer == w && (sl.state == Writing || sl.state == Sealed) {
			o.freeSlot(uint32(i))
			o.stats.OrphansReclaimed++
			n++
		}
	}
	return n
}

// PublishedKeys returns the keys of up to max published blocks, most
// recently used first: a node's prefix summary.
func (o *Owner) PublishedKeys(max int) []BlockKey {
	o.mu.Lock()
	type used struct {
		key BlockKey
		at  time.Time
	}
	all := make([]used, 0, len(o.byKey))
	for k, i := range o.byKey {
		all = append(all, used{k, o.slots[i].lastUsed})
	}
	o.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].at.After(all[j].at) })
	if len(all) > max {
		all = all[:max]
	}
	keys := make([]BlockKey, len(all))
	for i, u := range all {
		keys[i] = u.key
	}
	return keys
}

// EndSession ends a session at once: its leases are released and any
// block it still writes is freed. It returns how many blocks were freed.
func (o *Owner) EndSession(sid SessionID) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sessions[sid] == nil {
		return 0
	}
	return o.endSessionLocked(sid)
}

func (o *Owner) endSessionLocked(sid SessionID) int {
	s := o.sessions[sid]
	n := 0
	for i := range s.owned {
		o.freeSlot(i)
		o.stats.OrphansReclaimed++
		n++
	}
	for i := range s.leased {
		delete(o.slots[i].leases, sid)
	}
	delete(o.sessions, sid)
	return n
}

// SweepResult says what one sweep reclaimed.
type SweepResult struct {
	SessionsExpired, OrphansReclaimed, Evicted int
}

// Sweep is one mark-and-sweep pass. Mark: blocks held by a live session
// (as writer or lease holder). Sweep: sessions past their lease end, taking
// their unpublished blocks with them; unpublished blocks with no session
// once the start-up grace is over; and, above the high-water mark,
// unleased published blocks, least recently used first. A block with a
// live lease is never reclaimed.
func (o *Owner) Sweep() SweepResult {
	o.mu.Lock()
	defer o.mu.Unlock()
	var res SweepResult
	now := o.opts.Now()
	// If the owner itself stalled (a slow disk under the lock, a paused
	// process), writers could not renew either: give them the lost time
	// back rather than expire live sessions.
	if gap := now.Sub(o.lastSweep); !o.lastSweep.IsZero() && gap > o.opts.LeaseTTL/2 {
		for _, s := range o.sessions {
			s.expires = s.expires.Add(gap)
		}
	}
	o.lastSweep = now
	for sid, s := range o.sessions {
		if !now.Before(s.expires) {
			res.OrphansReclaimed += o.endSessionLocked(sid)
			res.SessionsExpired++
			o.stats.SessionsExpired++
		}
	}
	if !now.Before(o.graceUntil) {
		for i := range o.slots {
			sl := &o.slots[i]
			orphan := sl.state == Allocated || sl.state == Aborted ||
				((sl.state == Writing || sl.state == Sealed) && o.sessions[sl.session] == nil)
			if orphan {
				o.freeSlot(uint32(i))
				o.stats.OrphansReclaimed++
				res.OrphansReclaimed++
			}
		}
	}
	inUse := len(o.slots) - len(o.free)
	high := int(o.opts.HighWater * float64(len(o.slots)))
	if inUse > high {
		res.Evicted = o.evictLocked(inUse - high)
	}
	return res
}

// evictLocked frees up to n unleased published blocks, least recently used
// first, and returns how many it freed.
func (o *Owner) evictLocked(n int) int {
	if n <= 0 || o.opts.Now().Before(o.graceUntil) {
		return 0
	}
	var cands []uint32
	for i := range o.slots {
		if sl := &o.slots[i]; sl.state == Published && len(sl.leases) == 0 {
			cands = append(cands, uint32(i))
		}
	}
	slices.SortFunc(cands, func(a, b uint32) int { return o.slots[a].lastUsed.Compare(o.slots[b].lastUsed) })
	freed := 0
	for _, i := range cands[:min(n, len(cands))] {
		if o.freeSlot(i) == nil {
			freed++
		}
	}
	o.stats.Evicted += uint64(freed)
	return freed
}

// Stats returns counts by state and the owner's counters.
func (o *Owner) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.stats
	st.Slots = len(o.slots)
	st.ByState = map[string]int{}
	for i := range o.slots {
		sl := &o.slots[i]
		st.ByState[sl.state.String()]++
		st.Leases += len(sl.leases)
	}
	st.Sessions = len(o.sessions)
	st.SlotsInUse = len(o.slots) - len(o.free)
	return st
}

// SlotInfo describes one slot that is not free, for operators.
type SlotInfo struct {
	Slot       uint32    `json:"slot"`
	Generation uint64    `json:"generation"`
	State      string    `json:"state"`
	Key        string    `json:"key,omitempty"`
	Writer     string    `json:"writer"`
	PayloadLen uint32    `json:"payload_len"`
	Leases     int       `json:"leases"`
	LastUsed   time.Time `json:"last_used,omitzero"`
}

// List returns every slot that is not free, in slot order.
func (o *Owner) List() []SlotInfo {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []SlotInfo
	for i := range o.slots {
		sl := &o.slots[i]
		if sl.state == Free {
			continue
		}
		info := SlotInfo{Slot: uint32(i), Generation: sl.gen, State: sl.state.String(), Writer: sl.writer.String(),
			PayloadLen: sl.payloadLen, Leases: len(sl.leases), LastUsed: sl.lastUsed}
		if !sl.key.IsZero() {
			info.Key = sl.key.String()
		}
		out = append(out, info)
	}
	return out
}
