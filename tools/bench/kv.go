package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"
	"unsafe"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/shm"
)

// kvNode is an arena owner serving on a temporary socket.
type kvNode struct {
	owner  *kv.Owner
	socket string
	stop   func()
}

func startKVNode(slots, payload int) (*kvNode, error) {
	b, err := newBenchOwner(slots, payload)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(b.dir, "kv.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kv.Serve(ctx, b.owner, sock) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := kv.WaitServing(wctx, sock); err != nil {
		cancel()
		<-done
		b.stop()
		return nil, err
	}
	return &kvNode{owner: b.owner, socket: sock, stop: func() {
		cancel()
		<-done
		b.stop()
	}}, nil
}

// benchOwner is an arena owner in /dev/shm with its Badger directory.
type benchOwner struct {
	owner *kv.Owner
	dir   string
	stop  func()
}

func newBenchOwner(slots, payload int) (*benchOwner, error) {
	dir, err := os.MkdirTemp("", "lifeline-bench")
	if err != nil {
		return nil, err
	}
	arena := filepath.Join("/dev/shm", "lifeline-bench-"+filepath.Base(dir))
	o, err := kv.Open(kv.Options{ArenaPath: arena, Geometry: shm.Geometry{Slots: slots, PayloadSize: payload}, DBDir: filepath.Join(dir, "db"), LeaseTTL: 30 * time.Second})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &benchOwner{owner: o, dir: dir, stop: func() { o.Close(); os.Remove(arena); os.RemoveAll(dir) }}, nil
}

// profilePublish (LIFELINE_BENCH_KV_CPUPROFILE) writes a CPU profile
// of 400 steps of 28 blocks (writer and owner are this one process) to
// path, on an arena of its own with room for every block (a published
// block stays in the arena).
func profilePublish(path string, m *model.Model, layout kvcache.Layout) error {
	const steps, perStep = 400, 28
	node, err := startKVNode(steps*perStep+512, layout.BlockBytes())
	if err != nil {
		return err
	}
	defer node.stop()
	client, err := kvclient.Dial(context.Background(), node.socket, kv.Writer{Instance: "bench-profile", Gen: 1})
	if err != nil {
		return err
	}
	defer client.Close()
	cache, err := kvclient.NewCache(client, layout, decode.BlockIdentity(m, tokenizer.NewBuiltin(), layout), steps*perStep+256)
	if err != nil {
		return err
	}
	cache.PoolIdle = time.Hour
	cache.Prepare(true)
	for slot := 0; slot < steps*perStep+512; slot++ { // first writes to the mapping's pages, as in runKVBench
		clear(cache.Arena().Payload(slot))
	}
	src, base := make([]float32, layout.BlockFloats()), 1_000_000
	stop := startCPUProfile(path)
	per, _, err := publishSteps(cache, src, &base, perStep, steps, perStep)
	stop()
	fmt.Fprintf(os.Stderr, "bench: profiled %d steps of %d blocks: %v per block\n", steps, perStep, per)
	return err
}

// startCPUProfile profiles this process into path until the returned
// function is called; nothing when path is "".
func startCPUProfile(path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: profile:", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

func timeIt(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

func runKVBench() error {
	fmt.Printf("## KV arena (`small` blocks: 16 positions, 128 KiB)\n\n")
	m, err := model.Synthetic("small", 1)
	if err != nil {
		return err
	}
	tok := tokenizer.NewBuiltin()
	layout := m.KVLayout(kvcache.DefaultBlockSize)
	node, err := startKVNode(1024, layout.BlockBytes())
	if err != nil {
		return err
	}
	defer node.stop()

	// Publish path through the socket, against a memcpy of the same block.
	client, err := kvclient.Dial(context.Background(), node.socket, kv.Writer{Instance: "bench", Gen: 1})
	if err != nil {
		return err
	}
	defer client.Close()
	cache, err := kvclient.NewCache(client, layout, decode.BlockIdentity(m, tok, layout), 1024)
	if err != nil {
		return err
	}
	// As a scheduler with requests does: slots come ahead of need, and the
	// pool stays for the whole measurement.
	cache.PoolIdle = time.Hour
	cache.Prepare(true)
	const blocks = 200
	tokens := make([]int, blocks*16)
	for i := range tokens {
		tokens[i] = 300 + i%2000
	}
	// The first write to each page of a fresh mapping costs about 5 µs on
	// these VMs whatever the kernel is told up front; write every slot
	// once so that the figures are the steady state of a running node.
	for slot := 0; slot < 1024; slot++ {
		clear(cache.Arena().Payload(slot))
		shm.Checksum(node.owner.Arena().Payload(slot))
	}
	pub, err := measurePublish(cache, layout)
	if err != nil {
		return err
	}
	if path := os.Getenv("LIFELINE_BENCH_KV_CPUPROFILE"); path != "" {
		if err := profilePublish(path, m, layout); err != nil {
			return err
		}
	}
	// The handoff below acquires blocks the writer published: publish them
	// (a step of 28 and then single blocks) and keep them.
	var ids []kvcache.BlockID
	var full []kvcache.FullBlock
	for b := 0; b < blocks; b++ {
		id, err := cache.Alloc()
		if err != nil {
			return err
		}
		full = append(full, kvcache.FullBlock{ID: id, Parent: parentOf(ids), Tokens: tokens[:(b+1)*16]})
		ids = append(ids, id)
	}
	cache.PublishBlocks(full[:28])
	cache.PublishBlocks(full[28:])

	// Lookup of a 2k-token prefix (128 blocks): key chain + one request.
	lookupKeys := decode.BlockIdentity(m, tok, layout)
	var found int
	const lookups = 50
	lookup := timeIt(func() {
		for i := 0; i < lookups; i++ {
			found, _ = client.Lookup(context.Background(), lookupKeys.Chain(tokens[:2048], -1))
		}
	}) / lookups

	// Zero-copy handoff: another cache (its own mapping, as another process
	// would have) acquires 28 published blocks: 3.5 MiB it reads in place.
	reader, err := kvclient.Dial(context.Background(), node.socket, kv.Writer{Instance: "reader", Gen: 1})
	if err != nil {
		return err
	}
	defer reader.Close()
	rcache, err := kvclient.NewCache(reader, layout, decode.BlockIdentity(m, tok, layout), 1024)
	if err != nil {
		return err
	}
	for slot := 0; slot < 1024; slot++ {
		shm.Checksum(rcache.Arena().Payload(slot)) // fault the reader's mapping in
	}
	// The median of five acquisitions (each handed back but the last): one
	// alone is at the mercy of a busy neighbour.
	var got []kvcache.BlockID
	var handoffs []float64
	for i := 0; i < 5; i++ {
		if i > 0 {
			for _, id := range got {
				rcache.Free(id)
			}
		}
		handoffs = append(handoffs, float64(timeIt(func() { got = rcache.AcquirePrefix(tokens[:28*16+1], 28) })))
	}
	handoff := time.Duration(kvMedian(handoffs))
	inPlace := 0
	for _, id := range got {
		if b := rcache.Block(id); rcache.Contains(&b[0]) {
			inPlace++
		}
	}
	big := make([]byte, 28*layout.BlockBytes())
	bigDst := make([]byte, len(big))
	copy(bigDst, big)
	handoffCopy := timeIt(func() { copy(bigDst, big) })
	for _, id := range got {
		rcache.Free(id)
	}

	fmt.Printf("| measure | figure | baseline (same run) | ratio |\n|---|---|---|---|\n")
	fmt.Print(pub)
	fmt.Printf("| lookup of a 2,048-token prefix (128 blocks, %d found) | %v | — | — |\n", found, lookup.Round(time.Microsecond))
	fmt.Printf("| handoff of 28 published blocks (3.5 MiB) to another mapping, checksums verified | %v, %d/%d blocks read in place, 0 bytes copied | memcpy of 3.5 MiB: %v | %.1f× |\n",
		handoff.Round(time.Microsecond), inPlace, len(got), handoffCopy.Round(time.Microsecond), float64(handoff)/float64(handoffCopy))
	cache.Close()

	// Reuse vs recompute: a 448-token prompt prefilled from scratch, then
	// again by a second engine that finds the prefix published.
	reuse, recompute, reusedPositions, err := reuseVsRecompute(m, tok, node.socket)
	if err != nil {
		return err
	}
	fmt.Printf("| prefill of a 448-token prompt, prefix reused from the arena (%d positions) | %v | recomputed: %v | %.1f× faster |\n",
		reusedPositions, reuse.Round(time.Millisecond), recompute.Round(time.Millisecond), float64(recompute)/float64(reuse))

	sweepFigures, err := sweeperCost(100_000)
	if err != nil {
		return err
	}
	fmt.Print(sweepFigures)
	fmt.Println()
	return nil
}

func reuseVsRecompute(m *model.Model, tok tokenizer.Tokenizer, socket string) (reuse, recompute time.Duration, reused int, err error) {
	prompt := make([]int, 448)
	for i := range prompt {
		prompt[i] = 300 + (i*7)%2000
	}
	run := func(instance string) (time.Duration, int, error) {
		client, err := kvclient.Dial(context.Background(), socket, kv.Writer{Instance: instance, Gen: 1})
		if err != nil {
			return 0, 0, err
		}
		defer client.Close()
		layout := m.KVLayout(kvcache.DefaultBlockSize)
		cache, err := kvclient.NewCache(client, layout, decode.BlockIdentity(m, tok, layout), 64)
		if err != nil {
			return 0, 0, err
		}
		defer cache.Close()
		e, err := decode.NewEngineWith(m, tok, cache, sched.Limits{MaxRunning: 1, MaxQueued: 1, MaxStepTokens: 512})
		if err != nil {
			return 0, 0, err
		}
		defer e.Close()
		start := time.Now()
		ch, err := e.Generate(context.Background(), decode.Request{PromptTokens: prompt, MaxTokens: 1, IgnoreEOS: true})
		if err != nil {
			return 0, 0, err
		}
		var done decode.Event
		for ev := range ch {
			done = ev
		}
		return time.Since(start), done.ReusedPositions, nil
	}
	if recompute, _, err = run("first"); err != nil {
		return
	}
	reuse, reused, err = run("second")
	return
}

// sweeperCost fills an owner with n published, unleased manifests and
// times a sweep that keeps them all (mark only) and one that evicts 10%.
func sweeperCost(n int) (string, error) {
	dir, err := os.MkdirTemp("", "lifeline-sweep")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	arena := filepath.Join("/dev/shm", "lifeline-sweep-"+filepath.Base(dir))
	defer os.Remove(arena)
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	o, err := kv.Open(kv.Options{ArenaPath: arena, Geometry: shm.Geometry{Slots: n, PayloadSize: 64}, DBDir: filepath.Join(dir, "db"),
		LeaseTTL: time.Hour, HighWater: 0.9, Now: clock})
	if err != nil {
		return "", err
	}
	defer o.Close()
	sid, _, _, err := o.Hello(kv.Writer{Instance: "fill", Gen: 1}, nil, nil)
	if err != nil {
		return "", err
	}
	fill := timeIt(func() {
		for i := 0; i < n; i += 1000 {
			refs, err := o.Allocate(sid, 1000)
			if err != nil {
				panic(err)
			}
			for j, r := range refs {
				r.PayloadLen, r.Checksum = 0, shm.Checksum(nil)
				var key kv.BlockKey
				key[0], key[1], key[2], key[3] = byte(i+j), byte((i+j)>>8), byte((i+j)>>16), 1
				if err := o.Seal(sid, r, key, kv.BlockKey{}); err != nil {
					panic(err)
				}
				if err := o.Publish(sid, r); err != nil {
					panic(err)
				}
				o.Release(sid, r)
			}
		}
	})
	// Past the start-up grace a sweep scans every slot (the filling
	// session expires; it holds nothing); at 100% use against a 90%
	// high-water mark it also evicts the least recently used tenth.
	now = now.Add(2 * time.Hour)
	var res kv.SweepResult
	evict := timeIt(func() { res = o.Sweep() })
	keep := timeIt(func() { o.Sweep() })
	return fmt.Sprintf("| sweep over %d manifests, nothing to reclaim | %v (%.2f µs per manifest) | filling them (alloc+seal+publish, in process): %v | — |\n"+
		"| sweep over %d manifests evicting %d LRU blocks | %v | — | — |\n",
		n, keep.Round(time.Microsecond), float64(keep.Nanoseconds())/1e3/float64(n), fill.Round(time.Millisecond),
		n, res.Evicted, evict.Round(time.Millisecond)), nil
}

func parentOf(ids []kvcache.BlockID) kvcache.BlockID {
	if len(ids) == 0 {
		return kvcache.NoBlock
	}
	return ids[len(ids)-1]
}

// publishGoal is the bound on a block's publish, amortised over a
// step's batch: at most this many memcpys of the block.
const publishGoal = 5.0

// measurePublish times allocate → write → seal → publish per block, one
// block per call and a step's blocks in one call (16 and 28 blocks: a
// 256- and a 448-token prefill), beside a memcpy of one block, in rounds
// interleaved so that a noisy neighbour hits every figure alike; each
// figure is its median round.
func measurePublish(cache *kvclient.Cache, layout kvcache.Layout) (string, error) {
	src := make([]float32, layout.BlockFloats())
	dst := make([]float32, len(src))
	for i := range src {
		src[i] = float32(i)
	}
	base := 100_000
	var cpu16, cpu28 []float64 // process CPU time per block (writer and owner: one process here)
	run := func(n, steps, perCall int) (time.Duration, error) {
		wall, cpu, err := publishSteps(cache, src, &base, n, steps, perCall)
		switch perCall {
		case 16:
			cpu16 = append(cpu16, float64(cpu))
		case 28:
			cpu28 = append(cpu28, float64(cpu))
		}
		return wall, err
	}
	before := cache.Stats().Published
	const rounds = 7
	var single, b16, b28, memcpy, spread, floor []float64
	// A step writes blocks all over the arena, not into one hot buffer:
	// the same copy into 256 blocks in turn (32 MiB, past L2) is the
	// baseline of the write alone.
	far := make([]float32, 256*len(src))
	// The owner checksums a block the writer wrote: from past L2 as well.
	farBytes := unsafe.Slice((*byte)(unsafe.Pointer(&far[0])), len(far)*4)
	for r := -1; r < rounds; r++ { // round -1 warms up (fills the pool)
		one, err := run(16, 1, 1)
		if err != nil {
			return "", err
		}
		s16, err := run(16, 2, 16)
		if err != nil {
			return "", err
		}
		s28, err := run(28, 1, 28)
		if err != nil {
			return "", err
		}
		mc := timeIt(func() {
			for b := 0; b < 200; b++ {
				copy(dst, src)
			}
		}) / 200
		sp := timeIt(func() {
			for b := 0; b < 256; b++ {
				copy(far[b*len(src):(b+1)*len(src)], src)
			}
		}) / 256
		// A step of 28 blocks written in turn past L2, then each
		// checksummed, as the owner seals them: the path without its
		// bookkeeping.
		lb := len(src) * 4
		sealed := timeIt(func() {
			for s := 0; s+28 <= 256; s += 28 {
				for b := s; b < s+28; b++ {
					copy(far[b*len(src):(b+1)*len(src)], src)
				}
				for b := s; b < s+28; b++ {
					shm.Checksum(farBytes[b*lb : (b+1)*lb])
				}
			}
		}) / (256 / 28 * 28)
		if r >= 0 {
			single, b16, b28, memcpy = append(single, float64(one)), append(b16, float64(s16)), append(b28, float64(s28)), append(memcpy, float64(mc))
			spread, floor = append(spread, float64(sp)), append(floor, float64(sealed))
		}
	}
	if got, want := cache.Stats().Published-before, (rounds+1)*(16+32+28); got != want {
		return "", fmt.Errorf("bench: %d blocks published of %d (stats %+v)", got, want, cache.Stats())
	}
	mc := kvMedian(memcpy)
	row := func(what string, v []float64, goal bool) string {
		d, ratio := kvMedian(v), kvMedian(v)/mc
		verdict := ""
		if goal {
			verdict = fmt.Sprintf(" (goal ≤ %.0f×: %s)", publishGoal, map[bool]string{true: "met", false: "NOT MET"}[ratio <= publishGoal])
		}
		return fmt.Sprintf("| allocate → write → seal → publish, %s | %v | memcpy of one block: %v | %.1f×%s |\n", what,
			dur(d), dur(mc), ratio, verdict)
	}
	// On a shared machine the wall clock also counts the time the two
	// processes' goroutines wait for a core; the CPU time they used says
	// what the path itself costs.
	return row("one block per call, per block", single, false) +
		row("a step of 16 blocks in one call, per block", b16, true) +
		row("a step of 28 blocks in one call, per block", b28, true) +
		row("a step of 16 blocks in one call, CPU time per block (writer + owner)", cpu16[1:], false) +
		row("a step of 28 blocks in one call, CPU time per block (writer + owner)", cpu28[1:], false) +
		fmt.Sprintf("| memcpy of one block into 256 blocks in turn (32 MiB: the write alone, to memory past L2 as arena slots are) | %v | memcpy of one block: %v | %.1f× |\n",
			dur(kvMedian(spread)), dur(mc), kvMedian(spread)/mc) +
		fmt.Sprintf("| a step's write and seal checksum alone, per block (28 blocks written in turn past L2, then each CRC-32C'd as the owner does; no bookkeeping) | %v | memcpy of one block: %v | %.1f× |\n",
			dur(kvMedian(floor)), dur(mc), kvMedian(floor)/mc), nil
}

// dur is nanoseconds as a duration to the tenth of a microsecond.
func dur(ns float64) time.Duration { return time.Duration(ns).Round(100 * time.Nanosecond) }

func kvMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// publishSteps publishes steps steps of n blocks each, perCall blocks per
// call, and returns the time per block; the blocks are freed afterwards
// (and stay cached: 8 rounds of 76 blocks and the 200 of runKVBench fit
// the arena, so that no eviction lands in a figure). Tokens start at
// *base, which moves past them: no key repeats.
func publishSteps(cache *kvclient.Cache, src []float32, base *int, n, steps, perCall int) (wall, cpu time.Duration, err error) {
	var elapsed time.Duration
	cpu0 := processCPU()
	for s := 0; s < steps; s++ {
		tokens := make([]int, n*16)
		for i := range tokens {
			tokens[i] = *base + i
		}
		*base += len(tokens)
		var failed error
		var step []kvcache.BlockID
		elapsed += timeIt(func() {
			for b := 0; b < n; b++ {
				id, err := cache.Alloc()
				if err != nil {
					failed = err
					return
				}
				copy(cache.Block(id), src)
				step = append(step, id)
			}
			for b := 0; b < n; b += perCall {
				var full []kvcache.FullBlock
				for k := b; k < min(n, b+perCall); k++ {
					full = append(full, kvcache.FullBlock{ID: step[k], Parent: parentOf(step[:k]), Tokens: tokens[:(k+1)*16]})
				}
				cache.PublishBlocks(full)
			}
		})
		cpu += processCPU() - cpu0
		if failed != nil {
			return 0, 0, failed
		}
		for _, id := range step {
			cache.Free(id)
		}
		cpu0 = processCPU()
	}
	return elapsed / time.Duration(n*steps), cpu / time.Duration(n*steps), nil
}

// processCPU is the CPU time this process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
