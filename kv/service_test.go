package kv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/shm"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// serveOwner runs an owner with the real clock behind a socket.
func serveOwner(t *testing.T, slots int, ttl time.Duration) (*Owner, string) {
	t.Helper()
	env := newOwnerEnv(t, slots)
	env.opts.Now = nil
	env.opts.LeaseTTL = ttl
	env.opts.Geometry.PayloadSize = kvcache.NewLayout(2, 32, 16).BlockBytes()
	o := env.open(t)
	sock := filepath.Join(t.TempDir(), "kv.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o, sock) }()
	t.Cleanup(func() {
		cancel()
		<-done
		o.Close()
	})
	proctest.WaitFor(t, 10*time.Second, "the owner socket to come up", func() (bool, string) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return o, sock
}

var cacheLayout = kvcache.NewLayout(2, 32, 16)

func cacheIdentity() Identity {
	id := testID
	id.BlockSize = 16
	id.Layout = cacheLayout.String()
	return id
}

func newTestCache(t *testing.T, sock, instance string) (*kvclient.Cache, *kvclient.Client) {
	t.Helper()
	c, err := kvclient.Dial(context.Background(), sock, Writer{Instance: instance, Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := kvclient.NewCache(c, cacheLayout, cacheIdentity(), 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close(); c.Close() })
	return cache, c
}

// TestHandoffIsZeroCopy: a block written by one cache (one mapping, as one
// process) and acquired by another (its own mapping) is read in place:
// the reader's slice lies inside its own mapping of the arena, and a byte
// written through the writer's mapping afterwards is visible to the reader.
func TestHandoffIsZeroCopy(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 32, 3*time.Second)
	w, _ := newTestCache(t, sock, "writer")
	r, _ := newTestCache(t, sock, "reader")
	tokens := make([]int, 40)
	for i := range tokens {
		tokens[i] = 100 + i
	}
	var ids []kvcache.BlockID
	for b := 0; b < 2; b++ {
		id, err := w.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		blk := w.Block(id)
		for i := range blk {
			blk[i] = float32(b*1000 + i)
		}
		w.Publish(id, parentOf(ids), tokens[:(b+1)*16])
		ids = append(ids, id)
	}
	if st := w.Stats(); st.Published != 2 {
		t.Fatalf("writer stats %+v", st)
	}
	got := r.AcquirePrefix(tokens, 2)
	if len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("reader acquired %v, want %v", got, ids)
	}
	rb := r.Block(got[1])
	if !r.Contains(&rb[0]) || r.Arena().Base() == w.Arena().Base() {
		t.Fatal("reader's block is not in its own mapping of the arena")
	}
	if rb[5] != 1005 {
		t.Fatalf("reader sees %v", rb[5])
	}
	w.Block(ids[1])[5] = 42 // through the writer's mapping
	if rb[5] != 42 {
		t.Fatal("reader does not see the writer's memory: the block was copied")
	}
	w.Block(ids[1])[5] = 1005
	// Another identity misses.
	oc, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "other", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	otherID := cacheIdentity()
	otherID.ModelRevision = "different"
	other, err := kvclient.NewCache(oc, cacheLayout, otherID, 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(); oc.Close() })
	if ids := other.AcquirePrefix(tokens, 2); len(ids) != 0 {
		t.Fatalf("different revision hit %d blocks", len(ids))
	}
	// Everything handed back on close: no leases left, blocks stay cached.
	r.Close()
	w.Close()
	if st := o.Stats(); st.Leases != 0 || st.ByState["PUBLISHED"] != 2 || st.SlotsInUse != 2 {
		t.Fatalf("after close: %+v", st)
	}
}

func TestCorruptBlockDetectedOnAcquire(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 32, 3*time.Second)
	w, _ := newTestCache(t, sock, "writer")
	tokens := make([]int, 33)
	var ids []kvcache.BlockID
	for b := 0; b < 2; b++ {
		id, _ := w.Alloc()
		blk := w.Block(id)
		for i := range blk {
			blk[i] = float32(i)
		}
		w.Publish(id, parentOf(ids), tokens[:(b+1)*16])
		ids = append(ids, id)
	}
	w.Block(ids[1])[7] = -1 // scribble after publish
	r, _ := newTestCache(t, sock, "reader")
	got := r.AcquirePrefix(tokens, 2)
	if len(got) != 1 || r.Stats().CorruptOnRead != 1 {
		t.Fatalf("acquired %v, stats %+v; want the intact first block only", got, r.Stats())
	}
	if st := o.Stats(); st.CorruptDropped != 1 || st.ByState["PUBLISHED"] != 1 {
		t.Fatalf("owner after report: %+v", st)
	}
}

func TestProtocolAbuse(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 8, 3*time.Second)
	// Operations before hello are refused with a typed error.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rawRoundTrip(c, allocReq(1)); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("allocate before hello: %v", err)
	}
	c.Close()
	// Garbage and an oversized frame close the connection, nothing else.
	for _, junk := range [][]byte{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, {0x05, 1, 2, 3, 4, 5}} {
		c, _ := net.Dial("unix", sock)
		c.Write(junk)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("server answered garbage")
		}
		c.Close()
	}
	// A bad key length is a typed error (sent raw: the client's Seal takes
	// whole keys only).
	raw, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := rawRoundTrip(raw, helloReq(Writer{Instance: "raw", Gen: 1})); err != nil {
		t.Fatal(err)
	}
	resp, err := rawRoundTrip(raw, allocReq(1))
	if err != nil || len(resp.Refs) != 1 {
		t.Fatalf("raw allocate: %v %v", resp, err)
	}
	if _, err := rawRoundTrip(raw, sealReq(kvclient.RefFromPB(resp.Refs[0]), []byte{1, 2, 3})); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("short key: %v", err)
	}
	client, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Allocate(context.Background(), 1<<20); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("huge allocation: %v", err)
	}
	if st := o.Stats(); st.SlotsInUse != 1 {
		t.Fatalf("owner state changed by bad requests: %+v", st)
	}
}

func TestClientReattachesAfterOwnerRestart(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 8)
	env.opts.Now = nil
	env.opts.Geometry.PayloadSize = 64
	sock := filepath.Join(t.TempDir(), "kv.sock")
	start := func() (*Owner, func()) {
		o := env.open(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, o, sock) }()
		waitServing(t, sock)
		return o, func() { cancel(); <-done; o.Close() }
	}
	o, stop := start()
	client, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "w", Gen: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	refs, _ := client.Allocate(context.Background(), 2)
	a := o.Arena()
	copy(a.Payload(int(refs[0].Slot)), "abcdefgh")
	r := refs[0]
	r.PayloadLen, r.Checksum = 8, shm.Checksum([]byte("abcdefgh"))
	if err := client.Seal(context.Background(), r, BlockKey{5}, BlockKey{}); err != nil {
		t.Fatal(err)
	}
	stop() // the owner goes away; the arena and manifests stay
	o, stop = start()
	defer stop()
	// The next call finds its session unknown, re-attaches both blocks and
	// goes on: the sealed one publishes.
	if err := client.Publish(context.Background(), r); err != nil {
		t.Fatalf("publish after owner restart: %v", err)
	}
	if err := client.Abort(context.Background(), refs[1]); err != nil {
		t.Fatalf("abort after owner restart: %v", err)
	}
	if st := o.Stats(); st.ByState["PUBLISHED"] != 1 || st.SlotsInUse != 1 {
		t.Fatalf("after re-attach: %+v", st)
	}
}

func parentOf(ids []kvcache.BlockID) kvcache.BlockID {
	if len(ids) == 0 {
		return kvcache.NoBlock
	}
	return ids[len(ids)-1]
}

// TestNoGoroutineLeak: a served owner with clients that come and go leaves
// no goroutines behind once everything is closed.
// Not in parallel: it counts the process's goroutines.
func TestNoGoroutineLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	var late *kvclient.Client
	func() {
		env := newOwnerEnv(t, 16)
		env.opts.Now = nil
		env.opts.Geometry.PayloadSize = cacheLayout.BlockBytes()
		o := env.open(t)
		defer o.Close()
		sock := filepath.Join(t.TempDir(), "kv.sock")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, o, sock) }()
		defer func() { cancel(); <-done }()
		waitServing(t, sock)
		for i := 0; i < 5; i++ {
			c, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "w", Gen: uint64(i)})
			if err != nil {
				t.Fatal(err)
			}
			cache, err := kvclient.NewCache(c, cacheLayout, cacheIdentity(), 4)
			if err != nil {
				t.Fatal(err)
			}
			id, _ := cache.Alloc()
			cache.Publish(id, kvcache.NoBlock, make([]int, 16))
			cache.Close()
			c.Close()
		}
		// One client is still connected when the server stops.
		var err error
		if late, err = kvclient.Dial(context.Background(), sock, Writer{Instance: "late", Gen: 1}); err != nil {
			t.Fatal(err)
		}
	}()
	waitGoroutines := func(max int) {
		last, ok := proctest.Poll(10*time.Second, func() (bool, string) {
			n := runtime.NumGoroutine()
			return n <= max, fmt.Sprintf("%d goroutines, want at most %d", n, max)
		})
		if !ok {
			buf := make([]byte, 1<<16)
			t.Fatalf("%s:\n%s", last, buf[:runtime.Stack(buf, true)])
		}
	}
	// The still-connected client's keepalive goroutine is the one allowed
	// survivor; everything of the server must be gone. Then it goes too.
	waitGoroutines(base + 1)
	late.Close()
	waitGoroutines(base)
}

// TestStaleReferenceReadIsAMiss: between the owner handing out a reference
// and the reader using it, the slot moves to another generation; the
// reader's own check of the header makes that a miss, never a read.
func TestStaleReferenceReadIsAMiss(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 8, 3*time.Second)
	w, _ := newTestCache(t, sock, "writer")
	tokens := make([]int, 17)
	id, _ := w.Alloc()
	w.Publish(id, kvcache.NoBlock, tokens[:16])
	// Simulate the slot's reuse behind the manifest's back: the header
	// generation moves on, the manifest still names the old one.
	h, err := o.Arena().Header(int(id))
	if err != nil {
		t.Fatal(err)
	}
	h.Gen++
	o.Arena().SetHeader(int(id), h)
	r, _ := newTestCache(t, sock, "reader")
	if got := r.AcquirePrefix(tokens, 1); len(got) != 0 {
		t.Fatalf("read through a stale reference: %v", got)
	}
	if r.Stats().CorruptOnRead != 1 || r.Stats().Reused != 0 {
		t.Fatalf("reader stats %+v", r.Stats())
	}
}

// TestClientFencesItselfWhenTheOwnerGoes: with the owner gone, renewals
// stop; before the owner could have expired the session, the client
// declares its blocks lost, and the cache stops vouching for them.
func TestClientFencesItselfWhenTheOwnerGoes(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 8)
	env.opts.Now = nil
	env.opts.LeaseTTL = 300 * time.Millisecond
	env.opts.Geometry.PayloadSize = cacheLayout.BlockBytes()
	o := env.open(t)
	sock := filepath.Join(t.TempDir(), "kv.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o, sock) }()
	waitServing(t, sock)
	c, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cache, err := kvclient.NewCache(c, cacheLayout, cacheIdentity(), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	id, err := cache.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	if !cache.Valid(id) || cache.Losses() != 0 {
		t.Fatal("fresh block not valid")
	}
	stopped := time.Now()
	cancel()
	<-done
	o.Close()
	proctest.WaitFor(t, 10*time.Second, "the client to give up its blocks", func() (bool, string) {
		return !cache.Valid(id), "the block is still valid"
	})
	if elapsed := time.Since(stopped); elapsed > 300*time.Millisecond {
		t.Logf("fenced %v after the owner stopped (lease TTL 300ms)", elapsed)
	}
	// With the owner away, new blocks come from private memory.
	pid, err := cache.Alloc()
	if err != nil || pid < kvclient.PrivateBase || cache.Stats().Fallback != 1 {
		t.Fatalf("fallback allocation: %v %v %+v", pid, err, cache.Stats())
	}
	if err := cache.Free(pid); err != nil {
		t.Fatal(err)
	}
}

func waitServing(t *testing.T, sock string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := WaitServing(ctx, sock); err != nil {
		t.Fatal(err)
	}
}

// TestOnLostMayCallTheClient: an owner that comes back without our blocks
// (another arena) makes the next call report them lost; OnLost runs with
// nothing of the client held, so it may call the client itself.
func TestOnLostMayCallTheClient(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "kv.sock")
	serve := func(env *ownerEnv) func() {
		env.opts.Now = nil
		env.opts.Geometry.PayloadSize = 64
		o := env.open(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, o, sock) }()
		waitServing(t, sock)
		return func() { cancel(); <-done; o.Close() }
	}
	stop := serve(newOwnerEnv(t, 8))
	client, err := kvclient.Dial(context.Background(), sock, Writer{Instance: "w", Gen: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	refs, err := client.Allocate(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	defer serve(newOwnerEnv(t, 8))()
	lost := make(chan []Ref, 1)
	client.OnLost(func(rs []Ref) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := client.Allocate(ctx, 1) // calls the client from the callback
		if err != nil {
			t.Errorf("a call from OnLost: %v", err)
		}
		lost <- rs
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Allocate(ctx, 1); err != nil {
		t.Fatalf("allocate after the owner lost our blocks: %v", err)
	}
	select {
	case rs := <-lost:
		if len(rs) != 1 || rs[0] != refs[0] {
			t.Fatalf("reported lost %v, want %v", rs, refs)
		}
	case <-ctx.Done():
		t.Fatal("OnLost never returned: it could not call the client")
	}
}
