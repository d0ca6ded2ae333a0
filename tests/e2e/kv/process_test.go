package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
	"github.com/lifeline-llm/lifeline/shm"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// These process tests run the real binaries: `lifeline kv serve` owns the
// arena and `lifeline engine generate --kv-socket` processes write and
// read it. The test itself plays the node agent (reporting writer deaths)
// and the operator (stats), through the owner's socket. Each test has a
// node of its own, so they run in parallel.

const kvPrompt = "Tell me a story about a dog who found a river near the old mountain road, then went home to the family and ate some bread with the old man"

type kvNode struct {
	dir, socket, arena string
	slots              int
	ttl                time.Duration
	owner              *exec.Cmd
}

// newKVNode starts an owner with an arena in /dev/shm and its socket and
// manifests in a temporary directory.
func newKVNode(t *testing.T, ttl time.Duration) *kvNode {
	t.Helper()
	proctest.Processes(t)
	dir := t.TempDir()
	f, err := os.CreateTemp("/dev/shm", "lifeline-proc-*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name()) // the owner creates it exclusively
	n := &kvNode{dir: dir, socket: filepath.Join(dir, "kv.sock"), slots: 64, ttl: ttl, arena: f.Name()}
	t.Cleanup(func() {
		if n.owner != nil && n.owner.ProcessState == nil {
			n.owner.Process.Kill()
			n.owner.Wait()
		}
		os.Remove(n.arena)
	})
	n.startOwner(t)
	return n
}

func (n *kvNode) startOwner(t *testing.T, env ...string) {
	t.Helper()
	layout := kvcache.NewLayout(2, 32, 16) // the tiny preset
	cmd := exec.Command(proctest.Lifeline(t), "kv", "serve", "--socket", n.socket, "--arena", n.arena, "--db", filepath.Join(n.dir, "db"),
		"--slots", fmt.Sprint(n.slots), "--slot-bytes", fmt.Sprint(layout.BlockBytes()), "--lease-ttl", n.ttl.String())
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.owner = cmd
	proctest.WaitLine(t, stderr, "kv: serving")
}

func (n *kvNode) stats(t *testing.T) *kvpb.Stats {
	t.Helper()
	st, err := kvclient.NewAdminClient(n.socket).Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitStats polls the owner until cond holds, failing after a deadline.
func (n *kvNode) waitStats(t *testing.T, what string, cond func(*kvpb.Stats) bool) *kvpb.Stats {
	t.Helper()
	var st *kvpb.Stats
	proctest.WaitFor(t, 20*time.Second, what, func() (bool, string) {
		st = n.stats(t)
		return cond(st), fmt.Sprintf("owner stats %v", st)
	})
	return st
}

func (n *kvNode) generateArgs(instance string, extra ...string) []string {
	return append([]string{"engine", "generate", "--preset", "tiny", "--prompt", kvPrompt, "--seed", "5", "--max-tokens", "24",
		"--ignore-eos", "--json", "--stats", "--kv-socket", n.socket, "--instance-id", instance}, extra...)
}

// promptKeys are the block keys of kvPrompt's full blocks for the tiny preset.
func promptKeys(t *testing.T) []kv.BlockKey {
	t.Helper()
	m, err := model.Synthetic("tiny", 1)
	if err != nil {
		t.Fatal(err)
	}
	tok := tokenizer.NewBuiltin()
	ids, _ := tok.Encode(kvPrompt)
	layout := m.KVLayout(kvcache.DefaultBlockSize)
	id := decode.BlockIdentity(m, tok, layout)
	return id.Chain(append([]int{tok.BOS()}, ids...), -1)
}

// startPausedWriter starts a writer that stops at failpoint fp, holding its
// blocks in whatever state fp leaves them.
func (n *kvNode) startPausedWriter(t *testing.T, instance, fp string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(proctest.Lifeline(t), n.generateArgs(instance)...)
	cmd.Env = append(os.Environ(), "LIFELINE_FAILPOINTS="+fp+"=pause")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	proctest.WaitLine(t, stderr, "failpoint "+fp+" hit")
	return cmd
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
}

func readable(t *testing.T, n *kvNode) int {
	t.Helper()
	c, err := kvclient.NewAdminClient(n.socket).Lookup(t.Context(), promptKeys(t))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestKVWriterKilledWhileWriting(t *testing.T) {
	t.Parallel()
	n := newKVNode(t, 30*time.Second) // long TTL: only the death report can reclaim
	before := n.stats(t)
	w := n.startPausedWriter(t, "decode-1", kvclient.FailBeforeSeal)
	st := n.stats(t)
	writing := int(st.ByState["WRITING"])
	if writing == 0 || st.ByState["PUBLISHED"] != 0 {
		t.Fatalf("paused before seal: %v", st)
	}
	kill9(t, w)
	if got := readable(t, n); got != 0 {
		t.Fatalf("%d blocks of a killed writer are readable", got)
	}
	// The agent reports the death: everything comes back at once.
	reclaimed, err := kvclient.NewAdminClient(n.socket).WriterDead(t.Context(), kv.Writer{Instance: "decode-1", Gen: 1})
	if err != nil || reclaimed != writing {
		t.Fatalf("writer-dead reclaimed %d of %d: %v", reclaimed, writing, err)
	}
	after := n.stats(t)
	if after.SlotsInUse != before.SlotsInUse || after.ByState["FREE"] != uint32(n.slots) {
		t.Fatalf("slots leaked: before %v, after %v", before, after)
	}
}

// TestKVWriterKilledBetweenSealAndPublish: the writer stops before the
// owner seals and publishes its prefill's blocks (one batch: the owner
// checksums and publishes them in one operation), and dies there.
func TestKVWriterKilledBetweenSealAndPublish(t *testing.T) {
	n := newKVNode(t, 1*time.Second) // serial: a 1 s lease leaves no room for a loaded machine
	w := n.startPausedWriter(t, "decode-2", kvclient.FailBeforePublish)
	batch := len(promptKeysTokens(t)) / 16 // the prefill step's full blocks
	if st := n.stats(t); st.ByState["SEALED"] != 0 || st.ByState["PUBLISHED"] != 0 || int(st.ByState["WRITING"]) < batch {
		t.Fatalf("paused before publish: %v; want the batch's %d blocks still WRITING", st, batch)
	}
	kill9(t, w)
	if got := readable(t, n); got != 0 {
		t.Fatalf("a sealed, unpublished block is readable (%d)", got)
	}
	// No death report this time: the writer's lease runs out and the
	// sweeper reclaims its blocks.
	st := n.waitStats(t, "lease expiry reclaims the sealed block", func(s *kvpb.Stats) bool { return s.SlotsInUse == 0 })
	if st.Counters["sessions_expired"] == 0 || st.Counters["orphans_reclaimed"] == 0 {
		t.Fatalf("reclaimed without a lease expiry? %v", st)
	}
	if readable(t, n) != 0 {
		t.Fatal("reclaimed block readable")
	}
}

type genResult struct {
	lines []decode.TokenLine
	stats decode.RunStats
}

func runGenerate(t *testing.T, args ...string) genResult {
	t.Helper()
	out, errOut, err := proctest.Run(t, args...)
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, errOut)
	}
	var r genResult
	r.lines = parseLines(t, out)
	if i := strings.LastIndex(errOut, `{"generated"`); i >= 0 {
		if err := json.Unmarshal([]byte(strings.TrimSpace(errOut[i:])), &r.stats); err != nil {
			t.Fatalf("stats %q: %v", errOut[i:], err)
		}
	}
	return r
}

// TestKVArenaEngineMatchesPrivateAndReuses: the engine with its KV cache in
// the arena produces the same tokens as with private memory; a second
// process reuses the published prompt prefix (skipping its prefill); and a
// continuation after k generated tokens — what migration sends — reuses the
// blocks that hold generated tokens too.
func TestKVArenaEngineMatchesPrivateAndReuses(t *testing.T) {
	t.Parallel()
	n := newKVNode(t, 3*time.Second)
	private := runGenerate(t, "engine", "generate", "--preset", "tiny", "--prompt", kvPrompt, "--seed", "5", "--max-tokens", "24", "--ignore-eos", "--json")
	first := runGenerate(t, n.generateArgs("decode-a")...)
	second := runGenerate(t, n.generateArgs("decode-b")...)
	if fmt.Sprint(first.lines) != fmt.Sprint(private.lines) || fmt.Sprint(second.lines) != fmt.Sprint(private.lines) {
		t.Fatalf("arena runs differ from the private run:\n%v\n%v\n%v", private.lines, first.lines, second.lines)
	}
	promptLen := len(promptKeysTokens(t))
	wantReuse := (promptLen - 1) / 16 * 16
	if first.stats.ReusedPositions != 0 || second.stats.ReusedPositions != wantReuse || second.stats.Cache.Reused != wantReuse/16 {
		t.Fatalf("reuse: first %+v, second %+v; want the second to reuse %d positions", first.stats, second.stats, wantReuse)
	}
	if first.stats.Cache.Published != (promptLen+24-1)/16 {
		t.Fatalf("first run published %d blocks, want %d", first.stats.Cache.Published, (promptLen+24-1)/16)
	}
	k := 12
	var ids []string
	for _, l := range private.lines[:k] {
		ids = append(ids, fmt.Sprint(l.TokenID))
	}
	cont := runGenerate(t, n.generateArgs("decode-c", "--prefix-tokens", strings.Join(ids, ","))...)
	if fmt.Sprint(cont.lines) != fmt.Sprint(private.lines[k:]) {
		t.Fatalf("continuation differs:\n%v\n%v", cont.lines, private.lines[k:])
	}
	if want := (promptLen + k - 1) / 16 * 16; cont.stats.ReusedPositions != want {
		t.Fatalf("continuation reused %d positions, want %d", cont.stats.ReusedPositions, want)
	}
	if st := n.stats(t); st.Leases != 0 || st.ByState["WRITING"] != 0 || st.ByState["SEALED"] != 0 {
		t.Fatalf("writers left blocks behind: %v", st)
	}
}

// parseLines decodes the JSON token lines of `engine generate --json`.
func parseLines(t *testing.T, out string) []decode.TokenLine {
	t.Helper()
	return proctest.JSONLines[decode.TokenLine](t, out)
}

func promptKeysTokens(t *testing.T) []int {
	tok := tokenizer.NewBuiltin()
	ids, _ := tok.Encode(kvPrompt)
	return append([]int{tok.BOS()}, ids...)
}

// TestKVCorruptPublishedBlockDetectedOnRead scribbles on a published
// block's payload in the arena; the next reader's checksum catches it, the
// owner drops it, and the reader recomputes to the same tokens.
func TestKVCorruptPublishedBlockDetectedOnRead(t *testing.T) {
	t.Parallel()
	n := newKVNode(t, 3*time.Second)
	first := runGenerate(t, n.generateArgs("decode-a")...)
	slot := publishedSlotOf(t, n, 0)
	a, err := shm.Open(n.arena)
	if err != nil {
		t.Fatal(err)
	}
	a.Payload(slot)[123] ^= 0x10
	a.Close()
	second := runGenerate(t, n.generateArgs("decode-b")...)
	if fmt.Sprint(second.lines) != fmt.Sprint(first.lines) {
		t.Fatal("output changed after a corrupt block")
	}
	if second.stats.Cache.CorruptOnRead != 1 || second.stats.ReusedPositions != 0 {
		t.Fatalf("reader stats %+v: want the corruption caught and the prefix recomputed", second.stats)
	}
	if st := n.stats(t); st.Counters["corrupt_dropped"] != 1 {
		t.Fatalf("owner did not drop the block: %v", st)
	}
}

// publishedSlotOf finds the slot holding prompt block i by reading headers
// the way a reader would and matching its checksum to the manifest's key.
func publishedSlotOf(t *testing.T, n *kvNode, i int) int {
	t.Helper()
	keys := promptKeys(t)
	a, err := shm.Open(n.arena)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Ask the owner by acquiring as a throwaway writer.
	c, err := kvclient.Dial(t.Context(), n.socket, kv.Writer{Instance: "probe", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	refs, err := c.Acquire(t.Context(), keys[:i+1])
	if err != nil || len(refs) != i+1 {
		t.Fatalf("probe acquire: %v %v", refs, err)
	}
	for _, r := range refs {
		c.Release(t.Context(), r)
	}
	return int(refs[i].Slot)
}

// TestKVOwnerKilledAndRestarted: the owner dies by SIGKILL with published
// blocks (one of them corrupted meanwhile) and a writer paused mid-write.
// The restarted owner keeps exactly the published blocks that verify,
// keeps the half-written ones unreadable, and reclaims them once their
// writer is gone and the grace passes.
func TestKVOwnerKilledAndRestarted(t *testing.T) {
	n := newKVNode(t, 1*time.Second) // serial: a 1 s lease leaves no room for a loaded machine
	first := runGenerate(t, n.generateArgs("decode-a")...)
	published := int(n.stats(t).ByState["PUBLISHED"])
	paused := n.startPausedWriter(t, "decode-p", kvclient.FailBeforeSeal)
	writing := int(n.stats(t).ByState["WRITING"])
	// Corrupt block 1 only now: the paused writer would have caught it.
	corrupt := publishedSlotOf(t, n, 1)
	a, err := shm.Open(n.arena)
	if err != nil {
		t.Fatal(err)
	}
	a.Payload(corrupt)[9] ^= 0x01
	a.Close()

	kill9(t, n.owner)
	n.startOwner(t)
	st := n.stats(t)
	if int(st.Counters["recovered_at_startup"]) != published-1 || st.Counters["dropped_at_startup"] != 1 {
		t.Fatalf("restart: %v; want %d recovered and the corrupt one dropped", st, published-1)
	}
	if int(st.ByState["WRITING"]) != writing || readable(t, n) != 1 {
		t.Fatalf("restart: %v, %d readable; want the half-written blocks kept unreadable and only block 0 readable", st, readable(t, n))
	}
	kill9(t, paused)
	n.waitStats(t, "the dead writer's blocks are reclaimed after the grace", func(s *kvpb.Stats) bool {
		return s.ByState["WRITING"] == 0 && int(s.SlotsInUse) == published-1
	})
	// A new writer reuses the verified first block and recomputes the rest.
	again := runGenerate(t, n.generateArgs("decode-b")...)
	if fmt.Sprint(again.lines) != fmt.Sprint(first.lines) || again.stats.ReusedPositions != 16 {
		t.Fatalf("after restart: reused %d, same output %v", again.stats.ReusedPositions, fmt.Sprint(again.lines) == fmt.Sprint(first.lines))
	}
}

func TestKVServeBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--slots", "0"}, "slots"},
		{[]string{"--slot-bytes", "-1"}, "slot-bytes"},
		{[]string{"--lease-ttl", "0s"}, "lease-ttl"},
		{[]string{"--db", ""}, "db"},
	} {
		dir := t.TempDir()
		args := append([]string{"kv", "serve", "--socket", filepath.Join(dir, "s"), "--arena", filepath.Join(dir, "arena"), "--db", filepath.Join(dir, "db")}, c.args...)
		_, errOut, err := proctest.Run(t, args...)
		if err == nil || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "panic") {
			t.Errorf("%v: err %v, stderr %q", c.args, err, errOut)
		}
	}
	// A writer pointed at no owner fails clearly.
	_, errOut, err := proctest.Run(t, "engine", "generate", "--prompt", "hi", "--kv-socket", "/nonexistent/kv.sock", "--instance-id", "x")
	if err == nil || !strings.Contains(errOut, "owner unavailable") {
		t.Errorf("no owner: err %v, stderr %q", err, errOut)
	}
}

// TestKVOwnerKilledBetweenManifestAndHeader: the owner dies (failpoint
// kill) after writing a PUBLISHED manifest and before the slot header
// follows. The writer carries on without it (private memory) and finishes;
// the restarted owner completes the publish, and the block is reused.
func TestKVOwnerKilledBetweenManifestAndHeader(t *testing.T) {
	n := newKVNode(t, 1*time.Second) // serial: a 1 s lease leaves no room for a loaded machine
	n.owner.Process.Kill()
	n.owner.Wait()
	n.startOwner(t, "LIFELINE_FAILPOINTS="+kv.FailOwnerAfterPublishManifest+"=kill")
	first := runGenerate(t, n.generateArgs("decode-a")...)
	if err := n.owner.Wait(); err == nil || n.owner.ProcessState.ExitCode() != -1 {
		t.Fatalf("owner did not die at the failpoint: %v", err)
	}
	if cs := first.stats.Cache; cs.Published != 0 || cs.PublishFailed == 0 {
		t.Fatalf("writer cache stats %+v: want its publishes to fail", *cs)
	}
	n.startOwner(t)
	// The writer's first publish is its prefill's blocks in one batch: the
	// owner died with all their manifests written and no header published.
	promptLen := len(promptKeysTokens(t))
	batch := promptLen / 16
	st := n.stats(t)
	if int(st.Counters["recovered_at_startup"]) != batch || readable(t, n) != batch {
		t.Fatalf("restart after a half-written publish: %v, %d readable; want the batch's %d blocks", st, readable(t, n), batch)
	}
	again := runGenerate(t, n.generateArgs("decode-b")...)
	if want := min(batch, (promptLen-1)/16) * 16; fmt.Sprint(again.lines) != fmt.Sprint(first.lines) || again.stats.ReusedPositions != want {
		t.Fatalf("reuse after recovery: %+v, want %d positions reused", again.stats, want)
	}
}
