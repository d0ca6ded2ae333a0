package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// otherUID is a uid with no passwd entry: another local user.
const otherUID = 12345

// probeEnv carries a probe's plan to the test binary run as otherUID.
const probeEnv = "LIFELINE_ISOLATION_PROBE"

// probe is what the other user tries; every attempt must fail.
type probe struct {
	Unix  []string // sockets to connect to
	Read  []string // files to open, directories to list
	Write []string // files to open for writing, directories to create a file in
	// Worker is a worker's QUIC address, WorkerID and Generation its
	// endpoint: Health and Admin (stop accepting) without a certificate.
	Worker, WorkerID string
	Generation       uint64
	// Transfer is the agent's KV transfer endpoint: a Pull without one.
	Transfer string
	// EtcdClient is etcd's client address: a put of PutKey and a lease
	// keepalive of Lease without a client certificate.
	EtcdClient, PutKey string
	// EtcdPeer is etcd's peer URL: keepalives of Lease for KeepAliveFor.
	EtcdPeer     string
	Lease        int64
	KeepAliveFor time.Duration
}

// attempt is one try and how it ended ("" = it succeeded).
type attempt struct {
	What, Err string
}

// probeBinary hard-links (or copies) this test binary where otherUID can
// execute it.
func probeBinary(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a probe as another uid")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "lifeline-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "probe.test")
	if err := os.Link(self, bin); err != nil {
		b, rerr := os.ReadFile(self)
		if rerr != nil || os.WriteFile(bin, b, 0o755) != nil {
			t.Fatalf("copy the test binary for the probe: %v / %v", err, rerr)
		}
	}
	return bin
}

// asOtherUser runs p as otherUID through bin and returns the attempts;
// ctx's end kills the probe.
func asOtherUser(ctx context.Context, bin string, p probe) ([]attempt, error) {
	plan, _ := json.Marshal(p)
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestIsolationProbe$", "-test.count=1")
	cmd.Dir = "/"
	cmd.Env = []string{probeEnv + "=" + string(plan), "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID, NoSetGroups: true}}
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "PROBE "); ok {
			var as []attempt
			if err := json.Unmarshal([]byte(rest), &as); err != nil {
				return nil, fmt.Errorf("probe output %q: %w", rest, err)
			}
			return as, nil
		}
	}
	return nil, fmt.Errorf("probe as uid %d printed no result (%v):\n%s", otherUID, err, out)
}

// refused fails t for every attempt that succeeded.
func refused(t *testing.T, as []attempt, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if len(as) == 0 {
		t.Fatal("the probe tried nothing")
	}
	for _, a := range as {
		if a.Err == "" {
			t.Errorf("uid %d could %s", otherUID, a.What)
		} else {
			t.Logf("uid %d: %s: refused (%s)", otherUID, a.What, a.Err)
		}
	}
}

// TestIsolationProbe is the other user's side of the isolation tests: it
// runs only as their helper process.
func TestIsolationProbe(t *testing.T) {
	t.Parallel()
	plan := os.Getenv(probeEnv)
	if plan == "" {
		t.Skip("the isolation tests' helper: runs as another uid only")
	}
	var p probe
	if err := json.Unmarshal([]byte(plan), &p); err != nil {
		t.Fatal(err)
	}
	var as []attempt
	try := func(what string, err error) {
		e := ""
		if err != nil {
			e = err.Error()
		}
		as = append(as, attempt{What: what, Err: e})
	}
	for _, s := range p.Unix {
		c, err := net.DialTimeout("unix", s, 2*time.Second)
		if err == nil {
			c.Close()
		}
		try("connect "+s, err)
	}
	for _, f := range p.Read {
		try("read "+f, readPath(f))
	}
	for _, f := range p.Write {
		try("write "+f, writePath(f))
	}
	probeWorker(p, try)
	probeEtcd(p, try)
	b, _ := json.Marshal(as)
	fmt.Printf("\nPROBE %s\n", b)
}

func readPath(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		_, err := os.ReadDir(path)
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Read(make([]byte, 1))
	if errors.Is(err, io.EOF) {
		err = nil // opened and read: an empty file is still readable
	}
	return err
}

func writePath(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		f, err := os.Create(filepath.Join(path, "planted"))
		if err == nil {
			f.Close()
		}
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		f.Close()
	}
	return err
}

// noCert is a client TLS configuration with no certificate at all.
func noCert(alpn string) *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}}
}

func probeWorker(p probe, try func(string, error)) {
	if p.Worker != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := quic.DialAddr(ctx, p.Worker, noCert(workerclient.ALPN), workerclient.QUICConfig())
		if err == nil {
			c := workerclient.New(conn, p.WorkerID, p.Generation)
			_, err = c.Health(ctx)
			try("worker health without a certificate", err)
			_, err = c.Admin(ctx, p.WorkerID, p.Generation, false, p.Generation)
			c.Close()
		}
		try("worker admin (stop accepting) without a certificate", err)
	}
	if p.Transfer != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d := transferclient.NewDialer(noCert(transferclient.ALPN))
		_, err := d.Pull(ctx, p.Transfer, &transferpb.Pull{})
		d.Close()
		try("KV transfer pull without a certificate", err)
	}
}

func probeEtcd(p probe, try func(string, error)) {
	// The renewals start at once, while the lease still lives; the
	// client port's attempts run meanwhile.
	peer := make(chan error, 1)
	go func() { peer <- renewOnPeer(p) }()
	if p.EtcdClient != "" {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{p.EtcdClient}, DialTimeout: 2 * time.Second, TLS: noCert("h2")})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err = c.Put(ctx, p.PutKey, "planted")
			try("etcd put without a client certificate", err)
			_, err = c.KeepAliveOnce(ctx, clientv3.LeaseID(p.Lease))
			cancel()
			c.Close()
		}
		try("etcd lease keepalive without a client certificate", err)
		resp, err := http.Post("http://"+p.EtcdClient+"/v3/kv/put", "application/json",
			strings.NewReader(`{"key":"`+p.PutKey+`","value":"cGxhbnRlZA=="}`))
		try("etcd put over plain HTTP", httpOK(resp, err))
	}
	if p.EtcdPeer != "" {
		try("etcd lease keepalive on the peer port", <-peer)
	}
}

// renewOnPeer sends keepalives of p.Lease to etcd's peer port for the
// whole of p.KeepAliveFor (a working attacker would not stop either); it
// returns nil if any renewal worked, else the last refusal.
func renewOnPeer(p probe) error {
	if p.EtcdPeer == "" {
		return nil
	}
	body, _ := proto.Marshal(&pb.LeaseKeepAliveRequest{ID: p.Lease})
	cl := &http.Client{Timeout: 2 * time.Second}
	last, renewed := errors.New("no keepalive sent"), false
	for end := time.Now().Add(p.KeepAliveFor); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		resp, err := cl.Post(p.EtcdPeer+"/leases", "application/protobuf", bytes.NewReader(body))
		if last = httpOK(resp, err); last == nil {
			renewed = true
		}
	}
	if renewed {
		return nil
	}
	return last
}

// httpOK is nil only for a 200 answer.
func httpOK(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// openToTraversal lets every user walk down to dir (mode 0711 on dir and
// its test-made parents): only what the agent creates may stop them.
func openToTraversal(t *testing.T, dir string) {
	t.Helper()
	for d := dir; strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
}

// wideOpen runs the agent (and its workers) with umask 000 on a data
// directory that already exists with mode 0755: every mode the node ends
// up with is one it set itself.
func wideOpen(c *clustertest.Config) {
	os.MkdirAll(c.DataDir, 0o755)
	os.Chmod(c.DataDir, 0o755)
	c.Wrap = func(cmd *exec.Cmd) *exec.Cmd {
		w := exec.Command("/bin/sh", append([]string{"-c", `umask 000; exec "$0" "$@"`, cmd.Path}, cmd.Args[1:]...)...)
		w.Env = cmd.Env
		return w
	}
}

// TestAnotherUserCannotReachTheNode: with every parent directory open
// to traversal and the agent under umask 000, another local user can
// neither connect to the control or KV socket, nor read or write the
// arena, the data and Badger directories or the certificate keys, nor
// talk to a worker or the transfer endpoint without a certificate. The
// node's files have the modes it promises, no lifeline process holds a
// socket bound to every interface, and the node serves as before.
func TestAnotherUserCannotReachTheNode(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, wideOpen)
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	url := clustertest.StartFrontend(t, n)
	body := map[string]any{"model": "tiny", "prompt": "The keeper", "max_tokens": 8, "seed": 1, "stream": true}
	want, _ := clustertest.StreamCompletion(t, url, body, nil)
	openToTraversal(t, n.Dir)
	openToTraversal(t, n.Env.Dir)

	o := n.Options
	kvSock := filepath.Join(o.DataDir, "kv.sock")
	modes := map[string]fs.FileMode{o.Socket: fs.ModeSocket | 0o600, kvSock: fs.ModeSocket | 0o600, o.ArenaPath: 0o600,
		o.DataDir: fs.ModeDir | 0o700, filepath.Join(o.DataDir, "agent"): fs.ModeDir | 0o700, filepath.Join(o.DataDir, "kv"): fs.ModeDir | 0o700,
		o.CertDir: fs.ModeDir | 0o700}
	p := probe{Unix: []string{o.Socket, kvSock}, Worker: reg.Addr, WorkerID: id, Generation: reg.Generation, Transfer: nodeKVAddr(t, n)}
	for path := range modes {
		p.Read, p.Write = append(p.Read, path), append(p.Write, path)
	}
	for _, root := range []string{o.DataDir, o.CertDir} {
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && path != root {
				p.Read, p.Write = append(p.Read, path), append(p.Write, path)
			}
			if err == nil && !d.IsDir() && strings.HasSuffix(path, "key.pem") {
				modes[path] = 0o600
			}
			return nil
		})
	}
	for path, want := range modes {
		if fi, err := os.Lstat(path); err != nil || fi.Mode()&(fs.ModeType|fs.ModePerm) != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode(), err, want)
		}
	}
	as, err := asOtherUser(t.Context(), probeBinary(t), p)
	refused(t, as, err)
	if planted, _ := filepath.Glob(filepath.Join(o.DataDir, "*", "planted")); len(planted) > 0 {
		t.Errorf("files planted in the node's directories: %v", planted)
	}
	assertNoWildcardSockets(t, n.Env.Binary)

	// Nothing changed: the same registration, and the worker still serves.
	if now := n.WaitRegistration(t, id, 0); now.Generation != reg.Generation {
		t.Errorf("registration at generation %d after the probes, was %d", now.Generation, reg.Generation)
	}
	if got, _ := clustertest.StreamCompletion(t, url, body, nil); len(got) != len(want) {
		t.Errorf("after the probes: %d tokens, want %d", len(got), len(want))
	}
}

// nodeKVAddr is the node's KV transfer address from its node record.
func nodeKVAddr(t *testing.T, n *clustertest.Node) string {
	t.Helper()
	resp, err := n.Env.Client.Get(t.Context(), schema.NodesPrefix+n.Options.NodeID)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node record: %v %v", err, resp)
	}
	var r schema.NodeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil || r.KVAddr == "" {
		t.Fatalf("node record %s: %v", resp.Kvs[0].Value, err)
	}
	return r.KVAddr
}

// assertNoWildcardSockets: over a window with canaries running, no
// process of binary (agents, workers, frontends) holds a TCP or UDP
// socket bound to 0.0.0.0 or ::, and the check saw their QUIC sockets.
func assertNoWildcardSockets(t *testing.T, binary string) {
	t.Helper()
	seen := 0
	proctest.Never(t, 3*time.Second, "a lifeline process bound to every interface", func() (bool, string) {
		var wild []string
		for _, p := range procfs.Mentioning(binary) {
			socks, _ := boundSockets(p.PID)
			for _, s := range socks {
				if s.udp {
					seen++
				}
				if s.ip.IsUnspecified() {
					wild = append(wild, fmt.Sprintf("pid %d (%s): %s *:%d", p.PID, strings.Join(p.Args(), " "), s.proto, s.port))
				}
			}
		}
		return len(wild) > 0, strings.Join(wild, "; ")
	})
	if seen == 0 {
		t.Fatal("no UDP socket of a lifeline process found: the check saw nothing")
	}
}

type boundSocket struct {
	proto string
	ip    net.IP
	port  uint64
	udp   bool
}

// boundSockets lists pid's TCP and UDP sockets with their local
// addresses: /proc/<pid>/fd names socket inodes, /proc/<pid>/net/* maps
// inodes to addresses (kernel byte order per 32-bit word).
func boundSockets(pid int) ([]boundSocket, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var out []boundSocket
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, proto))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			hexIP, hexPort, _ := strings.Cut(f[1], ":")
			port, _ := strconv.ParseUint(hexPort, 16, 16)
			ip := make(net.IP, len(hexIP)/2)
			for i := range ip {
				v, _ := strconv.ParseUint(hexIP[2*i:2*i+2], 16, 8)
				ip[i/4*4+3-i%4] = byte(v) // each 32-bit word is little-endian
			}
			out = append(out, boundSocket{proto: proto, ip: ip, port: port, udp: strings.HasPrefix(proto, "udp")})
		}
	}
	return out, nil
}

// TestAnotherUserCannotKeepADeadNodeRegistered: another local user, with
// no certificate, cannot write to etcd on its client port nor renew the
// agent's lease on either port: with the agent SIGKILLed while they keep
// renewing, its registration still goes when the lease expires.
func TestAnotherUserCannotKeepADeadNodeRegistered(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	const id = "n1-decode-tiny-0"
	n.WaitRegistration(t, id, 0)
	openToTraversal(t, n.Env.Dir)
	key := schema.InstancesPrefix + id
	resp, err := n.Env.Client.Get(t.Context(), key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("registration: %v %v", err, resp)
	}
	members, err := n.Env.Client.MemberList(t.Context())
	if err != nil || len(members.Members) != 1 || len(members.Members[0].PeerURLs) == 0 {
		t.Fatalf("members: %v %v", err, members)
	}
	const hammer = 20 * time.Second
	p := probe{EtcdClient: n.Env.Etcd.Endpoint, PutKey: schema.InstancesPrefix + "planted", EtcdPeer: members.Members[0].PeerURLs[0],
		Lease: resp.Kvs[0].Lease, KeepAliveFor: hammer}
	workers := proctest.WorkerPIDs(filepath.Join(n.Options.DataDir, "kv.sock"))
	t.Cleanup(func() {
		for _, pid := range workers {
			syscall.Kill(pid, syscall.SIGKILL) // their agent is gone for good
		}
	})
	if err := n.Process().Kill(); err != nil {
		t.Fatal(err)
	}
	bin := probeBinary(t)
	type result struct {
		as  []attempt
		err error
	}
	done := make(chan result, 1)
	started := time.Now()
	go func() { as, err := asOtherUser(t.Context(), bin, p); done <- result{as, err} }()
	// TTL 3 s: the registration goes well before the other user stops.
	proctest.WaitFor(t, hammer-5*time.Second, "the dead agent's registration to expire", func() (bool, string) {
		r, err := n.Env.Client.Get(t.Context(), key)
		if err != nil {
			return false, err.Error()
		}
		return len(r.Kvs) == 0, fmt.Sprintf("still registered under lease %x", p.Lease)
	})
	if time.Since(started) >= hammer {
		t.Fatal("the registration expired only once the renewals stopped")
	}
	r := <-done
	refused(t, r.as, r.err)
	if r, err := n.Env.Client.Get(t.Context(), p.PutKey); err != nil || len(r.Kvs) != 0 {
		t.Errorf("planted key: %v %v", err, r)
	}
}

// TestBindAddressNamesOneInterface: workers listen on one address, never
// every interface or a name, and the refusal names the field.
func TestBindAddressNamesOneInterface(t *testing.T) {
	t.Parallel()
	for _, bind := range []string{"0.0.0.0", "::", "localhost", "10.0.0.1:7000"} {
		o := agent.Options{NodeID: "a", DataDir: "d", Socket: "s", Etcd: []string{"x:1"}, CertDir: "c", ArenaPath: "/dev/shm/x", BindAddress: bind}
		o.Defaults()
		if err := o.Validate(); !errors.Is(err, agent.ErrBadConfig) || !strings.Contains(err.Error(), "bind_address") {
			t.Errorf("bind_address %q: %v, want a bind_address refusal", bind, err)
		}
	}
	o := agent.Options{NodeID: "a", DataDir: "d", Socket: "s", Etcd: []string{"x:1"}, CertDir: "c", ArenaPath: "/dev/shm/x"}
	o.Defaults()
	if err := o.Validate(); err != nil || o.BindAddress != "127.0.0.1" {
		t.Errorf("default bind_address %q: %v", o.BindAddress, err)
	}
}
