package decode

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/shm"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// freezer sits between the worker and the arena owner and can freeze like
// a SIGSTOPped owner: connections are still accepted by the kernel and
// bytes still sent, but nothing is answered until it thaws, when
// everything queued meanwhile (stale hellos included) is delivered.
type freezer struct {
	mu     sync.Mutex
	frozen bool
	thawed *sync.Cond
}

func (f *freezer) set(frozen bool) {
	f.mu.Lock()
	f.frozen = frozen
	f.mu.Unlock()
	f.thawed.Broadcast()
}

func (f *freezer) wait() {
	f.mu.Lock()
	for f.frozen {
		f.thawed.Wait()
	}
	f.mu.Unlock()
}

func startFreezer(t *testing.T, listen, owner string) *freezer {
	f := &freezer{}
	f.thawed = sync.NewCond(&f.mu)
	ln, err := net.Listen("unix", listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.set(false); ln.Close() })
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			f.wait()
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				f.wait()
				o, err := net.Dial("unix", owner)
				if err != nil {
					c.Close()
					return
				}
				go pipe(o, c)
				pipe(c, o)
			}()
		}
	}()
	return f
}

// TestOwnerFrozenMidStreamKeepsDecoding: the arena owner stops answering
// (as a SIGSTOPped agent) for several lease TTLs while a sequence decodes
// from arena blocks. Tokens keep coming during the freeze (the client
// fences itself in time and the sequence goes on from private memory),
// the stream ends exactly as a run that never used the arena, and after
// the owner thaws new requests use the arena again.
func TestOwnerFrozenMidStreamKeepsDecoding(t *testing.T) {
	if testing.Short() {
		t.Skip("-short tier: generates 800 tokens of the small preset twice (make test runs it)")
	}
	dir := t.TempDir()
	f, err := os.CreateTemp("/dev/shm", "lifeline-enginetest-*")
	if err != nil {
		t.Fatal(err)
	}
	arena := f.Name()
	f.Close()
	os.Remove(arena)
	defer os.Remove(arena)
	const ttl = 300 * time.Millisecond
	o, err := kv.Open(kv.Options{ArenaPath: arena, Geometry: shm.Geometry{Slots: 256, PayloadSize: 1 << 20}, DBDir: filepath.Join(dir, "db"), LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	sock := filepath.Join(dir, "kv.sock")
	ctx, stopOwner := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- kv.Serve(ctx, o, sock) }()
	defer func() { stopOwner(); <-served }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := kv.WaitServing(wctx, sock); err != nil {
		t.Fatal(err)
	}
	front := filepath.Join(dir, "front.sock")
	fr := startFreezer(t, front, sock)

	// Long enough to outlast the freeze (4 × ttl) at the engine's speed:
	// 800 tokens took ~1.4 s, barely more.
	req := Request{Prompt: "Once upon a time there was a dog", MaxTokens: 1600, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 77}}
	ref, err := NewEngine(Options{Preset: "small", WeightSeed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	want := generate(t, ref, req)

	e, err := NewEngine(Options{Preset: "small", WeightSeed: 1, KVSocket: front, InstanceID: "decode-1", Generation: 1,
		Limits: sched.Limits{MaxRunning: 4, MaxQueued: 4, MaxStepTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ch, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []Event
	next := func() Event {
		select {
		case ev := <-ch:
			if ev.Done && ev.FinishReason != sched.FinishLength {
				t.Fatalf("stream ended with %+v after %d tokens", ev, len(got))
			}
			return ev
		case <-time.After(5 * time.Second):
			t.Fatalf("no token for 5 s after %d tokens", len(got))
			return Event{}
		}
	}
	for len(got) < 20 {
		got = append(got, next())
	}
	fr.set(true)
	frozenAt, during := time.Now(), 0
	for time.Since(frozenAt) < 4*ttl {
		ev := next()
		if ev.Done {
			t.Fatalf("stream ended during the freeze after %d tokens", len(got))
		}
		got = append(got, ev)
		during++
	}
	if during < 10 {
		t.Fatalf("%d tokens during a freeze of %v", during, 4*ttl)
	}
	cs := e.Cache.Stats()
	fr.set(false)
	for {
		ev := next()
		if ev.Done {
			break
		}
		got = append(got, ev)
	}
	if len(got) != len(want.events) {
		t.Fatalf("%d tokens, want %d", len(got), len(want.events))
	}
	for i := range got {
		if got[i].TokenID != want.events[i].TokenID || got[i].Text != want.events[i].Text {
			t.Fatalf("token %d differs after the owner's freeze", i+1)
		}
	}
	if cs.Lost == 0 || e.Stats().Recomputed == 0 {
		t.Fatalf("freeze did not outlast the lease: cache %+v, sched %+v", cs, e.Stats())
	}
	// Thawed: a new request publishes its blocks to the arena again.
	proctest.WaitFor(t, 10*time.Second, "the client to reach the owner again", func() (bool, string) {
		return e.Cache.Client().Reachable(), "unreachable"
	})
	before := e.Cache.Stats().Published
	if r := generate(t, e, Request{Prompt: "After the thaw, a story about a cat who liked the sea", MaxTokens: 40, IgnoreEOS: true}); r.finish.FinishReason != sched.FinishLength {
		t.Fatalf("request after the thaw: %+v", r.finish)
	}
	if after := e.Cache.Stats().Published; after <= before {
		t.Fatalf("no block published after the thaw (%d before, %d after): %+v", before, after, e.Cache.Stats())
	}
}
