package kv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// proxy forwards a unix socket to the owner's. Paused, it holds every
// byte on the connections it has in both directions (a stalled line) and
// delivers them once resumed, and closes new connections at once (a hello
// meanwhile may or may not have arrived). Refusing, it listens no more: a
// dial fails, and nothing is sent.
type proxy struct {
	t        *testing.T
	sock     string
	target   string
	wg       sync.WaitGroup
	mu       sync.Mutex
	cond     *sync.Cond
	paused   bool
	ln       net.Listener // nil while refusing
	accepted int          // connections forwarded
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{t: t, sock: filepath.Join(t.TempDir(), "proxy.sock"), target: target}
	p.cond = sync.NewCond(&p.mu)
	p.listen()
	t.Cleanup(func() {
		p.Pause(false)
		p.Refuse(true)
		p.wg.Wait()
	})
	return p
}

// listen opens the socket and accepts on it until it is closed.
func (p *proxy) listen() {
	ln, err := net.Listen("unix", p.sock)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			refuse := p.paused
			if !refuse {
				p.accepted++
			}
			p.mu.Unlock()
			if refuse {
				c.Close()
				continue
			}
			o, err := net.Dial("unix", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.wg.Go(func() { p.pipe(o, c) })
			p.wg.Go(func() { p.pipe(c, o); c.Close() })
		}
	})
}

func (p *proxy) conns() int { p.mu.Lock(); defer p.mu.Unlock(); return p.accepted }

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.paused {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *proxy) Pause(on bool) {
	p.mu.Lock()
	p.paused = on
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *proxy) Refuse(on bool) {
	p.mu.Lock()
	ln := p.ln
	if on {
		p.ln = nil
	}
	p.mu.Unlock()
	switch {
	case on && ln != nil:
		ln.Close() // removes the socket file too
	case !on && ln == nil:
		p.listen()
	}
}

// slotState is the owner's state of slot.
func slotState(o *Owner, slot uint32) State {
	for _, s := range o.List() {
		if s.Slot == slot {
			for st := range Aborted + 1 {
				if st.String() == s.State {
					return st
				}
			}
			panic("unknown state " + s.State)
		}
	}
	return Free
}

// waitFreed waits until the owner has freed slot.
func waitFreed(t *testing.T, o *Owner, slot uint32, why string) {
	t.Helper()
	proctest.WaitFor(t, 10*time.Second, why, func() (bool, string) {
		st := slotState(o, slot)
		return st == Free, fmt.Sprintf("slot %d is %s at the owner (%d sessions)", slot, st, o.Stats().Sessions)
	})
}

// TestAFailedAbortStillFreesTheSlot: an Abort that never reaches the owner
// (its ctx ended first; the owner away) leaves the client without the
// block. Its session was renewed for the worker's whole life, so the slot
// stayed WRITING for good (three such slots outlived a soak's load). The
// client now leaves that session to expire under a new one: the slot is
// freed, and the block it still holds moves to the new session intact.
// Not in parallel: its waits are timed against a 600 ms lease.
func TestAFailedAbortStillFreesTheSlot(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 8, 600*time.Millisecond)
	c, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	refs, err := c.Allocate(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	keep, drop := refs[0], refs[1]
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Abort(gone, drop); err == nil {
		t.Fatal("an Abort with its ctx ended succeeded")
	}
	waitFreed(t, o, drop.Slot, "the owner to free the block whose Abort never arrived")
	// Three lease times later the kept block is still the client's.
	proctest.Never(t, 1800*time.Millisecond, "the kept block freed", func() (bool, string) {
		st := slotState(o, keep.Slot)
		return st != Writing, "slot is " + st.String()
	})
	if err := c.Abort(context.Background(), keep); err != nil {
		t.Fatalf("abort the kept block under the new session: %v", err)
	}
	if st := slotState(o, keep.Slot); st != Free {
		t.Fatalf("kept block after its Abort: %s", st)
	}
}

// TestAFencedClientsSlotsReturnToTheOwner: the client stops trusting its
// lease a third of the TTL before the owner would expire it. A stall of
// the line between the two (new connections failing meanwhile, so that
// no new session replaces the old) makes it give up its blocks (a Fence
// before a step, or its keepalive goroutine); the renewals then get
// through, and
// the session lived on at the owner with those slots WRITING for as long
// as the worker lived. Now the session is abandoned and expires (a hello
// does not end a session whose blocks the client forgot: see
// Client.forgot), and the owner frees them.
// Not in parallel: its stall must end within the lease.
func TestAFencedClientsSlotsReturnToTheOwner(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	o, target := serveOwner(t, 8, ttl)
	p := newProxy(t, target)
	c, err := kvclient.Dial(context.Background(), p.sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	refs, err := c.Allocate(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lost []Ref
	c.OnLost(func(rs []Ref) { mu.Lock(); lost = append(lost, rs...); mu.Unlock() })
	before := o.Stats().SessionsExpired
	p.Pause(true)
	proctest.WaitFor(t, ttl, "the client to give its block up", func() (bool, string) {
		c.Fence()
		mu.Lock()
		defer mu.Unlock()
		return len(lost) == 1 && lost[0] == refs[0], fmt.Sprintf("lost %v", lost)
	})
	p.Pause(false)
	if o.Stats().SessionsExpired != before {
		t.Fatal("the owner expired the session during the stall: the stall outlasted the lease, and this tests nothing")
	}
	waitFreed(t, o, refs[0].Slot, "the owner to free the fenced block")
	// It expired: a step in flight when the client fenced may still
	// write the block, and the TTL/3 between the fence and the expiry is
	// its margin. The next hello must not end that session at once.
	if st := o.Stats(); st.SessionsReplaced != 0 || st.SessionsExpired == before {
		t.Fatalf("the fenced session: %d replaced, %d expired (want 0, and 1 more)", st.SessionsReplaced, st.SessionsExpired-before)
	}
	// The client goes on under a new session.
	got, err := c.Allocate(context.Background(), 1)
	if err != nil || slotState(o, got[0].Slot) != Writing {
		t.Fatalf("allocate after the fence: %v %v", got, err)
	}
}

// TestAnAbandonedSessionLivesUntilReplaced: with the owner answering its
// renewals but no new connection getting through, the session a failed
// Abort abandoned cannot be replaced yet. It is renewed meanwhile: left
// to expire with no other session of this writer, the agent would fence
// (kill) the worker for what was a slow call, and the block it still
// holds would go. Once connections get through, a new session takes that
// block over and the abandoned one expires with the other.
// Not in parallel: its waits are timed against a 600 ms lease.
func TestAnAbandonedSessionLivesUntilReplaced(t *testing.T) {
	t.Parallel()
	const ttl = 600 * time.Millisecond
	o, target := serveOwner(t, 8, ttl)
	p := newProxy(t, target)
	c, err := kvclient.Dial(context.Background(), p.sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	refs, err := c.Allocate(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	keep, drop := refs[0], refs[1]
	// The keepalive goroutine's own connection is up before new ones fail.
	proctest.WaitFor(t, 5*time.Second, "a renewal", func() (bool, string) {
		return p.conns() >= 2, fmt.Sprintf("%d connections", p.conns())
	})
	p.Refuse(true)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Abort(gone, drop); err == nil {
		t.Fatal("an Abort with its ctx ended succeeded")
	}
	before := o.Stats().SessionsExpired
	proctest.Never(t, 3*ttl, "the abandoned session expired with no new one", func() (bool, string) {
		st := o.Stats()
		return st.SessionsExpired != before || slotState(o, keep.Slot) != Writing,
			fmt.Sprintf("%d sessions expired, kept slot %s", st.SessionsExpired-before, slotState(o, keep.Slot))
	})
	p.Refuse(false)
	waitFreed(t, o, drop.Slot, "the owner to free the block whose Abort never arrived")
	if st := slotState(o, keep.Slot); st != Writing {
		t.Fatalf("the kept block, once the session was replaced: %s", st)
	}
	if err := c.Abort(context.Background(), keep); err != nil {
		t.Fatalf("abort the kept block under the new session: %v", err)
	}
}

// TestALateAcquireLeavesNoLease: an Acquire that got no answer in time
// (the owner stalled, as a SIGSTOP of the agent stalls it) still reaches
// the owner once it resumes, which leases the blocks to the session of
// the connection the client gave up. The client never learnt of those
// leases: the session held them until it expired, a lease TTL after its
// last renewal plus however long the owner had stalled (drill 7 counted
// 19 such leases, one prompt's prefix, still held 15 s after a 4 s
// pause). The client's next hello now replaces that session, and the
// owner ends it at once: the leases go with it.
// Not in parallel: its stall must end within the lease.
func TestALateAcquireLeavesNoLease(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	o, target := serveOwner(t, 8, ttl)
	sid := hello(t, o, "writer", 1)
	key := BlockKey{7}
	r := writeBlock(t, o, sid, key, BlockKey{}, 3, true)
	if err := o.Release(sid, r); err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, target)
	c, err := kvclient.Dial(context.Background(), p.sock, Writer{Instance: "reader", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Pause(true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err = c.Acquire(ctx, []BlockKey{key})
	cancel()
	if err == nil {
		t.Fatal("an Acquire through a stalled line succeeded")
	}
	p.Pause(false)
	proctest.WaitFor(t, 5*time.Second, "the late Acquire to lease the block", func() (bool, string) {
		n := o.Stats().Leases
		return n == 1, fmt.Sprintf("%d leases", n)
	})
	proctest.WaitFor(t, 5*time.Second, "a renewal to find the owner back", func() (bool, string) {
		return c.Reachable(), "unreachable"
	})
	// The client goes on under a new session: what it acquires now, it
	// holds and releases, and the lease it never learnt of is gone with
	// the session it replaced, at once (that session, renewed until now,
	// would have lived a TTL longer).
	refs, err := c.Acquire(context.Background(), []BlockKey{key})
	if err != nil || len(refs) != 1 {
		t.Fatalf("acquire after the stall: %v %v", refs, err)
	}
	if err := c.Release(context.Background(), refs[0]); err != nil {
		t.Fatal(err)
	}
	if st := o.Stats(); st.Leases != 0 || st.SessionsReplaced != 1 {
		t.Fatalf("after the new session's release: %d leases (%v), %d sessions replaced (want 0 and 1)", st.Leases, st.LeasesBy, st.SessionsReplaced)
	}
}
