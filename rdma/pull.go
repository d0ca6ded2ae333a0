package rdma

import (
	"context"
	"errors"
	"fmt"

	"github.com/lifeline-llm/lifeline/internal/failpoint"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
	"github.com/lifeline-llm/lifeline/shm"
)

// Pull makes the chain's blocks published in this node's arena: the
// destination side. Blocks already published here are kept; the rest is
// fetched from the first source that holds them, staged in WRITING slots,
// verified, and published only if the binding is still current once all
// arrived. The reply's binding is the request's, for the caller to match.
func (e *Engine) Pull(ctx context.Context, p *transferpb.Pull) *transferpb.PullReply {
	reply := &transferpb.PullReply{Binding: p.Binding}
	keys, err := checkPull(p)
	if err != nil {
		return e.failPull(reply, err)
	}
	b := p.Binding
	if err := e.admit(b); err != nil {
		return e.failPull(reply, err)
	}
	e.inProgress.Add(1)
	defer e.inProgress.Add(-1)
	ctx, cancel := context.WithTimeout(ctx, PullDeadline)
	defer cancel()
	sid, end, err := e.session("transfer/"+b.DestinationInstance, b.DestinationGeneration, cancel)
	if err != nil {
		return e.failPull(reply, err)
	}
	defer end()
	// Lease the chain's prefix already here, so that allocating room for
	// the rest cannot evict it.
	held, err := e.owner.Acquire(sid, keys)
	if err != nil {
		return e.failPull(reply, err)
	}
	local := len(held)
	reply.Local = uint32(local)
	e.blocksLocal.Add(uint64(local))
	if local >= len(keys) {
		e.pullsOK.Add(1)
		return reply
	}
	st, err := e.stage(sid, len(keys)-local)
	if err != nil {
		return e.failPull(reply, err)
	}
	defer st.abort()
	want := chainPart{raw: p.Keys[:len(keys)], keys: keys, local: local}
	got, src, err := e.fetchAny(ctx, b, p.Sources, want, st.refs)
	if err != nil {
		return e.failPull(reply, err)
	}
	reply.Source = src
	bytes, err := e.commit(ctx, sid, b, want, got, st)
	if err != nil {
		return e.failPull(reply, err)
	}
	reply.Pulled, reply.Bytes = uint32(got), bytes
	e.pullsOK.Add(1)
	e.blocksPulled.Add(uint64(got))
	e.bytesPulled.Add(bytes)
	return reply
}

// failPull counts a failed pull and says why in its reply.
func (e *Engine) failPull(reply *transferpb.PullReply, err error) *transferpb.PullReply {
	if errors.Is(err, ErrStale) {
		e.staleDropped.Add(1)
		reply.Stale = true
	} else {
		e.pullsFailed.Add(1)
	}
	reply.Error = err.Error()
	return reply
}

// checkPull validates a pull and returns the chain up to the end of its
// bound block range.
func checkPull(p *transferpb.Pull) ([]kv.BlockKey, error) {
	if err := validBinding(p.Binding); err != nil {
		return nil, err
	}
	keys, err := Keys(p.Keys)
	if err != nil {
		return nil, err
	}
	b := p.Binding
	if uint64(b.FirstBlock)+uint64(b.BlockCount) > uint64(len(keys)) {
		return nil, fmt.Errorf("%w: block range [%d, %d+%d) of a chain of %d", ErrBadTransfer, b.FirstBlock, b.FirstBlock, b.BlockCount, len(keys))
	}
	if len(p.Sources) > MaxSources {
		return nil, fmt.Errorf("%w: %d sources (at most %d)", ErrBadTransfer, len(p.Sources), MaxSources)
	}
	return keys[:b.FirstBlock+b.BlockCount], nil
}

// chainPart is the chain a pull wants: its keys (raw as they came, and
// decoded), of which the first local are already published here.
type chainPart struct {
	raw   [][]byte
	keys  []kv.BlockKey
	local int
}

// staging is the WRITING slots a pull receives blocks into, in chain
// order; abort hands back those still ours.
type staging struct {
	e    *Engine
	sid  kv.SessionID
	refs []kv.Ref
	left []kv.Ref // not published: aborted when the pull ends
}

func (e *Engine) stage(sid kv.SessionID, n int) (*staging, error) {
	refs, err := e.owner.Allocate(sid, n)
	if err != nil {
		return nil, err
	}
	return &staging{e: e, sid: sid, refs: refs, left: refs}, nil
}

func (s *staging) abort() {
	for _, r := range s.left {
		if s.e.owner.Abort(s.sid, r) == nil {
			s.e.stagedAborted.Add(1)
		}
	}
	s.left = nil
}

// fetchAny fetches the missing blocks into refs from the first source
// that delivers at least one that verifies, and returns how many leading
// blocks arrived and from which source.
func (e *Engine) fetchAny(ctx context.Context, b *transferpb.Binding, sources []string, want chainPart, refs []kv.Ref) (int, string, error) {
	var lastErr error = ErrNoSource
	for _, src := range sources {
		if ctx.Err() != nil {
			break
		}
		n, err := e.fetchFrom(ctx, src, b, want, refs)
		if err == nil && n > 0 {
			return n, src, nil
		}
		if err == nil {
			err = fmt.Errorf("%w: %s holds none of them", ErrNoSource, src)
		}
		e.sourceFailures.Add(1)
		lastErr = err
	}
	return 0, "", lastErr
}

// fetchFrom fetches the missing blocks from one source straight into the
// staged slots, then checks every byte that arrived against its checksum.
func (e *Engine) fetchFrom(ctx context.Context, src string, b *transferpb.Binding, want chainPart, refs []kv.Ref) (int, error) {
	arena := e.owner.Arena()
	local, need := want.local, len(refs)
	f := &transferpb.Fetch{Binding: b, Keys: want.raw, First: uint32(local), Count: uint32(need)}
	n, err := e.transport.Fetch(ctx, src, f, func(i int, h *transferpb.BlockHeader) ([]byte, error) {
		switch {
		case i < 0 || i >= need:
			return nil, fmt.Errorf("%w: block %d of %d", ErrBadTransfer, i, need)
		case string(h.Key) != string(want.keys[local+i][:]):
			return nil, fmt.Errorf("%w: block %d arrived under another key", ErrBadTransfer, local+i)
		case int(h.PayloadLen) > arena.Geometry().PayloadSize:
			return nil, fmt.Errorf("%w: block %d has %d bytes, slots hold %d", ErrBadTransfer, local+i, h.PayloadLen, arena.Geometry().PayloadSize)
		}
		refs[i].Checksum, refs[i].PayloadLen = h.Checksum, h.PayloadLen
		return arena.Payload(int(refs[i].Slot))[:h.PayloadLen], nil
	})
	if err != nil {
		return n, err
	}
	for i := 0; i < n; i++ {
		if shm.Checksum(arena.Payload(int(refs[i].Slot))[:refs[i].PayloadLen]) != refs[i].Checksum {
			e.checksumErrors.Add(1)
			return n, fmt.Errorf("%w: block %d from %s does not match its checksum", ErrBadTransfer, local+i, src)
		}
	}
	return n, nil
}

// commit seals and publishes the got blocks that arrived, if the binding
// still holds and the pull is still on, and returns the bytes published.
func (e *Engine) commit(ctx context.Context, sid kv.SessionID, b *transferpb.Binding, want chainPart, got int, st *staging) (uint64, error) {
	failpoint.Hit(FailBeforeCommit)
	if err := e.current(b); err != nil {
		return 0, err
	}
	if ctx.Err() != nil {
		// Cancelled, past the deadline, or the session was lost: its
		// slots may not be ours any more.
		return 0, fmt.Errorf("rdma: pull ended before commit: %w", context.Cause(ctx))
	}
	// Every byte arrived and verified, and the binding holds: seal and
	// publish in chain order, in one manifest batch. A block someone else
	// published meanwhile is dropped (the published one is identical by
	// key).
	local, keys := want.local, want.keys
	parents := make([]kv.BlockKey, got)
	for i := range parents {
		if local+i > 0 {
			parents[i] = keys[local+i-1]
		}
	}
	// Every payload was checked against its checksum in fetchFrom.
	dup, err := e.owner.SealPublish(sid, st.refs[:got], keys[local:local+got], parents, true)
	if err != nil {
		return 0, fmt.Errorf("rdma: publish blocks %d..%d: %w", local, local+got-1, err)
	}
	var bytes uint64
	var dups []kv.Ref
	for i := 0; i < got; i++ {
		if dup[i] {
			dups = append(dups, st.refs[i])
			continue
		}
		bytes += uint64(st.refs[i].PayloadLen)
	}
	st.left = append(dups, st.refs[got:]...) // published ones are no longer ours to abort
	return bytes, nil
}
