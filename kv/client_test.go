package kv

import (
	"bufio"
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// stallingOwner answers hellos and keepalives and never answers anything
// else: a call to it stays in flight until its ctx ends.
// Each request it leaves unanswered is sent on the returned channel.
func stallingOwner(t *testing.T) (string, <-chan *kvpb.Request) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kv.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	stalled := make(chan *kvpb.Request, 16)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); stallConn(c, stalled) }()
		}
	}()
	return sock, stalled
}

func stallConn(c net.Conn, stalled chan<- *kvpb.Request) {
	r, w := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		var req kvpb.Request
		if frame.Read(r, &req) != nil {
			return
		}
		resp := &kvpb.Response{Id: req.Id}
		switch req.Op.(type) {
		case *kvpb.Request_Hello:
			resp.Hello = &kvpb.HelloReply{Session: 1, ArenaPath: "/nowhere", PayloadSize: 7, LeaseTtlMs: 60_000}
		case *kvpb.Request_KeepAlive:
		default:
			stalled <- &req
			continue // never answered
		}
		if frame.Write(w, resp) != nil || w.Flush() != nil {
			return
		}
	}
}

// TestClientCallHoldsNoLockAndHonoursCtx: while a call waits on an owner
// that does not answer, the client's state stays readable and a second
// call gives up when its ctx ends; cancelling the first call's ctx ends it
// long before its round-trip timeout.
func TestClientCallHoldsNoLockAndHonoursCtx(t *testing.T) {
	t.Parallel()
	sock, stalled := stallingOwner(t)
	c, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := c.Lookup(ctx, []BlockKey{{1}}); first <- err }()
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the first call never reached the owner")
	}
	short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	if _, err := c.Lookup(short, []BlockKey{{2}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call behind one in flight: %v, want its ctx's deadline", err)
	}
	proctest.Never(t, 100*time.Millisecond, "a second request on the connection while one is in flight", func() (bool, string) {
		select {
		case req := <-stalled:
			return true, req.String()
		default:
			return false, ""
		}
	})
	done := make(chan struct{})
	go func() { c.PayloadSize(); c.ArenaPath(); c.OnLost(func([]Ref) {}); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("client state is locked during a round trip")
	}
	cancelled := time.Now()
	cancel()
	select {
	case err := <-first:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v", err)
		}
		if d := time.Since(cancelled); d > 2*time.Second {
			t.Fatalf("cancelled call returned after %v", d)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("cancelling the ctx did not end the call (its round-trip timeout is 5s)")
	}
}
