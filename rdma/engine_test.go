package rdma

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
	"github.com/lifeline-llm/lifeline/shm"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// node is one real arena owner (shared memory + Badger) with its transfer
// engine serving real QUIC with mutual TLS on loopback.
type node struct {
	owner  *kv.Owner
	engine *Engine
	addr   string
}

func certs(t *testing.T) string {
	t.Helper()
	dir, err := pki.InitIdentity(t.TempDir(), pki.Agent("rdmatest"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func newNode(t *testing.T, certDir string, payload int) *node { return newNodeTB(t, certDir, payload) }

func newNodeTB(t testing.TB, certDir string, payload int) *node {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "lifeline-rdmatest-*")
	if err != nil {
		t.Fatal(err)
	}
	arena := f.Name()
	f.Close()
	os.Remove(arena)
	t.Cleanup(func() { os.Remove(arena) })
	o, err := kv.Open(kv.Options{ArenaPath: arena, Geometry: shm.Geometry{Slots: 64, PayloadSize: payload}, DBDir: filepath.Join(t.TempDir(), "db"), LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	tlsConf, err := transferclient.TLS(certDir)
	if err != nil {
		t.Fatal(err)
	}
	tr := NewQUIC(tlsConf)
	t.Cleanup(func() { tr.Close() })
	e := NewEngine(o, tr)
	ln, err := quic.ListenAddr("127.0.0.1:0", tlsConf, transferclient.QUICConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); ln.Close(); <-done })
	return &node{owner: o, engine: e, addr: ln.Addr().String()}
}

// chain makes n distinct keys, each derived from its parent.
func chain(n int, seed string) []kv.BlockKey {
	keys := make([]kv.BlockKey, n)
	var parent kv.BlockKey
	for i := range keys {
		keys[i] = sha256.Sum256(append(parent[:], fmt.Sprint(seed, i)...))
		parent = keys[i]
	}
	return keys
}

// publish writes random payloads under keys and publishes them; it returns
// the payloads.
func (n *node) publish(t *testing.T, keys []kv.BlockKey, size int) [][]byte {
	return n.publishTB(t, keys, size)
}

func (n *node) publishTB(t testing.TB, keys []kv.BlockKey, size int) [][]byte {
	t.Helper()
	sid, _, _, err := n.owner.Hello(kv.Writer{Instance: "prefill-0", Gen: 7}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.owner.EndSession(sid)
	var out [][]byte
	for i, k := range keys {
		refs, err := n.owner.Allocate(sid, 1)
		if err != nil {
			t.Fatal(err)
		}
		r := refs[0]
		p := n.owner.Arena().Payload(int(r.Slot))[:size]
		rand.Read(p)
		r.PayloadLen, r.Checksum = uint32(size), shm.Checksum(p)
		parent := kv.BlockKey{}
		if i > 0 {
			parent = keys[i-1]
		}
		if err := n.owner.Seal(sid, r, k, parent); err != nil {
			t.Fatal(err)
		}
		if err := n.owner.Publish(sid, r); err != nil {
			t.Fatal(err)
		}
		out = append(out, bytes.Clone(p))
	}
	return out
}

// read returns the published payloads of keys on n (nil where missing).
func (n *node) read(t *testing.T, keys []kv.BlockKey) [][]byte {
	t.Helper()
	sid, _, _, err := n.owner.Hello(kv.Writer{Instance: "reader", Gen: 1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.owner.EndSession(sid)
	refs, err := n.owner.Acquire(sid, keys)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]byte, len(keys))
	for i, r := range refs {
		out[i] = bytes.Clone(n.owner.Arena().Payload(int(r.Slot))[:r.PayloadLen])
	}
	return out
}

func binding(epoch uint64, count int) *transferpb.Binding {
	return &transferpb.Binding{RequestId: "req-1", ModelRevision: "rev", SourceInstance: "prefill-0", SourceGeneration: 7,
		DestinationInstance: "decode-0", DestinationGeneration: 3, BlockCount: uint32(count), TransferEpoch: epoch}
}

// noneInFlight asserts that no slot of n is being written and no session
// or lease is left: nothing of a transfer leaked.
func noneInFlight(t *testing.T, n *node) {
	t.Helper()
	st := n.owner.Stats()
	if st.ByState["WRITING"] != 0 || st.ByState["SEALED"] != 0 || st.ByState["ALLOCATED"] != 0 || st.Sessions != 0 || st.Leases != 0 {
		t.Fatalf("transfer left state behind: %+v", st)
	}
}

func TestPullOverQUIC(t *testing.T) {
	t.Parallel()
	c := certs(t)
	const size = 48 << 10
	src, dst := newNode(t, c, size), newNode(t, c, size)
	keys := chain(10, "a")
	want := src.publish(t, keys, size)
	// The destination already holds the first two blocks: only the rest
	// travels.
	dst.publish(t, keys[:2], size)
	copy(want[:2], dst.read(t, keys[:2]))
	reply := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	if reply.Error != "" || reply.Local != 2 || reply.Pulled != 8 || reply.Bytes != 8*size || reply.Source != src.addr {
		t.Fatalf("pull: %+v", reply)
	}
	got := dst.read(t, keys)
	for i := range keys {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("block %d differs after the transfer", i)
		}
	}
	// The destination's blocks are its own: they survive the source.
	src.owner.Close()
	if got := dst.read(t, keys); !bytes.Equal(got[9], want[9]) {
		t.Fatal("pulled block gone with the source")
	}
	noneInFlight(t, dst)
	if st := dst.engine.Stats(); st.BlocksPulled != 8 || st.PullsOK != 1 || st.BlocksLocal != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A source that lacks the blocks is skipped for the next one; a source
// whose bytes do not match their checksum makes nothing readable.
func TestPullRetriesAnotherSourceAndRejectsCorruptBytes(t *testing.T) {
	t.Parallel()
	c := certs(t)
	const size = 4096
	empty, corrupt, good, dst := newNode(t, c, size), newNode(t, c, size), newNode(t, c, size), newNode(t, c, size)
	keys := chain(6, "b")
	want := good.publish(t, keys, size)
	corrupt.publish(t, keys, size)
	// Flip a byte of a published block behind the owner's back.
	sid, _, _, _ := corrupt.owner.Hello(kv.Writer{Instance: "x", Gen: 1}, nil, nil)
	refs, _ := corrupt.owner.Acquire(sid, keys[3:4])
	corrupt.owner.Arena().Payload(int(refs[0].Slot))[10] ^= 0xff
	corrupt.owner.EndSession(sid)

	only := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{corrupt.addr}})
	if only.Error == "" || only.Pulled != 0 || !strings.Contains(only.Error, "checksum") {
		t.Fatalf("corrupt source accepted: %+v", only)
	}
	if got := dst.read(t, keys); got[0] != nil {
		t.Fatal("a block of a failed transfer is readable")
	}
	noneInFlight(t, dst)

	reply := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(2, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{empty.addr, corrupt.addr, good.addr}})
	if reply.Error != "" || reply.Pulled != 6 || reply.Source != good.addr {
		t.Fatalf("pull: %+v", reply)
	}
	if got := dst.read(t, keys); !bytes.Equal(got[5], want[5]) {
		t.Fatal("wrong bytes")
	}
	if st := dst.engine.Stats(); st.SourceFailures != 3 || st.ChecksumErrors != 2 {
		t.Fatalf("stats %+v", st)
	}
	noneInFlight(t, dst)
}

// A transfer whose epoch is older than one already seen for the request,
// or whose destination generation is not current, is dropped and counted.
func TestPullDropsStaleBindings(t *testing.T) {
	t.Parallel()
	c := certs(t)
	const size = 1024
	src, dst := newNode(t, c, size), newNode(t, c, size)
	keys := chain(4, "c")
	src.publish(t, keys, size)
	dst.engine.Current = func(b *transferpb.Binding) error {
		if b.DestinationGeneration != 3 {
			return fmt.Errorf("decode-0 is at generation 3, not %d", b.DestinationGeneration)
		}
		return nil
	}
	newer := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(5, 2), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	if newer.Error != "" || newer.Pulled != 2 {
		t.Fatalf("pull: %+v", newer)
	}
	old := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(4, 4), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	oldGen := binding(6, 4)
	oldGen.DestinationGeneration = 2
	gen := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: oldGen, Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	for _, r := range []*transferpb.PullReply{old, gen} {
		if !r.Stale || r.Pulled != 0 || !strings.Contains(r.Error, "stale") {
			t.Fatalf("stale binding not dropped: %+v", r)
		}
	}
	if got := dst.read(t, keys); got[2] != nil {
		t.Fatal("a stale transfer published a block")
	}
	if st := dst.engine.Stats(); st.StaleDropped != 2 {
		t.Fatalf("stats %+v", st)
	}
	noneInFlight(t, dst)
}

func TestPullBadInput(t *testing.T) {
	t.Parallel()
	c := certs(t)
	dst := newNode(t, c, 1024)
	keys := chain(2, "d")
	withID := func(id string, b *transferpb.Binding) *transferpb.Binding { b.RequestId = id; return b }
	cases := []struct {
		name, want string
		p          *transferpb.Pull
	}{
		{"no binding", "no binding", &transferpb.Pull{Keys: blockid.KeyBytes(keys)}},
		{"epoch 0", "transfer epoch 0", &transferpb.Pull{Binding: withID("b", binding(0, 2)), Keys: blockid.KeyBytes(keys)}},
		{"short key", "has 2 bytes", &transferpb.Pull{Binding: withID("c", binding(1, 1)), Keys: [][]byte{{1, 2}}}},
		{"zero key", "is zero", &transferpb.Pull{Binding: withID("d", binding(1, 1)), Keys: [][]byte{make([]byte, 32)}}},
		{"range", "block range", &transferpb.Pull{Binding: withID("e", binding(1, 9)), Keys: blockid.KeyBytes(keys)}},
		{"no source", "no source", &transferpb.Pull{Binding: withID("f", binding(1, 2)), Keys: blockid.KeyBytes(keys)}},
		{"too many sources", "sources", &transferpb.Pull{Binding: withID("g", binding(1, 2)), Keys: blockid.KeyBytes(keys), Sources: make([]string, MaxSources+1)}},
		{"dead source", "dial", &transferpb.Pull{Binding: withID("h", binding(1, 2)), Keys: blockid.KeyBytes(keys), Sources: []string{"127.0.0.1:1"}}},
	}
	// The cases run side by side (one waits out a dial); the group ends
	// before the check that none left state behind.
	t.Run("cases", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				r := dst.engine.Pull(context.Background(), tc.p)
				if r.Pulled != 0 || !strings.Contains(r.Error, tc.want) || r.Stale {
					t.Errorf("%+v (want an error naming %q)", r, tc.want)
				}
				// A dead source costs one dial timeout (3 s), not one
				// for the data path's question and another for QUIC.
				if took := time.Since(start); took > 4500*time.Millisecond {
					t.Errorf("took %v (want one dial timeout, 3 s)", took)
				}
			})
		}
	})
	noneInFlight(t, dst)
}

// fakeSource is a source that is not an engine: real QUIC with the
// cluster's TLS, each stream handed to handle.
func fakeSource(t *testing.T, certDir string, handle func(st *quic.Stream)) string {
	t.Helper()
	tlsConf, err := transferclient.TLS(certDir)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", tlsConf, transferclient.QUICConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				for {
					st, err := conn.AcceptStream(context.Background())
					if err != nil {
						return
					}
					go handle(st)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// hostileSource answers every fetch with answer's frames and bytes.
func hostileSource(t *testing.T, certDir string, answer func(w io.Writer, f *transferpb.Fetch)) string {
	t.Helper()
	return fakeSource(t, certDir, func(st *quic.Stream) {
		var req transferpb.Request
		if frame.Read(bufio.NewReader(st), &req) == nil && req.GetFetch() != nil {
			answer(st, req.GetFetch())
		}
		st.Close()
	})
}

// TestPullRejectsHostileSources: a source that lies about what it sends
// gets a typed error, never a panic or a write outside the staged slots,
// and nothing of its transfer is readable.
func TestPullRejectsHostileSources(t *testing.T) {
	t.Parallel()
	c := certs(t)
	dst := newNode(t, c, 1024)
	dst.engine.transport.(*QUIC).Streams = 1
	keys := chain(3, "h")
	header := func(w io.Writer, i int, key []byte, n uint32) {
		frame.Write(w, &transferpb.BlockHeader{Index: uint32(i), Key: key, PayloadLen: n, Checksum: 0})
	}
	for i, tc := range []struct {
		name, want string
		answer     func(w io.Writer, f *transferpb.Fetch)
	}{
		{"more than asked", "offers", func(w io.Writer, f *transferpb.Fetch) {
			frame.Write(w, &transferpb.FetchStart{Available: f.Count + 5})
		}},
		{"payload larger than a slot", "slots hold", func(w io.Writer, f *transferpb.Fetch) {
			frame.Write(w, &transferpb.FetchStart{Available: f.Count})
			header(w, 0, f.Keys[f.First], 1<<30)
		}},
		{"another key", "another key", func(w io.Writer, f *transferpb.Fetch) {
			frame.Write(w, &transferpb.FetchStart{Available: f.Count})
			header(w, 0, f.Keys[len(f.Keys)-1], 16)
		}},
		{"index out of order", "arrived as", func(w io.Writer, f *transferpb.Fetch) {
			frame.Write(w, &transferpb.FetchStart{Available: f.Count})
			header(w, 7, f.Keys[f.First], 16)
		}},
		{"truncated payload", "source connection", func(w io.Writer, f *transferpb.Fetch) {
			frame.Write(w, &transferpb.FetchStart{Available: f.Count})
			header(w, 0, f.Keys[f.First], 512)
			w.Write(make([]byte, 100))
		}},
		{"wrong checksum", "checksum", func(w io.Writer, f *transferpb.Fetch) {
			frame.Write(w, &transferpb.FetchStart{Available: 1})
			header(w, 0, f.Keys[f.First], 16)
			w.Write(make([]byte, 16))
			frame.Write(w, &transferpb.FetchEnd{Sent: 1})
		}},
	} {
		addr := hostileSource(t, c, tc.answer)
		b := binding(1, len(keys))
		b.RequestId = fmt.Sprint("hostile-", i)
		r := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: b, Keys: blockid.KeyBytes(keys), Sources: []string{addr}})
		if r.Pulled != 0 || !strings.Contains(r.Error, tc.want) {
			t.Errorf("%s: %+v (want %q)", tc.name, r, tc.want)
		}
		if got := dst.read(t, keys); got[0] != nil {
			t.Fatalf("%s: a block became readable", tc.name)
		}
		noneInFlight(t, dst)
	}
}

// BenchmarkFetchQUIC moves 64 MiB of 1 MiB blocks between two owners over
// the QUIC transport (profile it with -cpuprofile).
func BenchmarkFetchQUIC(b *testing.B) { benchFetch(b, false) }

// benchFetch moves 64 MiB of 1 MiB blocks between two owners, over QUIC or
// (tcp) the source's TLS-over-TCP data path, which it then checks was used.
func benchFetch(b *testing.B, tcp bool) {
	c, err := pki.InitIdentity(b.TempDir(), pki.Agent("rdmatest"))
	if err != nil {
		b.Fatal(err)
	}
	src, dst := newNodeTB(b, c, 1<<20), newNodeTB(b, c, 1<<20)
	var dl *dataListener
	if tcp {
		dl = src.serveTCP(b, c, nil)
	}
	keys := chain(64, "bench")
	src.publishTB(b, keys, 1<<20)
	sid, _, _, _ := dst.owner.Hello(kv.Writer{Instance: "d", Gen: 1}, nil, nil)
	refs, err := dst.owner.Allocate(sid, len(keys))
	if err != nil {
		b.Fatal(err)
	}
	tlsConf, _ := transferclient.TLS(c)
	q := NewQUIC(tlsConf)
	defer q.Close()
	f := &transferpb.Fetch{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Count: uint32(len(keys))}
	b.SetBytes(int64(len(keys)) << 20)
	for b.Loop() {
		if _, err := q.Fetch(context.Background(), src.addr, f, func(i int, h *transferpb.BlockHeader) ([]byte, error) {
			return dst.owner.Arena().Payload(int(refs[i].Slot))[:h.PayloadLen], nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	if tcp && dl.accepted.Load() == 0 {
		b.Fatal("the data path was not used")
	}
}

// TestPullCancelReleasesSlots: a source that accepts the transfer and then
// sends nothing holds the pull until the caller cancels it; the cancel
// ends the pull at once and frees every staged slot.
func TestPullCancelReleasesSlots(t *testing.T) {
	t.Parallel()
	c := certs(t)
	dst := newNode(t, c, 1024)
	// A hung source: reads the request, never answers.
	hung := fakeSource(t, c, func(st *quic.Stream) { io.Copy(io.Discard, st) })
	dst.engine.transport.(*QUIC).Stall = time.Minute
	keys := chain(8, "e")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *transferpb.PullReply, 1)
	go func() {
		done <- dst.engine.Pull(ctx, &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{hung}})
	}()
	// Wait until the pull holds its staged slots.
	proctest.WaitFor(t, 10*time.Second, "the pull to stage its slots", func() (bool, string) {
		st := dst.owner.Stats()
		return st.ByState["WRITING"] == len(keys), fmt.Sprintf("%+v", st)
	})
	cancel()
	select {
	case r := <-done:
		if r.Error == "" || r.Pulled != 0 {
			t.Fatalf("cancelled pull: %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not end the pull")
	}
	noneInFlight(t, dst)
	if st := dst.engine.Stats(); st.StagedAborted != uint64(len(keys)) || st.PullsInProgress != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPullStaleAtCommit: the destination instance restarts (a new
// generation) while the blocks travel; the binding is checked again once
// every byte arrived, and the transfer is dropped: nothing published, its
// slots freed.
func TestPullStaleAtCommit(t *testing.T) {
	t.Parallel()
	c := certs(t)
	src, dst := newNode(t, c, 2048), newNode(t, c, 2048)
	keys := chain(5, "commit")
	src.publish(t, keys, 2048)
	checks := 0
	dst.engine.Current = func(b *transferpb.Binding) error {
		checks++
		if checks > 1 {
			return fmt.Errorf("decode-0 restarted at generation 4")
		}
		return nil
	}
	r := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	if !r.Stale || r.Pulled != 0 || !strings.Contains(r.Error, "restarted") || checks != 2 {
		t.Fatalf("pull over a restart: %+v after %d checks", r, checks)
	}
	if got := dst.read(t, keys); got[0] != nil {
		t.Fatal("a block of the stale transfer is readable")
	}
	if st := dst.engine.Stats(); st.StaleDropped != 1 || st.StagedAborted != uint64(len(keys)) {
		t.Fatalf("stats %+v", st)
	}
	noneInFlight(t, dst)
}

// TestVerbsFetchRefusedWithoutVerbs: a node without the verbs transport
// answers a verbs fetch with a typed refusal, so that an RDMA peer falls
// back to QUIC.
func TestVerbsFetchRefusedWithoutVerbs(t *testing.T) {
	t.Parallel()
	c := certs(t)
	src := newNode(t, c, 1024)
	keys := chain(2, "v")
	tlsConf, _ := transferclient.TLS(c)
	q := NewQUIC(tlsConf)
	defer q.Close()
	st, _, stop, err := q.Stream(context.Background(), src.addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	defer st.Close()
	f := &transferpb.Fetch{Binding: binding(1, 2), Keys: blockid.KeyBytes(keys), Count: 2}
	if err := frame.Write(st, &transferpb.Request{Op: &transferpb.Request_VerbsFetch{VerbsFetch: &transferpb.VerbsFetch{Fetch: f}}}); err != nil {
		t.Fatal(err)
	}
	var offer transferpb.VerbsOffer
	if err := frame.Read(bufio.NewReader(st), &offer); err != nil || !strings.Contains(offer.Error, "no RDMA verbs") || len(offer.Blocks) != 0 {
		t.Fatalf("offer %+v, %v", &offer, err)
	}
}
