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
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// ErrOwnerUnavailable is returned when the owner cannot be reached; callers
// degrade to recompute.
var ErrOwnerUnavailable = errors.New("kv: arena owner unavailable")

// Client is a worker's connection to the arena owner. It keeps its session
// alive, and after a lost connection or an owner restart it reconnects and
// re-attaches the blocks it writes and the leases it holds. Safe for
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

	stop chan struct{}
	done chan struct{}
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

func (c *Client) connectLocked(ctx context.Context) error {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrOwnerUnavailable, err)
	}
	c.conn, c.r, c.w = conn, bufio.NewReader(conn), bufio.NewWriter(conn)
	owned := slices.Collect(maps.Values(c.owned))
	leased := slices.Collect(maps.Values(c.leased))
	hello := &kvpb.Hello{InstanceId: c.writer.Instance, Generation: c.writer.Gen}
	for _, r := range owned {
		hello.Owned = append(hello.Owned, toPB(r))
	}
	for _, r := range leased {
		hello.Leased = append(hello.Leased, toPB(r))
	}
	resp, err := c.roundTripLocked(&kvpb.Request{Op: &kvpb.Request_Hello{Hello: hello}})
	if err != nil {
		conn.Close()
		c.conn = nil
		return err
	}
	c.hello = resp.Hello
	// Forget what the owner no longer knows: those blocks are gone.
	for i, ok := range resp.Hello.OwnedOk {
		if !ok && i < len(owned) {
			delete(c.owned, owned[i].Slot)
		}
	}
	for i, ok := range resp.Hello.LeasedOk {
		if !ok && i < len(leased) {
			delete(c.leased, leased[i].Slot)
		}
	}
	return nil
}

func (c *Client) roundTripLocked(req *kvpb.Request) (*kvpb.Response, error) {
	if c.conn == nil {
		return nil, ErrOwnerUnavailable
	}
	c.nextID++
	req.Id = c.nextID
	c.conn.SetDeadline(time.Now().Add(5 * time.Second))
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
		// reconnect, re-attach what we hold, and retry once. A retried
		// request whose first copy did take effect fails with a typed
		// error (stale, not owner) rather than acting twice.
		if err := c.connectLocked(context.Background()); err != nil {
			return nil, err
		}
		resp, err = c.roundTripLocked(req)
	}
	return resp, err
}

func (c *Client) keepAlive() {
	defer close(c.done)
	c.mu.Lock()
	ttl := time.Duration(c.hello.LeaseTtlMs) * time.Millisecond
	c.mu.Unlock()
	t := time.NewTicker(max(ttl/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.call(&kvpb.Request{Op: &kvpb.Request_KeepAlive{KeepAlive: &kvpb.Empty{}}})
		}
	}
}

// Close stops keepalives and closes the connection. Blocks still owned or
// leased are left to the owner's lease expiry; call Abort/Release first for
// a prompt hand-back.
func (c *Client) Close() error {
	close(c.stop)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
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

func keysToPB(keys []BlockKey) *kvpb.Keys {
	ks := &kvpb.Keys{}
	for _, k := range keys {
		ks.Keys = append(ks.Keys, append([]byte(nil), k[:]...))
	}
	return ks
}

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
