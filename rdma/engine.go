// Package rdma is the whole KV transfer engine, whatever the wire: it
// moves published KV blocks from one node's arena to another's under a
// transfer binding (see transferpb.Binding). The name is the product's
// (the design specifies it with RDMA), not the default transport: one
// Transport interface has two implementations, QUIC between node agents
// (the default, tested here) and RDMA verbs (build tag rdma; it compiles
// against libibverbs but these machines have no RDMA hardware, so it has
// never run). Workers never link it: they ask their agent for blocks
// through rdma/transferclient.
//
// A destination stages every block it receives in WRITING slots of its own
// arena, checks every byte against the source's checksum, and seals and
// publishes the blocks only once all of them arrived and the binding is
// still the current one: a partial or superseded transfer never becomes
// readable.
package rdma

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lifeline-llm/lifeline/internal/failpoint"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// Failpoints of the transfer engine.
const (
	// FailBeforeCommit is hit on the destination once every block of a
	// pull arrived and verified, before the binding is checked and the
	// blocks are sealed and published.
	FailBeforeCommit = "rdma.before-commit"
	// FailSourceMidway is hit on the source after it sent half of a
	// fetch stream's blocks (rounded down: before the only block of a
	// one-block stream) — a cut transfer, armed with "pause" or "kill".
	FailSourceMidway = "rdma.source-midway"
)

var (
	// ErrStale: the transfer's binding is not the current one.
	ErrStale = errors.New("rdma: stale transfer binding")
	// ErrBadTransfer wraps malformed requests and blocks that do not verify.
	ErrBadTransfer = errors.New("rdma: bad transfer")
	// ErrNoSource: no source could provide the blocks.
	ErrNoSource = errors.New("rdma: no source holds the blocks")
)

// Bounds of one transfer.
const (
	MaxBlocks  = 4096
	MaxSources = 8
	// PullDeadline bounds a whole pull, whatever its sources do.
	PullDeadline = 30 * time.Second
)

// Transport fetches published blocks from a source node.
type Transport interface {
	// Name is "quic" or "rdma".
	Name() string
	// Fetch asks the source at addr for blocks f.First..f.First+f.Count of
	// the chain f.Keys. For each block it calls into with the block's
	// index (0-based from f.First) and header; into returns the buffer
	// the payload is read into (exactly PayloadLen bytes). It returns how
	// many leading blocks the source held and delivered.
	Fetch(ctx context.Context, addr string, f *transferpb.Fetch, into func(i int, h *transferpb.BlockHeader) ([]byte, error)) (int, error)
	Close() error
}

// Stats count what the engine did.
type Stats struct {
	FetchesServed   uint64 `json:"fetches_served"`
	BlocksServed    uint64 `json:"blocks_served"`
	BytesServed     uint64 `json:"bytes_served"`
	PullsOK         uint64 `json:"pulls_ok"`
	PullsFailed     uint64 `json:"pulls_failed"`
	StaleDropped    uint64 `json:"stale_dropped"`
	BlocksPulled    uint64 `json:"blocks_pulled"`
	BytesPulled     uint64 `json:"bytes_pulled"`
	BlocksLocal     uint64 `json:"blocks_local"`
	SourceFailures  uint64 `json:"source_failures"`
	ChecksumErrors  uint64 `json:"checksum_errors"`
	StagedAborted   uint64 `json:"staged_aborted"`
	PullsInProgress int64  `json:"pulls_in_progress"`
}

// Engine serves this node's published blocks to peers and pulls blocks
// from peers into this node's arena.
type Engine struct {
	owner     *kv.Owner
	transport Transport
	// Current checks a binding against the destination instance as this
	// node knows it (it exists, at that generation, serving that model
	// revision); nil accepts every binding.
	Current func(*transferpb.Binding) error

	mu         sync.Mutex
	latest     map[string]epochSeen // request id → newest (request, transfer) epoch seen
	lastPruned time.Time

	// verbs serves RDMA verbs fetches; nil where the node has none.
	verbs verbsServer
	// dataPort is the TCP port of the TLS-over-TCP data path (ServeTCP),
	// offered to peers that ask over QUIC; 0: none.
	dataPort atomic.Uint32

	fetchesServed, blocksServed, bytesServed      atomic.Uint64
	pullsOK, pullsFailed, staleDropped            atomic.Uint64
	blocksPulled, bytesPulled, blocksLocal        atomic.Uint64
	sourceFailures, checksumErrors, stagedAborted atomic.Uint64
	inProgress                                    atomic.Int64
}

type epochSeen struct {
	request, transfer uint64
	at                time.Time
}

// before orders transfers of one request: by request epoch, then by
// transfer epoch within it.
func (s epochSeen) before(b *transferpb.Binding) bool {
	return s.request < b.RequestEpoch || (s.request == b.RequestEpoch && s.transfer < b.TransferEpoch)
}

func (s epochSeen) after(b *transferpb.Binding) bool {
	return s.request > b.RequestEpoch || (s.request == b.RequestEpoch && s.transfer > b.TransferEpoch)
}

// NewEngine returns an engine over the node's arena owner.
func NewEngine(owner *kv.Owner, t Transport) *Engine {
	return &Engine{owner: owner, transport: t, latest: map[string]epochSeen{}}
}

// verbsServer answers a verbs fetch on its control stream (build tag rdma).
type verbsServer interface {
	serve(e *Engine, f *transferpb.VerbsFetch, r *bufio.Reader, w *bufio.Writer) error
}

// UseTransport replaces the engine's transport (the agent switches to
// RDMA verbs once the device is open).
func (e *Engine) UseTransport(t Transport) { e.transport = t }

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{FetchesServed: e.fetchesServed.Load(), BlocksServed: e.blocksServed.Load(), BytesServed: e.bytesServed.Load(),
		PullsOK: e.pullsOK.Load(), PullsFailed: e.pullsFailed.Load(), StaleDropped: e.staleDropped.Load(),
		BlocksPulled: e.blocksPulled.Load(), BytesPulled: e.bytesPulled.Load(), BlocksLocal: e.blocksLocal.Load(),
		SourceFailures: e.sourceFailures.Load(), ChecksumErrors: e.checksumErrors.Load(), StagedAborted: e.stagedAborted.Load(),
		PullsInProgress: e.inProgress.Load()}
}

// Keys decodes a chain of 32-byte keys (at most MaxBlocks, none zero).
func Keys(raw [][]byte) ([]kv.BlockKey, error) {
	if len(raw) > MaxBlocks {
		return nil, fmt.Errorf("%w: %d keys (at most %d)", ErrBadTransfer, len(raw), MaxBlocks)
	}
	keys, err := kvclient.DecodeKeys(raw, false)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadTransfer, err)
	}
	return keys, nil
}

// keepAlive renews a session until stop is closed; if a renewal fails
// (the session expired, its slots may be someone else's now) it calls lost
// at once, so that nothing more is written into them.
func (e *Engine) keepAlive(sid kv.SessionID, stop <-chan struct{}, lost func()) {
	t := time.NewTicker(e.owner.LeaseTTL() / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if e.owner.KeepAlive(sid) != nil {
				lost()
				return
			}
		}
	}
}

// session opens an owner session for one transfer, kept alive until the
// returned function ends it (releasing its leases and freeing any slot it
// still writes). lost is called if the session cannot be renewed.
func (e *Engine) session(instance string, gen uint64, lost func()) (kv.SessionID, func(), error) {
	sid, _, _, err := e.owner.Hello(kv.Writer{Instance: instance, Gen: gen}, nil, nil)
	if err != nil {
		return 0, nil, err
	}
	stop := make(chan struct{})
	go e.keepAlive(sid, stop, lost)
	return sid, func() {
		close(stop)
		e.owner.EndSession(sid)
	}, nil
}

// servedBlock is a leased block a source sends: its header and its bytes
// in the arena mapping.
type servedBlock struct {
	header  *transferpb.BlockHeader
	payload []byte
}

// openFetch checks a fetch and leases the chain prefix it asks for that
// this node holds; end releases the leases. Both transports' sources use
// it.
func (e *Engine) openFetch(f *transferpb.Fetch) ([]servedBlock, func(), error) {
	keys, err := Keys(f.Keys)
	if err == nil && (uint64(f.First)+uint64(f.Count) > uint64(len(keys)) || f.Count == 0) {
		err = fmt.Errorf("%w: blocks [%d, %d+%d) of a chain of %d", ErrBadTransfer, f.First, f.First, f.Count, len(keys))
	}
	if err != nil {
		return nil, nil, err
	}
	e.fetchesServed.Add(1)
	sid, end, err := e.session("transfer-source", 1, func() {})
	if err != nil {
		return nil, nil, err
	}
	refs, err := e.owner.Acquire(sid, keys[f.First:f.First+f.Count])
	if err != nil {
		end()
		return nil, nil, err
	}
	arena := e.owner.Arena()
	blocks := make([]servedBlock, len(refs))
	for i, r := range refs {
		blocks[i] = servedBlock{payload: arena.Payload(int(r.Slot))[:r.PayloadLen],
			header: &transferpb.BlockHeader{Index: uint32(i), Key: keys[int(f.First)+i][:], Checksum: r.Checksum, PayloadLen: r.PayloadLen}}
	}
	return blocks, end, nil
}

// Serve answers one fetch: the source side. send writes the FetchStart,
// the blocks and the FetchEnd.
func (e *Engine) serveFetch(f *transferpb.Fetch, w *blockWriter) error {
	blocks, end, err := e.openFetch(f)
	if err != nil {
		return w.start(0, err.Error())
	}
	defer end()
	if err := w.start(len(blocks), ""); err != nil {
		return err
	}
	for i, b := range blocks {
		if i == len(blocks)/2 {
			failpoint.Hit(FailSourceMidway)
		}
		if err := w.block(b.header, b.payload); err != nil {
			return err
		}
		e.blocksServed.Add(1)
		e.bytesServed.Add(uint64(len(b.payload)))
	}
	return w.end(len(blocks))
}

// admit records the binding's transfer epoch for its request and says
// whether it is current: not older than one already seen, and accepted by
// Current.
func (e *Engine) admit(b *transferpb.Binding) error {
	if err := e.current(b); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if now.Sub(e.lastPruned) > time.Minute {
		e.lastPruned = now
		for id, s := range e.latest {
			if now.Sub(s.at) > 10*time.Minute {
				delete(e.latest, id)
			}
		}
	}
	s, ok := e.latest[b.RequestId]
	if ok && s.after(b) {
		return staleEpoch(b, s)
	}
	if !ok || s.before(b) {
		e.latest[b.RequestId] = epochSeen{request: b.RequestEpoch, transfer: b.TransferEpoch, at: now}
	}
	return nil
}

func staleEpoch(b *transferpb.Binding, s epochSeen) error {
	return fmt.Errorf("%w: epoch %d.%d of %s, %d.%d is current", ErrStale, b.RequestEpoch, b.TransferEpoch, b.RequestId, s.request, s.transfer)
}

// current says whether b is still the request's newest transfer and its
// destination is as bound.
func (e *Engine) current(b *transferpb.Binding) error {
	e.mu.Lock()
	s, ok := e.latest[b.RequestId]
	e.mu.Unlock()
	if ok && s.after(b) {
		return staleEpoch(b, s)
	}
	if e.Current != nil {
		if err := e.Current(b); err != nil {
			return fmt.Errorf("%w: %v", ErrStale, err)
		}
	}
	return nil
}

func validBinding(b *transferpb.Binding) error {
	switch {
	case b == nil:
		return fmt.Errorf("%w: no binding", ErrBadTransfer)
	case b.RequestId == "" || len(b.RequestId) > 256:
		return fmt.Errorf("%w: request id %q", ErrBadTransfer, b.RequestId)
	case b.DestinationInstance == "" || len(b.DestinationInstance) > 200:
		return fmt.Errorf("%w: destination instance %q", ErrBadTransfer, b.DestinationInstance)
	case b.TransferEpoch == 0:
		return fmt.Errorf("%w: transfer epoch 0", ErrBadTransfer)
	}
	return nil
}
