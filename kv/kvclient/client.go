package kvclient

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// ErrOwnerUnavailable is returned when the owner cannot be reached; callers
// degrade to recompute.
var ErrOwnerUnavailable = errors.New("kv: arena owner unavailable")

// Client is a worker's connection to the arena owner. It keeps its session
// alive on a connection of its own, and fences itself: once it cannot prove
// its lease is still live (no renewal acknowledged within the lease TTL
// minus a safety margin), or the owner no longer recognises a block after
// a reconnect, it declares those blocks lost through OnLost and forgets
// them, before the owner could hand their slots to anyone else. Safe for
// concurrent use.
type Client struct {
	socket string
	writer Writer

	// line is the right to use conn: a one-token semaphore, so that
	// round trips go one at a time on the connection (the protocol answers
	// in order) and a caller waiting its turn can give up when its ctx
	// ends. It is never held together with mu across I/O: state reads and
	// the keepalive goroutine do not wait on the owner.
	line chan struct{}
	conn *wire // guarded by line; nil when not connected

	mu     sync.Mutex
	hello  *kvpb.HelloReply
	owned  map[uint32]Ref
	leased map[uint32]Ref
	onLost func([]Ref)
	// validUntil is when our lease may end at the owner: the send time of
	// the last acknowledged renewal plus the TTL, less a margin.
	validUntil time.Time
	// unreachable is set when a round trip on the main connection failed
	// (broken, or unanswered in time) and cleared once the owner answers a
	// hello or a renewal: meanwhile calls fail at once with
	// ErrOwnerUnavailable instead of each waiting out a timeout, so that a
	// frozen owner costs a decode step nothing. The keepalive goroutine
	// keeps probing.
	unreachable bool
	// abandoned is a session the client no longer renews: it forgot
	// blocks the owner may still hold under it (a fence, a hello left
	// unanswered, a hand-back that never reached the owner). Renewed, the
	// session would keep those slots WRITING or leased for as long as the
	// worker lives; ended by the next hello (or left to expire: see
	// forgot), the owner frees them. The keepalive goroutine opens a new
	// session instead, re-attaching what is still held, and renews the
	// old one only until it has.
	abandoned uint64
	// forgot is set once the client forgot blocks a step may still be
	// using (a fence, a hello left unanswered): the next hello then names
	// no session to replace, and the one they were held under is left
	// to expire, at least a third of the TTL after the client stopped
	// trusting it (the fence's margin: a step in flight ends first).
	// Otherwise the hello names the session it replaces and the owner
	// ends it at once: what it still holds, the client gave up (or never
	// learnt of: the leases of an Acquire whose answer it never read).
	forgot bool
	// replacing is the session a hello under way names: a renewal of it
	// refused meanwhile (that hello ended it) is no reason to fence.
	replacing uint64

	stop      context.CancelFunc // ends the keepalive goroutine
	done      chan struct{}
	closeOnce sync.Once
}

// Dial connects to the owner's socket as writer and starts keepalives.
// ctx bounds the connection and hello; the keepalives run until Close.
func Dial(ctx context.Context, socket string, w Writer) (*Client, error) {
	c := &Client{socket: socket, writer: w, line: make(chan struct{}, 1), owned: map[uint32]Ref{}, leased: map[uint32]Ref{},
		done: make(chan struct{})}
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	_, err := c.connect(ctx) // a new client holds nothing to lose
	c.release()
	if err != nil {
		return nil, err
	}
	kctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	go c.keepAlive(kctx)
	return c, nil
}

// OnLost registers the function told about blocks the client had to give
// up (their slots may be reused). It runs with nothing of the client held,
// so it may call the client.
func (c *Client) OnLost(f func([]Ref)) {
	c.mu.Lock()
	c.onLost = f
	c.mu.Unlock()
}

// ttl is the owner's lease TTL. The caller holds mu.
func (c *Client) ttl() time.Duration {
	if c.hello == nil {
		return defaultTTL
	}
	return time.Duration(c.hello.LeaseTtlMs) * time.Millisecond
}

// margin is how long before the owner could expire us we stop trusting
// our blocks: enough for a step in flight to notice at its end. The
// caller holds mu.
func (c *Client) margin() time.Duration { return c.ttl() / 3 }

// rtt bounds one round trip on the main connection.
func (c *Client) rtt() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return rttFor(c.ttl())
}

// acquire takes the line, or gives up when ctx ends.
func (c *Client) acquire(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.line <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Client) release() { <-c.line }

// connect dials and says hello, re-attaching what we hold. It returns
// the blocks the owner did not confirm, for the caller to report with
// reportLost once it has released the line (OnLost may call the client).
// The caller holds the line.
func (c *Client) connect(ctx context.Context) (lost []Ref, err error) {
	expired, unconfirmed, err := c.sayHello(ctx)
	return append(expired, unconfirmed...), err
}

// sayHello opens a new connection and session. expired are the blocks
// not offered for re-attachment because our lease may have ended;
// unconfirmed those the owner did not re-attach. The caller holds the
// line.
func (c *Client) sayHello(ctx context.Context) (expired, unconfirmed []Ref, err error) {
	if c.conn != nil {
		c.conn.close()
		c.conn = nil
	}
	w, err := dialWire(ctx, c.socket, 0)
	if err != nil {
		return nil, nil, err
	}
	c.conn = w
	owned, leased, expired := c.held()
	// The session we had (if any) is ended once this one re-attached
	// what we still hold, unless we forgot blocks a step may still use
	// (see forgot). A forget during the hello sets forgot again.
	c.mu.Lock()
	replaces, forgot := c.hello.GetSession(), c.forgot
	if forgot {
		replaces = 0
	}
	c.forgot, c.replacing = false, replaces
	c.mu.Unlock()
	hello := &kvpb.Hello{InstanceId: c.writer.Instance, Generation: c.writer.Gen, Replaces: replaces}
	for _, r := range owned {
		hello.Owned = append(hello.Owned, RefToPB(r))
	}
	for _, r := range leased {
		hello.Leased = append(hello.Leased, RefToPB(r))
	}
	sent := time.Now()
	resp, err := w.roundTrip(ctx, &kvpb.Request{Op: &kvpb.Request_Hello{Hello: hello}}, c.rtt())
	if err != nil {
		w.close()
		c.conn = nil
		// The hello may still reach a frozen owner later and re-attach
		// the blocks we write to a session nobody renews; when that
		// session expires the owner frees them. They are not ours to
		// write any more.
		c.mu.Lock()
		defer c.mu.Unlock()
		c.unreachable, c.replacing = true, 0
		c.forgot = c.forgot || forgot
		var adrift []Ref
		if _, isRemote := errors.AsType[*RemoteError](err); !isRemote {
			// Or it never arrived, and the blocks stay in the session
			// we had: that one must expire too.
			adrift = forgetUnconfirmed(c.owned, owned, nil)
			c.forgot = c.forgot || len(adrift) > 0
			c.abandonLocked()
		}
		return append(expired, adrift...), nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hello = resp.Hello
	c.unreachable, c.replacing = false, 0
	c.validUntil = sent.Add(c.ttl() - c.margin())
	unconfirmed = forgetUnconfirmed(c.owned, owned, resp.Hello.OwnedOk)
	unconfirmed = append(unconfirmed, forgetUnconfirmed(c.leased, leased, resp.Hello.LeasedOk)...)
	return expired, unconfirmed, nil
}

// held snapshots what a hello should re-attach. If our lease may already
// have ended at the owner, what we held is not ours to re-attach: it is
// forgotten and returned as expired.
func (c *Client) held() (owned, leased, expired []Ref) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Now().Before(c.validUntil) || c.validUntil.IsZero() {
		return slices.Collect(maps.Values(c.owned)), slices.Collect(maps.Values(c.leased)), nil
	}
	return nil, nil, c.forgetAllLocked()
}

// forgetAllLocked drops every block we hold, abandons the session they
// were held under, and returns them.
func (c *Client) forgetAllLocked() []Ref {
	lost := append(slices.Collect(maps.Values(c.owned)), slices.Collect(maps.Values(c.leased))...)
	clear(c.owned)
	clear(c.leased)
	c.forgot = len(lost) > 0 || c.forgot
	c.abandonLocked()
	return lost
}

// abandonLocked stops renewing the current session (see abandoned).
func (c *Client) abandonLocked() {
	if c.hello != nil {
		c.abandoned = c.hello.Session
	}
}

// handedBack abandons session if a hand-back (Abort, Release) of one of
// its blocks may not have reached the owner: the client has forgotten
// the block, so only the session's expiry returns it. An answer from the
// owner, even an error (a stale reference), means there is nothing left
// to return.
func (c *Client) handedBack(session uint64, err error) {
	if _, isRemote := errors.AsType[*RemoteError](err); err == nil || isRemote {
		return
	}
	c.mu.Lock()
	if c.hello.GetSession() == session {
		c.abandonLocked()
	}
	c.mu.Unlock()
}

// forgetUnconfirmed removes from held the offered refs the owner did not
// confirm (ok[i] false or missing) and returns them. A ref given up
// meanwhile (an Abort or Release waiting for the line) is not reported.
func forgetUnconfirmed(held map[uint32]Ref, offered []Ref, ok []bool) []Ref {
	var lost []Ref
	for i, r := range offered {
		if i < len(ok) && ok[i] {
			continue
		}
		if cur, still := held[r.Slot]; still && cur == r {
			delete(held, r.Slot)
			lost = append(lost, r)
		}
	}
	return lost
}

// reportLost calls OnLost, without the line or the lock held.
func (c *Client) reportLost(lost []Ref) {
	if len(lost) == 0 {
		return
	}
	c.mu.Lock()
	f := c.onLost
	c.mu.Unlock()
	if f != nil {
		f(lost)
	}
}

// Reachable reports whether the owner answered the last round trip on
// the main connection (or a renewal since).
func (c *Client) Reachable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.unreachable
}

// markUnreachable records that a round trip failed without an answer.
func (c *Client) markUnreachable(err error) {
	// A caller that gave up (Canceled) says nothing about the owner.
	if _, isRemote := errors.AsType[*RemoteError](err); err == nil || isRemote || errors.Is(err, context.Canceled) {
		return
	}
	c.mu.Lock()
	c.unreachable = true
	c.mu.Unlock()
}

// call sends one request, reconnecting once if the connection is gone.
// While the owner is unreachable it fails at once.
func (c *Client) call(ctx context.Context, req *kvpb.Request) (resp *kvpb.Response, err error) {
	if !c.Reachable() {
		return nil, ErrOwnerUnavailable
	}
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer func() { c.markUnreachable(err) }()
	var lost []Ref
	defer func() {
		c.release()
		c.reportLost(lost)
	}()
	if c.conn == nil {
		if lost, err = c.connect(ctx); err != nil {
			return nil, err
		}
	}
	resp, err = c.roundTrip(ctx, req)
	if (errors.Is(err, ErrUnknownSession) || errors.Is(err, ErrOwnerUnavailable)) && ctx.Err() == nil {
		// The owner restarted, the connection broke, or our lease lapsed:
		// reconnect, re-attach what we hold, and retry once. Seal and
		// Publish are idempotent at the owner; a retried Allocate whose
		// first copy did land leaks its slots until that session expires.
		var again []Ref
		again, err = c.connect(ctx)
		lost = append(lost, again...)
		if err != nil {
			return nil, err
		}
		resp, err = c.roundTrip(ctx, req)
	}
	return resp, err
}

// roundTrip sends req on the main connection. The caller holds the line.
func (c *Client) roundTrip(ctx context.Context, req *kvpb.Request) (*kvpb.Response, error) {
	if c.conn == nil {
		return nil, ErrOwnerUnavailable
	}
	resp, err := c.conn.roundTrip(ctx, req, c.rtt())
	if c.conn.closed {
		c.conn = nil
	}
	return resp, err
}

// Close stops keepalives and closes the connection. Blocks still owned or
// leased are left to the owner's lease expiry; call Abort/Release first for
// a prompt hand-back. Close may be called more than once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.stop()
		<-c.done
		c.line <- struct{}{} // a call in flight finishes first
		if c.conn != nil {
			c.conn.close()
			c.conn = nil
		}
		c.release()
	})
	return nil
}

// ArenaPath, Slots and PayloadSize describe the owner's arena.
func (c *Client) ArenaPath() string { c.mu.Lock(); defer c.mu.Unlock(); return c.hello.ArenaPath }
func (c *Client) PayloadSize() int  { c.mu.Lock(); defer c.mu.Unlock(); return int(c.hello.PayloadSize) }
func (c *Client) Slots() int        { c.mu.Lock(); defer c.mu.Unlock(); return int(c.hello.Slots) }

// Allocate gets n slots in WRITING state.
func (c *Client) Allocate(ctx context.Context, n int) ([]Ref, error) {
	resp, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Allocate{Allocate: &kvpb.Allocate{Count: uint32(n)}}})
	if err != nil {
		return nil, err
	}
	refs := RefsFromPB(resp.Refs)
	c.mu.Lock()
	for _, r := range refs {
		c.owned[r.Slot] = r
	}
	c.mu.Unlock()
	return refs, nil
}

// Seal records the block written in r's slot under key.
func (c *Client) Seal(ctx context.Context, r Ref, key, parent BlockKey) error {
	_, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Seal{Seal: &kvpb.Seal{Ref: RefToPB(r), Key: key[:], Parent: parent[:]}}})
	return err
}

// Publish makes a sealed block readable; the client then holds a lease on it.
func (c *Client) Publish(ctx context.Context, r Ref) error {
	_, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Publish{Publish: &kvpb.Publish{Ref: RefToPB(r)}}})
	if err == nil {
		c.mu.Lock()
		delete(c.owned, r.Slot)
		c.leased[r.Slot] = r
		c.mu.Unlock()
	}
	return err
}

// Abort discards a block the client writes. Should the owner not answer,
// the block is still forgotten: the session it was written under is then
// left to expire, which frees it.
func (c *Client) Abort(ctx context.Context, r Ref) error {
	c.mu.Lock()
	delete(c.owned, r.Slot)
	session := c.hello.GetSession()
	c.mu.Unlock()
	_, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Abort{Abort: &kvpb.Abort{Ref: RefToPB(r)}}})
	c.handedBack(session, err)
	return err
}

func keysToPB(keys []BlockKey) *kvpb.Keys { return &kvpb.Keys{Keys: blockid.KeyBytes(keys)} }

// Acquire leases the longest published prefix of keys.
func (c *Client) Acquire(ctx context.Context, keys []BlockKey) ([]Ref, error) {
	resp, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Acquire{Acquire: keysToPB(keys)}})
	if err != nil {
		return nil, err
	}
	refs := RefsFromPB(resp.Refs)
	c.mu.Lock()
	for _, r := range refs {
		c.leased[r.Slot] = r
	}
	c.mu.Unlock()
	return refs, nil
}

// Lookup counts the published leading keys.
func (c *Client) Lookup(ctx context.Context, keys []BlockKey) (int, error) {
	resp, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Lookup{Lookup: keysToPB(keys)}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// Release drops a lease (as Abort, by the session's expiry should the
// owner not answer).
func (c *Client) Release(ctx context.Context, r Ref) error {
	c.mu.Lock()
	delete(c.leased, r.Slot)
	session := c.hello.GetSession()
	c.mu.Unlock()
	_, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Release{Release: &kvpb.RefOnly{Ref: RefToPB(r)}}})
	c.handedBack(session, err)
	return err
}

// Delete compare-and-deletes a published block.
func (c *Client) Delete(ctx context.Context, r Ref) error {
	_, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_Delete{Delete: &kvpb.RefOnly{Ref: RefToPB(r)}}})
	return err
}

// ReportCorrupt tells the owner a block did not verify.
func (c *Client) ReportCorrupt(ctx context.Context, r Ref) (bool, error) {
	resp, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_ReportCorrupt{ReportCorrupt: &kvpb.RefOnly{Ref: RefToPB(r)}}})
	if err != nil {
		return false, err
	}
	return resp.Dropped, nil
}
