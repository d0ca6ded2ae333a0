package kv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/proctest"
)

// pausingProxy forwards a unix socket to the owner's. While paused it
// holds every byte on the connections it has in both directions (a
// stalled line) and delivers them once resumed, and it closes new
// connections at once: a dial or hello meanwhile fails.
func pausingProxy(t *testing.T, target string) (sock string, pause func(bool)) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "proxy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	paused := false
	gate := func() {
		mu.Lock()
		for paused {
			cond.Wait()
		}
		mu.Unlock()
	}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			gate()
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
	var wg sync.WaitGroup
	t.Cleanup(func() {
		pause(false)
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			refuse := paused
			mu.Unlock()
			if refuse {
				c.Close()
				continue
			}
			o, err := net.Dial("unix", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() { pipe(o, c) })
			wg.Go(func() { pipe(c, o); c.Close() })
		}
	})
	pause = func(p bool) {
		mu.Lock()
		paused = p
		cond.Broadcast()
		mu.Unlock()
	}
	return sock, pause
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
func TestAFailedAbortStillFreesTheSlot(t *testing.T) {
	o, sock := serveOwner(t, 8, 600*time.Millisecond)
	c, err := Dial(context.Background(), sock, Writer{"w", 1})
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
// as the worker lived. Now the session is abandoned and expires, and the
// owner frees them.
func TestAFencedClientsSlotsReturnToTheOwner(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	o, target := serveOwner(t, 8, ttl)
	sock, pause := pausingProxy(t, target)
	c, err := Dial(context.Background(), sock, Writer{"w", 1})
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
	pause(true)
	proctest.WaitFor(t, ttl, "the client to give its block up", func() (bool, string) {
		c.Fence()
		mu.Lock()
		defer mu.Unlock()
		return len(lost) == 1 && lost[0] == refs[0], fmt.Sprintf("lost %v", lost)
	})
	pause(false)
	if o.Stats().SessionsExpired != before {
		t.Fatal("the owner expired the session during the stall: the stall outlasted the lease, and this tests nothing")
	}
	waitFreed(t, o, refs[0].Slot, "the owner to free the fenced block")
	// The client goes on under a new session.
	got, err := c.Allocate(context.Background(), 1)
	if err != nil || slotState(o, got[0].Slot) != Writing {
		t.Fatalf("allocate after the fence: %v %v", got, err)
	}
}
