package decode

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/shm"
)

// TestOwnerLossMidStreamRecomputes: the arena owner goes away while a
// sequence decodes from arena blocks. The worker's client fences itself,
// the scheduler recomputes the sequence from its tokens on private memory,
// and the stream ends exactly as a run that never used the arena.
func TestOwnerLossMidStreamRecomputes(t *testing.T) {
	dir := t.TempDir()
	f, err := os.CreateTemp("/dev/shm", "lifeline-enginetest-*")
	if err != nil {
		t.Fatal(err)
	}
	arena := f.Name()
	f.Close()
	os.Remove(arena)
	defer os.Remove(arena)
	o, err := kv.Open(kv.Options{ArenaPath: arena, Geometry: shm.Geometry{Slots: 128, PayloadSize: 8192}, DBDir: filepath.Join(dir, "db"), LeaseTTL: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "kv.sock")
	ctx, stopOwner := context.WithCancel(context.Background())
	defer stopOwner()
	served := make(chan error, 1)
	go func() { served <- kv.Serve(ctx, o, sock) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := kv.WaitServing(wctx, sock); err != nil {
		t.Fatal(err)
	}

	req := Request{Prompt: "Once upon a time there was a dog", MaxTokens: 480, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 77}}
	private := newTinyEngine(t)
	want := generate(t, private, req)

	e, err := NewEngine(Options{Preset: "tiny", WeightSeed: 1, KVSocket: sock, InstanceID: "decode-1", Generation: 1,
		Limits: sched.Limits{MaxRunning: 4, MaxQueued: 4, MaxStepTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// Slow the engine down with filler sequences so that the owner's loss
	// lands mid-stream.
	for i := 0; i < 3; i++ {
		if _, err := e.Generate(context.Background(), Request{Prompt: "filler", MaxTokens: 480, IgnoreEOS: true}); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []Event
	for ev := range ch {
		if ev.Done {
			if ev.FinishReason != sched.FinishLength {
				t.Fatalf("stream ended with %+v after %d tokens", ev, len(got))
			}
			break
		}
		got = append(got, ev)
		// Early, and with a short lease: the client must find its lease
		// lapsed (≤ 20 ms after the last renewal) while the stream still
		// runs, and the faster the engine, the less of it is left.
		if len(got) == 5 {
			stopOwner()
			<-served
			o.Close()
		}
	}
	if len(got) != len(want.events) {
		t.Fatalf("%d tokens, want %d", len(got), len(want.events))
	}
	for i := range got {
		if got[i].TokenID != want.events[i].TokenID || got[i].Text != want.events[i].Text {
			t.Fatalf("token %d differs after the owner's loss", i+1)
		}
	}
	cs := e.Cache.Stats()
	if cs.Lost == 0 || e.Stats().Recomputed == 0 || cs.Fallback == 0 {
		t.Fatalf("owner loss not exercised: cache %+v, sched %+v", cs, e.Stats())
	}
}
