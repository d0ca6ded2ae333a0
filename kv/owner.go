package kv

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/shm"
)

// MaxInstanceID bounds a writer's instance id (the manifest stores its
// length in one byte).
const MaxInstanceID = 255

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
	// Fence, when set, is called (with the owner's lock held) before an
	// expired session's WRITING and SEALED slots are reclaimed: a writer
	// maps the arena and writes payloads directly, so one that was only
	// stopped (SIGSTOP, a hung host thread) could resume and write into a
	// slot handed to another writer meanwhile, under a block a reader has
	// verified. Fence must make sure w can write no more (the agent kills
	// its process) and say so; false keeps the session for a later sweep.
	Fence func(w Writer) bool
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

	// mu guards the slots and sessions, and is held across each manifest
	// write: a slot's in-memory state changes before its manifest is
	// durable and is put back if the write fails, and a freed slot must
	// not be reused before its manifest's delete lands. Releasing mu
	// during the write would show those in-between states to every other
	// operation (the sweeper, a retry, a lease) and let a late delete
	// erase the next block's manifest.
	mu         sync.Mutex
	slots      []slot
	free       []uint32
	byKey      map[BlockKey]uint32
	sessions   map[SessionID]*session
	graceUntil time.Time
	lastSweep  time.Time
	stats      Stats
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
	// Badger creates some files with the umask's mode: the directory is
	// what keeps other users out, whatever was there before.
	if err := privateDir(opts.DBDir); err != nil {
		arena.Close()
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

// privateDir creates dir, or narrows an existing one, to mode 0700.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	return nil
}
