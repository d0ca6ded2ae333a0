package decode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/shm"
)

// Snapshots keep, in the node's arena, the whole K/V state of sequences
// of an engine that holds K/V itself (llama.cpp): a state is exported
// when a sequence's computed positions reach a new multiple of
// sched.SnapshotEvery, cut into arena blocks and published; a worker of
// the same numerics restores a sequence from the longest saved prefix
// of its tokens — its own, or one a dead worker published there (the
// agent owns the arena), or one pulled from another node.
//
// A snapshot of the prefix of k positions (a multiple of SnapshotEvery)
// is a chain of blocks: the first keyed by the prefix's chain key under
// the identity and one sentinel token, each next by the previous one.
// Its first block starts with a header: magic, version, the state's
// length, the positions the state holds (k or more: it was exported when
// a step ended past k; a restore drops the rest).
type snapshots struct {
	client  *kvclient.Client
	arena   *shm.Arena
	id      kvclient.Identity
	payload int
	// readBuf is kept from one load to the next (the scheduler's step
	// loads: one at a time).
	readBuf []byte

	mu sync.Mutex
	// held are each slot's latest snapshot's blocks, leased.
	held  map[int][]kvclient.Ref
	stats SnapshotStats
}

// SnapshotStats count what an engine's snapshots did.
type SnapshotStats struct {
	Saved, SaveFailed, Restored, RestoreMissed uint64
	// Skipped counts saves left out to keep within the time budget.
	Skipped uint64
	// RestoredPositions counts the positions restored (not computed);
	// SavedBytes the states' bytes written.
	RestoredPositions, SavedBytes uint64
	SaveTime, RestoreTime         time.Duration
}

const (
	snapshotMagic   = "LLSS"
	snapshotVersion = 1
	snapshotHeader  = 24
	// snapshotTimeout bounds each exchange with the arena's owner.
	snapshotTimeout = 2 * time.Second
)

// snapshotter is what the engine facade asks of an engine's snapshots.
type snapshotter interface {
	Stats() SnapshotStats
	// pullChains are the key chains a migrated request of tokens would
	// restore from, longest first.
	pullChains(tokens []int) [][]kvclient.BlockKey
}

// SnapshotStats are the engine's snapshot counts (zero without).
func (e *Engine) SnapshotStats() SnapshotStats {
	if e.snaps == nil {
		return SnapshotStats{}
	}
	return e.snaps.Stats()
}

// PullChains are the key chains of the blocks a request would reuse,
// each a candidate the node may pull from elsewhere, best first: the
// full blocks of prompt ‖ prefix (the reference engine sharing its KV),
// or the snapshots of its longest saved prefixes (llama.cpp); none when
// the engine does not share its KV.
func (e *Engine) PullChains(r Request) ([][]kvclient.BlockKey, error) {
	if e.Cache == nil && e.snaps == nil {
		return nil, nil
	}
	prompt, err := e.prepare(&r)
	if err != nil {
		return nil, err
	}
	tokens := slices.Concat(prompt, r.PrefixTokens)
	if e.snaps != nil {
		return e.snaps.pullChains(tokens), nil
	}
	id := e.Cache.Identity()
	return [][]kvclient.BlockKey{id.Chain(tokens, (len(tokens)-1)/id.BlockSize)}, nil
}

// errNoSnapshot: no saved prefix of the tokens.
var errNoSnapshot = errors.New("decode: no snapshot")

func newSnapshots(client *kvclient.Client, id kvclient.Identity) (*snapshots, error) {
	arena, err := shm.OpenWorker(client.ArenaPath())
	if err != nil {
		return nil, err
	}
	if client.PayloadSize() <= snapshotHeader {
		arena.Close()
		return nil, fmt.Errorf("decode: arena blocks of %d bytes cannot hold snapshots", client.PayloadSize())
	}
	return &snapshots{client: client, arena: arena, id: id, payload: client.PayloadSize(), held: map[int][]kvclient.Ref{}}, nil
}

// chunkKeys are the keys of the first n blocks of the snapshot of the
// first k tokens.
func (s *snapshots) chunkKeys(tokens []int, k, n int) []kvclient.BlockKey {
	chain := s.id.Chain(tokens[:k], -1)
	keys := make([]kvclient.BlockKey, n)
	parent := chain[len(chain)-1]
	for i := range keys {
		keys[i] = s.id.Key(parent, []int{-1})
		parent = keys[i]
	}
	return keys
}

// blocksFor is how many blocks a state of size bytes takes.
func (s *snapshots) blocksFor(size int) int {
	return (snapshotHeader + size + s.payload - 1) / s.payload
}

// save publishes state, which holds the K/V of tokens, as slot's
// snapshot of its longest prefix of a multiple of SnapshotEvery, and
// lets the slot's previous one go; began is when the save began (the
// export included).
func (s *snapshots) save(slot int, tokens []int, state []byte, began time.Time) error {
	k := len(tokens) / sched.SnapshotEvery * sched.SnapshotEvery
	if k == 0 {
		return nil
	}
	var header [snapshotHeader]byte
	copy(header[:], snapshotMagic)
	binary.LittleEndian.PutUint32(header[4:], snapshotVersion)
	binary.LittleEndian.PutUint64(header[8:], uint64(len(state)))
	binary.LittleEndian.PutUint32(header[16:], uint32(len(tokens)))
	binary.LittleEndian.PutUint32(header[20:], uint32(k))
	total := snapshotHeader + len(state)
	n := s.blocksFor(len(state))
	keys := s.chunkKeys(tokens, k, n)
	ctx, cancel := context.WithTimeout(context.Background(), snapshotTimeout)
	defer cancel()
	refs, err := s.client.Allocate(ctx, n)
	if err != nil {
		return s.saveFailed(err)
	}
	batch := make([]kvclient.BatchBlock, n)
	for i, r := range refs {
		// Straight from the export into the arena: header ‖ state, cut
		// in blocks.
		off := i * s.payload
		part := s.arena.Payload(int(r.Slot))[:min(s.payload, total-off)]
		c := 0
		if off < snapshotHeader {
			c = copy(part, header[off:])
		}
		copy(part[c:], state[max(0, off-snapshotHeader):])
		r.PayloadLen, r.Checksum = uint32(len(part)), shm.Checksum(part)
		batch[i] = kvclient.BatchBlock{Ref: r, Key: keys[i]}
		if i > 0 {
			batch[i].Parent = keys[i-1]
		}
	}
	res, err := s.client.PublishBatch(ctx, batch, 0)
	if err != nil {
		for _, r := range refs {
			s.client.Abort(ctx, r)
		}
		return s.saveFailed(err)
	}
	var published []kvclient.Ref
	var failed error
	for i, e := range res.Errs {
		if e != nil {
			failed = cmpErr(failed, e)
			s.client.Abort(ctx, refs[i])
			continue
		}
		published = append(published, res.Published[i])
	}
	if failed != nil {
		// A duplicate: the same prefix is saved already (another
		// sequence of the same tokens); that one serves.
		for _, r := range published {
			s.client.Release(ctx, r)
		}
		if errors.Is(failed, kvclient.ErrDuplicate) {
			return nil
		}
		return s.saveFailed(failed)
	}
	s.mu.Lock()
	prev := s.held[slot]
	s.held[slot] = published
	s.stats.Saved++
	s.stats.SavedBytes += uint64(len(state))
	s.stats.SaveTime += time.Since(began)
	s.mu.Unlock()
	for _, r := range prev {
		s.client.Release(ctx, r)
	}
	return nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (s *snapshots) saveFailed(err error) error {
	s.mu.Lock()
	s.stats.SaveFailed++
	s.mu.Unlock()
	return fmt.Errorf("decode: snapshot: %w", err)
}

// drop lets slot's snapshot go (it stays readable until its room is
// needed).
func (s *snapshots) drop(slot int) {
	s.mu.Lock()
	refs := s.held[slot]
	delete(s.held, slot)
	s.mu.Unlock()
	if len(refs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), snapshotTimeout)
	defer cancel()
	for _, r := range refs {
		s.client.Release(ctx, r)
	}
}

// candidates are the prefix lengths a restore of n positions tries,
// longest first: a snapshot older than two periods is not worth a lookup.
func candidates(n int) []int {
	var out []int
	for k := n / sched.SnapshotEvery * sched.SnapshotEvery; k > 0 && len(out) < 2; k -= sched.SnapshotEvery {
		out = append(out, k)
	}
	return out
}

// load reads the longest saved snapshot of a prefix of tokens (each may
// be restored: the scheduler leaves out the one it computes): the
// state, and the prefix's length k (the state may hold more positions,
// which the restore drops).
func (s *snapshots) load(tokens []int) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), snapshotTimeout)
	defer cancel()
	for _, k := range candidates(len(tokens)) {
		first := s.chunkKeys(tokens, k, 1)
		refs, err := s.client.Acquire(ctx, first)
		if err != nil {
			return nil, 0, err
		}
		if len(refs) == 0 {
			continue
		}
		state, err := s.read(ctx, tokens, k, refs[0])
		if err != nil {
			return nil, 0, err
		}
		return state, k, nil
	}
	return nil, 0, errNoSnapshot
}

// read reads the snapshot of the first k tokens whose first block is
// leased as first, verifying every block, and lets the leases go.
func (s *snapshots) read(ctx context.Context, tokens []int, k int, first kvclient.Ref) ([]byte, error) {
	refs := []kvclient.Ref{first}
	defer func() {
		for _, r := range refs {
			s.client.Release(ctx, r)
		}
	}()
	head, err := s.verified(first)
	if err != nil || len(head) < snapshotHeader || string(head[:4]) != snapshotMagic ||
		binary.LittleEndian.Uint32(head[4:]) != snapshotVersion || int(binary.LittleEndian.Uint32(head[20:])) != k ||
		int(binary.LittleEndian.Uint32(head[16:])) < k {
		return nil, fmt.Errorf("decode: snapshot of %d positions: a bad first block (%v)", k, err)
	}
	size := binary.LittleEndian.Uint64(head[8:])
	if size > uint64(s.payload)*uint64(s.arena.Geometry().Slots) {
		return nil, fmt.Errorf("decode: snapshot of %d positions: %d bytes cannot fit the arena", k, size)
	}
	n := s.blocksFor(int(size))
	keys := s.chunkKeys(tokens, k, n)
	rest, err := s.client.Acquire(ctx, keys[1:])
	refs = append(refs, rest...)
	if err != nil || len(rest) != n-1 {
		return nil, fmt.Errorf("decode: snapshot of %d positions: %d of %d blocks (%v)", k, len(rest)+1, n, err)
	}
	if cap(s.readBuf) < snapshotHeader+int(size) {
		s.readBuf = make([]byte, 0, snapshotHeader+int(size))
	}
	data := s.readBuf[:0]
	for i, r := range refs {
		b := head
		if i > 0 {
			if b, err = s.verified(r); err != nil {
				return nil, err
			}
		}
		data = append(data, b...)
	}
	if len(data) != snapshotHeader+int(size) {
		return nil, fmt.Errorf("decode: snapshot of %d positions: %d bytes, its header says %d", k, len(data)-snapshotHeader, size)
	}
	return data[snapshotHeader:], nil
}

// verified is r's payload, checked against what the owner recorded.
func (s *snapshots) verified(r kvclient.Ref) ([]byte, error) {
	slot := int(r.Slot)
	if int(r.PayloadLen) > s.payload || s.arena.Gen(slot) != r.Gen || s.arena.State(slot) != shm.SlotPublished {
		return nil, fmt.Errorf("decode: snapshot block in slot %d changed", slot)
	}
	b := s.arena.Payload(slot)[:r.PayloadLen]
	if shm.Checksum(b) != r.Checksum {
		s.client.ReportCorrupt(context.Background(), r)
		return nil, fmt.Errorf("decode: snapshot block in slot %d fails its checksum", slot)
	}
	return b, nil
}

// chains are the keys of the blocks a migrated request of tokens would
// restore from, longest snapshot first, given states of at most
// stateBytes(k) bytes for k positions: what its worker asks its node to
// pull from where the request ran before (a source has a prefix of each
// chain: the snapshot's blocks, fewer than the bound).
func (s *snapshots) chains(tokens []int, stateBytes func(k int) int) [][]kvclient.BlockKey {
	var out [][]kvclient.BlockKey
	// The last position is computed (its logits pick the next token).
	for _, k := range candidates(len(tokens) - 1) {
		out = append(out, s.chunkKeys(tokens, k, s.blocksFor(stateBytes(k))))
	}
	return out
}

func (s *snapshots) Stats() SnapshotStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *snapshots) close() error {
	for slot := range s.held {
		s.drop(slot)
	}
	return s.arena.Close()
}
