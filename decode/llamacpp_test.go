//go:build llamacpp

package decode

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/shm"
)

// ggufModel is a qwen2 test model written once per test binary.
var ggufModel = func() func(t *testing.T) string {
	var path string
	return func(t *testing.T) string {
		if path == "" {
			dir, err := os.MkdirTemp("", "lifeline-gguf-*")
			if err != nil {
				t.Fatal(err)
			}
			path = llamacpptest.WriteModel(t, dir, llamacpptest.TinyQwen2, 5)
		}
		return path
	}
}()

func llamaEngine(t *testing.T, o Options) *Engine {
	t.Helper()
	o.Engine, o.ModelPath, o.Threads = EngineLlamaCpp, ggufModel(t), 2
	if o.Limits == (sched.Limits{}) {
		o.Limits = sched.Limits{MaxRunning: 8, MaxQueued: 16, MaxStepTokens: 64}
	}
	e, err := NewEngine(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func tokenIDs(r result) []int {
	var out []int
	for _, ev := range r.events {
		out = append(out, ev.TokenID)
	}
	return out
}

// TestLlamaCppBatchedEqualsAlone: through the scheduler on llama.cpp, a
// seeded sequence decoded beside seven others — prompts cut in chunks of
// a 64-position step — gives the tokens and logit bits it gives alone;
// the start-up check claims bit-exact on this build, and this is what the
// claim promises.
func TestLlamaCppBatchedEqualsAlone(t *testing.T) {
	e := llamaEngine(t, Options{})
	if e.Continuation() != llamacpp.BitExact {
		t.Fatalf("this build claims %q", e.Continuation())
	}
	if id := e.NumericsID(); !strings.Contains(id, ";weights=F32;") || !strings.Contains(id, ";gpu=none;") {
		t.Fatalf("numerics id %q: want the F32 weights and no GPU named", id)
	}
	req := Request{Prompt: "The quick brown fox jumps over the lazy dog, and then the dog", MaxTokens: 40, IgnoreEOS: true, KeepLogits: true,
		Sampling: sample.Params{Temperature: 0.9, TopP: 0.95, Seed: 9}}
	alone := generate(t, e, req)
	var chans []<-chan Event
	for i := range 7 {
		ch, err := e.Generate(context.Background(), Request{Prompt: fmt.Sprintf("other prompt %d with some more words to compute %d", i, i*i),
			MaxTokens: 30 + i, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.7, Seed: uint64(i)}})
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	batched := generate(t, e, req)
	for _, ch := range chans {
		collect(t, ch)
	}
	if len(alone.events) != 40 || !slices.Equal(tokenIDs(alone), tokenIDs(batched)) {
		t.Fatalf("alone %v, batched %v", tokenIDs(alone), tokenIDs(batched))
	}
	for i := range alone.events {
		if !slices.Equal(bitsOf(alone.events[i].Logits), bitsOf(batched.events[i].Logits)) {
			t.Fatalf("token %d: logits differ in a batch", i)
		}
	}
}

// TestLlamaCppSnapshotsContinueAnotherEngine: an engine saves a seeded
// sequence's K/V into the node's arena every 64 positions; another
// engine (another writer) continuing the request after 100 tokens
// restores 64 positions from there and gives the uninterrupted run's
// tokens. With the snapshot's blocks corrupted in the arena, a third
// restores nothing (the checksum refuses them), computes, and still
// gives the same tokens.
func TestLlamaCppSnapshotsContinueAnotherEngine(t *testing.T) {
	sock, arena := arenaOwner(t)
	req := Request{Prompt: "Once upon a time, in a small town by the river,", MaxTokens: 150, IgnoreEOS: true,
		Sampling: sample.Params{Temperature: 0.9, Seed: 21}}
	a := llamaEngine(t, Options{KVSocket: sock, InstanceID: "a", Generation: 1})
	want := generate(t, a, req)
	if st := a.SnapshotStats(); st.Saved < 2 || st.SaveFailed != 0 {
		t.Fatalf("engine a saved %+v", st)
	}
	cont := req
	cont.PrefixTokens = tokenIDs(want)[:100]
	b := llamaEngine(t, Options{KVSocket: sock, InstanceID: "b", Generation: 1})
	got := generate(t, b, cont)
	if !slices.Equal(tokenIDs(got), tokenIDs(want)[100:]) {
		t.Fatalf("continued %v, uninterrupted %v", tokenIDs(got), tokenIDs(want)[100:])
	}
	if got.finish.ReusedPositions != 64 || b.SnapshotStats().Restored != 1 {
		t.Fatalf("restored %d positions, stats %+v", got.finish.ReusedPositions, b.SnapshotStats())
	}
	// A continuation of exactly 128 positions and the one it computes
	// restores the 128 (the last saved period counts).
	ids := make([]int, 100)
	for i := range ids {
		ids[i] = 40 + i%50
	}
	long := Request{PromptTokens: ids, MaxTokens: 60, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 3}}
	wantLong := generate(t, a, long)
	contLong := long
	contLong.PrefixTokens = tokenIDs(wantLong)[:29]
	gotLong := generate(t, b, contLong)
	if !slices.Equal(tokenIDs(gotLong), tokenIDs(wantLong)[29:]) || gotLong.finish.ReusedPositions != 128 {
		t.Fatalf("a continuation at 129 positions reused %d (want 128); tokens equal %v", gotLong.finish.ReusedPositions, slices.Equal(tokenIDs(gotLong), tokenIDs(wantLong)[29:]))
	}
	corrupted := 0
	for slot := range arena.Geometry().Slots {
		if arena.State(slot) == shm.SlotPublished {
			arena.Payload(slot)[100] ^= 0xff
			corrupted++
		}
	}
	if corrupted == 0 {
		t.Fatal("no published block to corrupt")
	}
	c := llamaEngine(t, Options{KVSocket: sock, InstanceID: "c", Generation: 1})
	got = generate(t, c, cont)
	if !slices.Equal(tokenIDs(got), tokenIDs(want)[100:]) || got.finish.ReusedPositions != 0 || c.SnapshotStats().RestoreMissed != 1 {
		t.Fatalf("after corrupting %d blocks: reused %d, stats %+v, tokens equal %v", corrupted, got.finish.ReusedPositions, c.SnapshotStats(),
			slices.Equal(tokenIDs(got), tokenIDs(want)[100:]))
	}
}

// arenaOwner serves an arena's owner in this process for the test.
func arenaOwner(t *testing.T) (socket string, arena *shm.Arena) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.CreateTemp("/dev/shm", "lifeline-llamatest-*")
	if err != nil {
		t.Fatal(err)
	}
	path := f.Name()
	f.Close()
	os.Remove(path)
	t.Cleanup(func() { os.Remove(path) })
	o, err := kv.Open(kv.Options{ArenaPath: path, Geometry: shm.Geometry{Slots: 256, PayloadSize: 8192}, DBDir: filepath.Join(dir, "db")})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "kv.sock")
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- kv.Serve(ctx, o, sock) }()
	t.Cleanup(func() { stop(); <-served; o.Close() })
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := kv.WaitServing(wctx, sock); err != nil {
		t.Fatal(err)
	}
	a, err := shm.OpenWorker(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return sock, a
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

// TestSnapshotBudget: saves may take 5 % of the engine's computing time;
// past it, they are skipped until computing catches up.
func TestSnapshotBudget(t *testing.T) {
	for _, c := range []struct {
		spent, forward time.Duration
		over           bool
	}{{0, 0, false}, {49 * time.Millisecond, time.Second, false}, {51 * time.Millisecond, time.Second, true}, {time.Millisecond, 0, true}} {
		if got := overBudget(c.spent, c.forward); got != c.over {
			t.Errorf("%v of saves against %v of computing: over budget %v, want %v", c.spent, c.forward, got, c.over)
		}
	}
}

// TestSnapshotBudgetNeverSkipsTwiceInARow: with the budget spent, a
// sequence's saves at 64 and 192 positions are skipped and the one at 128
// between them is made, so a continuation restores 128 positions (a
// restore looks two periods back).
func TestSnapshotBudgetNeverSkipsTwiceInARow(t *testing.T) {
	sock, _ := arenaOwner(t)
	a := llamaEngine(t, Options{KVSocket: sock, InstanceID: "a", Generation: 1})
	a.snaps.(*llamaSnapshots).saveSpent = time.Hour // far over 5 % of any computing
	ids := make([]int, 100)
	for i := range ids {
		ids[i] = 40 + i%50
	}
	req := Request{PromptTokens: ids, MaxTokens: 100, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 4}}
	want := generate(t, a, req)
	if st := a.SnapshotStats(); st.Saved != 1 || st.Skipped != 2 {
		t.Fatalf("saves at 64, 128 and 192 positions over budget: %+v, want 1 saved and 2 skipped", st)
	}
	cont := req
	cont.PrefixTokens = tokenIDs(want)[:80] // 180 positions: 128 is the newest period saved
	b := llamaEngine(t, Options{KVSocket: sock, InstanceID: "b", Generation: 1})
	got := generate(t, b, cont)
	if !slices.Equal(tokenIDs(got), tokenIDs(want)[80:]) || got.finish.ReusedPositions != 128 {
		t.Fatalf("restored %d positions (want 128), tokens equal %v", got.finish.ReusedPositions, slices.Equal(tokenIDs(got), tokenIDs(want)[80:]))
	}
}
