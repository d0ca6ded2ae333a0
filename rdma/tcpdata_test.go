package rdma

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// dataListener counts the data path connections a source accepted and
// wraps each one (nil: as it is).
type dataListener struct {
	net.Listener
	accepted atomic.Int64
	wrap     func(net.Conn) net.Conn
	// fail is how many Accepts fail, as out of file descriptors, first.
	fail atomic.Int32
}

func (l *dataListener) Accept() (net.Conn, error) {
	if l.fail.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
		if l.wrap != nil {
			c = l.wrap(c)
		}
	}
	return c, err
}

// serveTCP starts n's TLS-over-TCP data path on loopback with certDir's
// certificates.
func (n *node) serveTCP(t testing.TB, certDir string, wrap func(net.Conn) net.Conn) *dataListener {
	t.Helper()
	return n.serveTCPFailing(t, certDir, wrap, 0)
}

// serveTCPFailing is serveTCP with the first fail Accepts failing.
func (n *node) serveTCPFailing(t testing.TB, certDir string, wrap func(net.Conn) net.Conn, fail int32) *dataListener {
	t.Helper()
	tlsConf, err := transferclient.TLS(certDir)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dl := &dataListener{Listener: ln, wrap: wrap}
	dl.fail.Store(fail)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.engine.ServeTCP(ctx, dl, tlsConf); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(5 * time.Second)
	for n.engine.dataPort.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the data path never started")
		}
		time.Sleep(time.Millisecond)
	}
	return dl
}

// TestPullOverTCPDataPath: a source that offers a data path is fetched
// from over it, every byte arrives intact, and a source that offers none
// is fetched from over QUIC.
func TestPullOverTCPDataPath(t *testing.T) {
	t.Parallel()
	c := certs(t)
	src, plain, dst := newNode(t, c, 64<<10), newNode(t, c, 64<<10), newNode(t, c, 64<<10)
	dl := src.serveTCP(t, c, nil)
	keys := chain(9, "tcp")
	want := src.publish(t, keys, 64<<10)
	r := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	if r.Error != "" || r.Pulled != uint32(len(keys)) {
		t.Fatalf("pull: %+v", r)
	}
	if dl.accepted.Load() == 0 {
		t.Fatal("the pull did not use the data path")
	}
	for i, got := range dst.read(t, keys) {
		if string(got) != string(want[i]) {
			t.Fatalf("block %d differs", i)
		}
	}
	// A source without a data path: QUIC.
	other := chain(3, "quic-only")
	plain.publish(t, other, 1000)
	b := binding(1, len(other))
	b.RequestId = "quic-only"
	if r := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: b, Keys: blockid.KeyBytes(other), Sources: []string{plain.addr}}); r.Error != "" || r.Pulled != 3 {
		t.Fatalf("pull over QUIC: %+v", r)
	}
	noneInFlight(t, dst)
}

// TestDataPathOutlivesAcceptErrors: Accepts failing as out of file
// descriptors do not end the data path: the pull after them still goes
// over it.
func TestDataPathOutlivesAcceptErrors(t *testing.T) {
	t.Parallel()
	c := certs(t)
	src, dst := newNode(t, c, 64<<10), newNode(t, c, 64<<10)
	dl := src.serveTCPFailing(t, c, nil, 3)
	keys := chain(4, "emfile")
	src.publish(t, keys, 64<<10)
	r := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	if r.Error != "" || r.Pulled != uint32(len(keys)) {
		t.Fatalf("pull: %+v", r)
	}
	if dl.fail.Load() >= 0 || dl.accepted.Load() == 0 {
		t.Fatalf("injected Accept errors not all taken (counter %d), %d data connections accepted: the data path ended on them", dl.fail.Load(), dl.accepted.Load())
	}
	noneInFlight(t, dst)
}

// cutConn cuts its connection (closes it) once it wrote limit bytes.
type cutConn struct {
	net.Conn
	mu    sync.Mutex
	limit int
}

func (c *cutConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) >= c.limit {
		n, _ := c.Conn.Write(p[:c.limit])
		c.limit = 0
		c.Conn.Close()
		return n, net.ErrClosed
	}
	c.limit -= len(p)
	return c.Conn.Write(p)
}

// TestPullCutDataPathPublishesNothing: the data connection cut halfway
// through the blocks ends the pull with the source connection's error,
// and none of the blocks becomes readable; no slot stays staged.
func TestPullCutDataPathPublishesNothing(t *testing.T) {
	t.Parallel()
	c := certs(t)
	src, dst := newNode(t, c, 64<<10), newNode(t, c, 64<<10)
	dl := src.serveTCP(t, c, func(conn net.Conn) net.Conn { return &cutConn{Conn: conn, limit: 4 * 64 << 10} })
	keys := chain(8, "cut")
	src.publish(t, keys, 64<<10)
	r := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	if r.Pulled != 0 || !strings.Contains(r.Error, "source connection") {
		t.Fatalf("pull over a cut data path: %+v", r)
	}
	if dl.accepted.Load() == 0 {
		t.Fatal("the pull did not use the data path")
	}
	for i, got := range dst.read(t, keys) {
		if got != nil {
			t.Fatalf("block %d became readable", i)
		}
	}
	if s := dst.engine.Stats(); s.PullsFailed != 1 || s.BlocksPulled != 0 {
		t.Fatalf("stats: %+v", s)
	}
	noneInFlight(t, dst)
}

// TestDataPathOfAnotherAgentIsRefused: a data path that presents another
// certificate than the QUIC endpoint (here another agent of the same CA)
// is hung up on before anything is asked there; the fetch goes over QUIC,
// and later fetches do not dial that data path again for a while.
func TestDataPathOfAnotherAgentIsRefused(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	c, err := pki.InitIdentity(root, pki.Agent("rdmatest"))
	if err != nil {
		t.Fatal(err)
	}
	impostorCerts, err := pki.InitIdentity(root, pki.Agent("impostor"))
	if err != nil {
		t.Fatal(err)
	}
	src, impostor, dst := newNode(t, c, 1024), newNode(t, impostorCerts, 1024), newNode(t, c, 1024)
	dl := impostor.serveTCP(t, impostorCerts, nil)
	src.engine.dataPort.Store(impostor.engine.dataPort.Load()) // src offers the impostor's port
	keys := chain(3, "impostor")
	want := src.publish(t, keys, 1000)
	r := dst.engine.Pull(context.Background(), &transferpb.Pull{Binding: binding(1, len(keys)), Keys: blockid.KeyBytes(keys), Sources: []string{src.addr}})
	if r.Error != "" || r.Pulled != 3 {
		t.Fatalf("pull: %+v", r)
	}
	if dl.accepted.Load() == 0 {
		t.Fatal("the impostor's data path was never dialed")
	}
	if s := impostor.engine.Stats(); s.FetchesServed != 0 {
		t.Fatalf("the impostor was asked a fetch: %+v", s)
	}
	for i, got := range dst.read(t, keys) {
		if string(got) != string(want[i]) {
			t.Fatalf("block %d differs", i)
		}
	}
	before := dl.accepted.Load()
	q := dst.engine.transport.(*QUIC)
	sid, _, _, _ := dst.owner.Hello(kv.Writer{Instance: "d", Gen: 1}, nil, nil)
	refs, err := dst.owner.Allocate(sid, len(keys))
	if err != nil {
		t.Fatal(err)
	}
	f := &transferpb.Fetch{Binding: binding(3, len(keys)), Keys: blockid.KeyBytes(keys), Count: uint32(len(keys))}
	if n, err := q.Fetch(context.Background(), src.addr, f, func(i int, h *transferpb.BlockHeader) ([]byte, error) {
		return dst.owner.Arena().Payload(int(refs[i].Slot))[:h.PayloadLen], nil
	}); err != nil || n != len(keys) {
		t.Fatalf("fetch: %d, %v", n, err)
	}
	if dl.accepted.Load() != before {
		t.Fatal("a shelved data path was dialed again")
	}
}

// TestDataPathServesFetchesOnly: a pull asked on the data path is refused
// there with an answer, not served.
func TestDataPathServesFetchesOnly(t *testing.T) {
	t.Parallel()
	c := certs(t)
	src := newNode(t, c, 1024)
	src.serveTCP(t, c, nil)
	tlsConf, err := transferclient.TLS(c)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(src.engine.dataPort.Load()))), tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	keys := chain(1, "p")
	if err := frame.Write(conn, &transferpb.Request{Op: &transferpb.Request_Pull{Pull: &transferpb.Pull{Binding: binding(1, 1), Keys: blockid.KeyBytes(keys)}}}); err != nil {
		t.Fatal(err)
	}
	var start transferpb.FetchStart
	if err := frame.Read(bufio.NewReader(conn), &start); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(start.Error, "fetches only") {
		t.Fatalf("answer: %+v", &start)
	}
	if s := src.engine.Stats(); s.PullsOK+s.PullsFailed != 0 {
		t.Fatalf("a pull was served on the data path: %+v", s)
	}
}

// BenchmarkFetchTCP moves 64 MiB of 1 MiB blocks between two owners over
// the transport's TLS-over-TCP data path (BenchmarkFetchQUIC's blocks;
// profile both with -cpuprofile).
func BenchmarkFetchTCP(b *testing.B) { benchFetch(b, true) }
