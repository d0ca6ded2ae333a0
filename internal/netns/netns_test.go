package netns

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needRoot skips without root or ip, except in CI (LIFELINE_CI), where
// that is a failure: CI runs as root.
func needRoot(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatalf("CI runs as root with iproute2: %v", err)
		}
		t.Skip(err)
	}
}

// listenIn opens a TCP listener on addr inside namespace name (a socket
// stays in the namespace it was made in; the thread that made it dies
// with its goroutine, never back in the pool).
func listenIn(t *testing.T, name, addr string) net.Listener {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result)
	inNamespace(name, func(err error) {
		if err != nil {
			ch <- result{err: err}
			return
		}
		ln, err := net.Listen("tcp", addr)
		ch <- result{ln, err}
	})
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.ln.Close() })
	go func() {
		for {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	return r.ln
}

// reach says whether a connection to addr gets the listener's greeting
// within d.
func reach(addr string, d time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	b := make([]byte, 2)
	_, err = c.Read(b)
	return err == nil && string(b) == "hi"
}

// reachFrom is reach from inside namespace name.
func reachFrom(t *testing.T, name, addr string) bool {
	t.Helper()
	ch := make(chan bool)
	inNamespace(name, func(err error) {
		if err != nil {
			t.Error(err)
			ch <- false
			return
		}
		ch <- reach(addr, time.Second)
	})
	return <-ch
}

// inNamespace runs f on a thread of its own that joined the network
// namespace name (err says why it could not). The thread is never given
// back: it exits with f's goroutine.
func inNamespace(name string, f func(err error)) {
	go func() {
		runtime.LockOSThread()
		ns, err := os.Open("/run/netns/" + name)
		if err == nil {
			err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
			ns.Close()
		}
		f(err)
	}()
}

func TestCutAndHeal(t *testing.T) {
	needRoot(t)
	nt, err := Create(2)
	if err != nil {
		t.Fatal(err)
	}
	defer nt.Close()
	a, b := nt.Nodes[0], nt.Nodes[1]
	lnA := listenIn(t, a.Name, net.JoinHostPort(a.IP.String(), "0"))
	lnB := listenIn(t, b.Name, net.JoinHostPort(b.IP.String(), "0"))
	// From the root namespace, both nodes answer.
	if !reach(lnA.Addr().String(), 2*time.Second) || !reach(lnB.Addr().String(), 2*time.Second) {
		t.Fatal("the nodes do not answer from the root namespace")
	}
	if !reachFrom(t, b.Name, lnA.Addr().String()) {
		t.Fatal("b does not reach a through the bridge")
	}
	if err := a.Cut(); err != nil {
		t.Fatal(err)
	}
	if reach(lnA.Addr().String(), time.Second) {
		t.Fatal("node a answered through its cut link")
	}
	if !reach(lnB.Addr().String(), 2*time.Second) {
		t.Fatal("cutting a cut b off too")
	}
	// b reaches a through the bridge, before the cut and after the heal;
	// not during it.
	if reachFrom(t, b.Name, lnA.Addr().String()) {
		t.Fatal("b reached a through a's cut link")
	}
	if err := a.Heal(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !reach(lnA.Addr().String(), time.Second) {
		if time.Now().After(deadline) {
			t.Fatal("node a does not answer 10 s after its link came back")
		}
	}
	if err := nt.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range nt.Nodes {
		if _, err := os.Stat("/run/netns/" + n.Name); !os.IsNotExist(err) {
			t.Fatalf("namespace %s left after Close (%v)", n.Name, err)
		}
	}
	if err := exec.Command("ip", "link", "show", nt.Bridge).Run(); err == nil {
		t.Fatalf("bridge %s left after Close", nt.Bridge)
	}
}

// TestExec runs `ip -o addr` through Exec in a node's namespace (this
// test binary re-executed): it sees the node's address and not the
// bridge's.
func TestExec(t *testing.T) {
	if name := os.Getenv("NETNS_TEST_EXEC"); name != "" {
		t.Fatal(Exec(name, []string{"ip", "-o", "-4", "addr", "show"}))
	}
	needRoot(t)
	nt, err := Create(1)
	if err != nil {
		t.Fatal(err)
	}
	defer nt.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestExec$")
	cmd.Env = append(os.Environ(), "NETNS_TEST_EXEC="+nt.Nodes[0].Name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), nt.Nodes[0].IP.String()+"/24") || strings.Contains(string(out), nt.HostIP.String()+"/") {
		t.Fatalf("in %s: %s", nt.Nodes[0].Name, out)
	}
}

func TestReapKeepsLiveRuns(t *testing.T) {
	needRoot(t)
	nt, err := Create(1)
	if err != nil {
		t.Fatal(err)
	}
	defer nt.Close()
	for _, g := range Reap() {
		if strings.Contains(g, nt.Nodes[0].Name) || strings.Contains(g, nt.Bridge) {
			t.Fatalf("Reap removed a live run's %s", g)
		}
	}
	if _, err := os.Stat("/run/netns/" + nt.Nodes[0].Name); err != nil {
		t.Fatal(err)
	}
}

// TestMain doubles as a run that TestReapRemovesAKilledRun kills: with
// NETNS_TEST_HOLD set it creates a network, prints its bridge and
// namespace, and waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv("NETNS_TEST_HOLD") != "" {
		nt, err := Create(1)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(nt.Bridge, nt.Nodes[0].Name)
		select {}
	}
	os.Exit(m.Run())
}

// TestReapRemovesAKilledRun: the bridge and namespace of a run that was
// SIGKILLed (so it never removed them) are removed by Reap, and said so.
func TestReapRemovesAKilledRun(t *testing.T) {
	needRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "NETNS_TEST_HOLD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		t.Fatalf("the holding run said nothing: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 2 || f[0] == "error" {
		cmd.Process.Kill()
		t.Fatalf("the holding run: %s", line)
	}
	bridge, ns := f[0], f[1]
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat("/run/netns/" + ns); err != nil {
		t.Fatalf("the killed run's namespace is not there to reap: %v", err)
	}
	gone := strings.Join(Reap(), "; ")
	if !strings.Contains(gone, "namespace "+ns) || !strings.Contains(gone, "bridge "+bridge) {
		t.Fatalf("Reap said %q; want namespace %s and bridge %s", gone, ns, bridge)
	}
	if _, err := os.Stat("/run/netns/" + ns); !os.IsNotExist(err) {
		t.Fatalf("namespace %s still there after Reap: %v", ns, err)
	}
	if err := exec.Command("ip", "link", "show", bridge).Run(); err == nil {
		t.Fatalf("bridge %s still there after Reap", bridge)
	}
}

// TestBridgePIDReadsBackEveryTag: the pid Reap reads from a bridge's name
// is the one its tag was made with, also for pids whose base-36 digits
// include an 'x' (23226 is "hx6": read as 17 before).
func TestBridgePIDReadsBackEveryTag(t *testing.T) {
	for _, pid := range []int{1, 23226, 4194304, 1<<22 - 1} {
		for _, n := range []uint32{1, 33, 1295} {
			name := "ll" + bridgeTag(pid, n) + "b"
			if got, ok := bridgePID(name); !ok || got != pid {
				t.Errorf("bridgePID(%q) = %d, %v; want %d", name, got, ok, pid)
			}
			if len(name) > 15 {
				t.Errorf("%q is longer than an interface name may be", name)
			}
		}
	}
	for _, name := range []string{"llb", "ll_1b", "docker0", "llabc_1", "llzz_1x"} {
		if pid, ok := bridgePID(name); ok {
			t.Errorf("bridgePID(%q) = %d, want none of ours", name, pid)
		}
	}
}
