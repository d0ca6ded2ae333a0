package kv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/internal/frame"
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

	mu     sync.Mutex
	conn   net.Conn
	r      *bufio.Reader
	w      *bufio.Writer
	nextID uint64
	hello  *kvpb.HelloReply
	owned  map[uint32]Ref
	leased map[uint32]Ref
	onLost func([]Ref)
	// validUntil is when our lease may end at the owner: the send time of
	// the last acknowledged renewal plus the TTL, less a margin.
	validUntil time.Time

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Dial connects to the owner's socket as writer and starts keepalives.
func Dial(ctx context.Context, socket string, w Writer) (*Client, error) {
	c := &Client{socket: socket, writer: w, owned: map[uint32]Ref{}, leased: map[uint32]Ref{}, stop: make(chan struct{}), done: make(chan struct{})}
	c.mu.Lock()
	err := c.connectLocked(ctx)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	go c.keepAlive()
	return c, nil
}

// OnLost registers the function told about blocks the client had to give
// up (their slots may be reused). It runs without the client's lock held.
func (c *Client) OnLost(f func([]Ref)) {
	c.mu.Lock()
	c.onLost = f
	c.mu.Unlock()
}

func (c *Client) ttl() time.Duration {
	if c.hello == nil {
		return 3 * time.Second
	}
	return time.Duration(c.hello.LeaseTtlMs) * time.Millisecond
}

// margin is how long before the owner could expire us we stop trusting
// our blocks: enough for a step in flight to notice at its end.
func (c *Client) margin() time.Duration { return c.ttl() / 3 }

// connectLocked dials and says hello, re-attaching what we hold. Blocks the
// owner does not confirm are returned as lost.
func (c *Client) connectLocked(ctx context.Context) error {
	lost, err := c.helloLocked(ctx)
	if len(lost) > 0 {
		c.reportLostLocked(lost)
	}
	return err
}

func (c *Client) helloLocked(ctx context.Context) ([]Ref, error) {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOwnerUnavailable, err)
	}
	c.conn, c.r, c.w = conn, bufio.NewReader(conn), bufio.NewWriter(conn)
	var owned, leased []Ref
	if time.Now().Before(c.validUntil) || c.validUntil.IsZero() {
		owned = slices.Collect(maps.Values(c.owned))
		leased = slices.Collect(maps.Values(c.leased))
	} else {
		// Our lease may already have ended at the owner: what we held is
		// not ours to re-attach.
		lost := append(slices.Collect(maps.Values(c.owned)), slices.Collect(maps.Values(c.leased))...)
		clear(c.owned)
		clear(c.leased)
		defer func() { c.reportLostLocked(lost) }()
	}
	hello := &kvpb.Hello{InstanceId: c.writer.Instance, Generation: c.writer.Gen}
	for _, r := range owned {
		hello.Owned = append(hello.Owned, toPB(r))
	}
	for _, r := range leased {
		hello.Leased = append(hello.Leased, toPB(r))
	}
	sent := time.Now()
	resp, err := c.roundTripLocked(&kvpb.Request{Op: &kvpb.Request_Hello{Hello: hello}})
	if err != nil {
		if c.conn != nil {
			c.conn.Close()
			c.conn = nil
		}
		return nil, err
	}
	c.hello = resp.Hello
	c.validUntil = sent.Add(c.ttl() - c.margin())
	var lost []Ref
	for i, r := range owned {
		if i >= len(resp.Hello.OwnedOk) || !resp.Hello.OwnedOk[i] {
			delete(c.owned, r.Slot)
			lost = append(lost, r)
		}
	}
	for i, r := range leased {
		if i >= len(resp.Hello.LeasedOk) || !resp.Hello.LeasedOk[i] {
			delete(c.leased, r.Slot)
			lost = append(lost, r)
		}
	}
	return lost, nil
}

// reportLostLocked calls OnLost without the lock.
func (c *Client) reportLostLocked(lost []Ref) {
	if len(lost) == 0 || c.onLost == nil {
		return
	}
	f := c.onLost
	c.mu.Unlock()
	f(lost)
	c.mu.Lock()
}

func (c *Client) rtt() time.Duration { return min(5*time.Second, c.ttl()/2) }

func (c *Client) roundTripLocked(req *kvpb.Request) (*kvpb.Response, error) {
	if c.conn == nil {
		return nil, ErrOwnerUnavailable
	}
	c.nextID++
	req.Id = c.nextID
	c.conn.SetDeadline(time.Now().Add(c.rtt()))
	if err := frame.Write(c.w, req); err != nil {
		return nil, c.brokenLocked(err)
	}
	if err := c.w.Flush(); err != nil {
		return nil, c.brokenLocked(err)
	}
	var resp kvpb.Response
	if err := frame.Read(c.r, &resp); err != nil {
		return nil, c.brokenLocked(err)
	}
	if resp.Id != req.Id {
		return nil, c.brokenLocked(fmt.Errorf("response %d to request %d", resp.Id, req.Id))
	}
	if resp.Code != kvpb.Code_OK {
		return nil, &RemoteError{Code: resp.Code, Message: resp.Message}
	}
	return &resp, nil
}

func (c *Client) brokenLocked(err error) error {
	c.conn.Close()
	c.conn = nil
	return fmt.Errorf("%w: %v", ErrOwnerUnavailable, err)
}

// call sends one request, reconnecting once if the connection is gone.
func (c *Client) call(req *kvpb.Request) (*kvpb.Response, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		if err := c.connectLocked(context.Background()); err != nil {
			return nil, err
		}
	}
	resp, err := c.roundTripLocked(req)
	if errors.Is(err, ErrUnknownSession) || errors.Is(err, ErrOwnerUnavailable) {
		// The owner restarted, the connection broke, or our lease lapsed:
		// reconnect, re-attach what we hold, and retry once. Seal and
		// Publish are idempotent at the owner; a retried Allocate whose
		// first copy did land leaks its slots until that session expires.
		if err := c.connectLocked(context.Background()); err != nil {
			return nil, err
		}
		resp, err = c.roundTripLocked(req)
	}
	return resp, err
}

// keepAlive renews the session on its own connection, so that a slow call
// on the main one never delays a renewal, and fences the client when
// renewals stop being acknowledged.
func (c *Client) keepAlive() {
	defer close(c.done)
	c.mu.Lock()
	ttl := c.ttl()
	c.mu.Unlock()
	t := time.NewTicker(max(ttl/6, 5*time.Millisecond))
	defer t.Stop()
	var conn net.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		session := c.hello.GetSession()
		deadline := c.validUntil
		c.mu.Unlock()
		sent := time.Now()
		err := func() error {
			if conn == nil {
				var err error
				if conn, err = net.DialTimeout("unix", c.socket, ttl/3); err != nil {
					conn = nil
					return err
				}
			}
			kc := &Client{conn: conn, r: bufio.NewReader(conn), w: bufio.NewWriter(conn), hello: &kvpb.HelloReply{LeaseTtlMs: uint64(ttl.Milliseconds())}}
			_, err := kc.roundTripLocked(&kvpb.Request{Op: &kvpb.Request_KeepAlive{KeepAlive: &kvpb.KeepAlive{Session: session}}})
			if kc.conn == nil {
				conn = nil
			}
			return err
		}()
		c.mu.Lock()
		switch {
		case err == nil && c.hello.GetSession() == session:
			c.validUntil = sent.Add(ttl - c.margin())
		case errors.Is(err, ErrUnknownSession) || time.Now().After(deadline):
			// The session is gone or may be: give everything up now and
			// start a new session.
			lost := append(slices.Collect(maps.Values(c.owned)), slices.Collect(maps.Values(c.leased))...)
			clear(c.owned)
			clear(c.leased)
			c.validUntil = time.Time{}
			c.reportLostLocked(lost)
			c.connectLocked(context.Background())
		}
		c.mu.Unlock()
	}
}

// Close stops keepalives and closes the connection. Blocks still owned or
// leased are left to the owner's lease expiry; call Abort/Release first for
// a prompt hand-back. Close may be called more than once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		close(c.stop)
		<-c.done
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.conn != nil {
			c.conn.Close()
			c.conn = nil
		}
	})
	return nil
}

// ArenaPath, Slots and PayloadSize describe the owner's arena.
func (c *Client) ArenaPath() string { c.mu.Lock(); defer c.mu.Unlock(); return c.hello.ArenaPath }
func (c *Client) PayloadSize() int  { c.mu.Lock(); defer c.mu.Unlock(); return int(c.hello.PayloadSize) }

// Allocate gets n slots in WRITING state.
func (c *Client) Allocate(n int) ([]Ref, error) {
	resp, err := c.call(&kvpb.Request{Op: &kvpb.Request_Allocate{Allocate: &kvpb.Allocate{Count: uint32(n)}}})
	if err != nil {
		return nil, err
	}
	refs := refsFromPB(resp.Refs)
	c.mu.Lock()
	for _, r := range refs {
		c.owned[r.Slot] = r
	}
	c.mu.Unlock()
	return refs, nil
}

// Seal records the block written in r's slot under key.
func (c *Client) Seal(r Ref, key, parent BlockKey) error {
	_, err := c.call(&kvpb.Request{Op: &kvpb.Request_Seal{Seal: &kvpb.Seal{Ref: toPB(r), Key: key[:], Parent: parent[:]}}})
	return err
}

// Publish makes a sealed block readable; the client then holds a lease on it.
func (c *Client) Publish(r Ref) error {
	_, err := c.call(&kvpb.Request{Op: &kvpb.Request_Publish{Publish: &kvpb.Publish{Ref: toPB(r)}}})
	if err == nil {
		c.mu.Lock()
		delete(c.owned, r.Slot)
		c.leased[r.Slot] = r
		c.mu.Unlock()
	}
	return err
}

// Abort discards a block the client writes.
func (c *Client) Abort(r Ref) error {
	c.mu.Lock()
	delete(c.owned, r.Slot)
	c.mu.Unlock()
	_, err := c.call(&kvpb.Request{Op: &kvpb.Request_Abort{Abort: &kvpb.Abort{Ref: toPB(r)}}})
	return err
}

func keysToPB(keys []BlockKey) *kvpb.Keys { return &kvpb.Keys{Keys: blockid.KeyBytes(keys)} }

// Acquire leases the longest published prefix of keys.
func (c *Client) Acquire(keys []BlockKey) ([]Ref, error) {
	resp, err := c.call(&kvpb.Request{Op: &kvpb.Request_Acquire{Acquire: keysToPB(keys)}})
	if err != nil {
		return nil, err
	}
	refs := refsFromPB(resp.Refs)
	c.mu.Lock()
	for _, r := range refs {
		c.leased[r.Slot] = r
	}
	c.mu.Unlock()
	return refs, nil
}

// Lookup counts the published leading keys.
func (c *Client) Lookup(keys []BlockKey) (int, error) {
	resp, err := c.call(&kvpb.Request{Op: &kvpb.Request_Lookup{Lookup: keysToPB(keys)}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// Release drops a lease.
func (c *Client) Release(r Ref) error {
	c.mu.Lock()
	delete(c.leased, r.Slot)
	c.mu.Unlock()
	_, err := c.call(&kvpb.Request{Op: &kvpb.Request_Release{Release: &kvpb.RefOnly{Ref: toPB(r)}}})
	return err
}

// Delete compare-and-deletes a published block.
func (c *Client) Delete(r Ref) error {
	_, err := c.call(&kvpb.Request{Op: &kvpb.Request_Delete{Delete: &kvpb.RefOnly{Ref: toPB(r)}}})
	return err
}

// ReportCorrupt tells the owner a block did not verify.
func (c *Client) ReportCorrupt(r Ref) (bool, error) {
	resp, err := c.call(&kvpb.Request{Op: &kvpb.Request_ReportCorrupt{ReportCorrupt: &kvpb.RefOnly{Ref: toPB(r)}}})
	if err != nil {
		return false, err
	}
	return resp.Dropped, nil
}

// AdminClient talks to the owner without a session: stats, sweeps and
// writer deaths (the agent's and operators' operations).
type AdminClient struct{ socket string }

// NewAdminClient returns a client for socket; each call is one connection.
func NewAdminClient(socket string) *AdminClient { return &AdminClient{socket: socket} }

func (a *AdminClient) call(req *kvpb.Request) (*kvpb.Response, error) {
	conn, err := net.DialTimeout("unix", a.socket, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOwnerUnavailable, err)
	}
	defer conn.Close()
	c := &Client{conn: conn, r: bufio.NewReader(conn), w: bufio.NewWriter(conn)}
	return c.roundTripLocked(req)
}

// Stats returns the owner's counts and counters.
func (a *AdminClient) Stats() (*kvpb.Stats, error) {
	resp, err := a.call(&kvpb.Request{Op: &kvpb.Request_Stats{Stats: &kvpb.Empty{}}})
	if err != nil {
		return nil, err
	}
	return resp.Stats, nil
}

// WriterDead reports a writer's death and returns how many blocks went.
func (a *AdminClient) WriterDead(w Writer) (int, error) {
	resp, err := a.call(&kvpb.Request{Op: &kvpb.Request_WriterDead{WriterDead: &kvpb.WriterDead{InstanceId: w.Instance, Generation: w.Gen}}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// Sweep runs one sweep now.
func (a *AdminClient) Sweep() (int, error) {
	resp, err := a.call(&kvpb.Request{Op: &kvpb.Request_Sweep{Sweep: &kvpb.Empty{}}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// Lookup counts the published leading keys.
func (a *AdminClient) Lookup(keys []BlockKey) (int, error) {
	resp, err := a.call(&kvpb.Request{Op: &kvpb.Request_Lookup{Lookup: keysToPB(keys)}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}
