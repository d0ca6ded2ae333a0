// Package netns puts a local cluster's nodes in network namespaces of their
// own, joined to this (the root) namespace by veth pairs on a bridge, so
// that a node can be cut off from etcd, the frontends and its peers with
// real packet loss: its veth taken down. Root only; the namespaces,
// bridge and veths are made with iproute2's `ip`.
//
// A Net of n nodes is one /24 subnet: the bridge holds .1 (etcd and the
// frontends reach the nodes from it, the nodes reach etcd at it), node i
// holds .(i+2) on its eth0 plus its own loopback.
package netns

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrUnavailable is returned when namespaces cannot be made here (not
// root, or no `ip`).
var ErrUnavailable = errors.New("netns: network namespaces need root and iproute2's ip")

// Available says whether Create can work here (nil) or why not.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root", ErrUnavailable)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// Net is a bridge in the root namespace and one namespace per node.
type Net struct {
	// Bridge is the bridge's name, HostIP its address.
	Bridge string
	HostIP net.IP
	Nodes  []*Node
}

// Node is one node's namespace.
type Node struct {
	// Name is the namespace's name (/run/netns/<Name>), IP its address.
	Name string
	IP   net.IP
	// Link is the root side of its veth pair: down, the node is cut off.
	Link string
}

var seq atomic.Uint32

// Create makes a Net of n nodes on a /24 nobody here uses. Names carry
// this process's id, so that Reap can find what a killed run left.
func Create(n int) (_ *Net, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if n < 1 || n > 250 {
		return nil, fmt.Errorf("netns: %d nodes (1 to 250)", n)
	}
	subnet, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	tag := bridgeTag(os.Getpid(), seq.Add(1))
	nt := &Net{Bridge: "ll" + tag + "b", HostIP: host(subnet, 1)}
	defer func() {
		if err != nil {
			nt.Close()
		}
	}()
	if err := ip("link", "add", nt.Bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	if err := ip("addr", "add", nt.HostIP.String()+"/24", "dev", nt.Bridge); err != nil {
		return nil, err
	}
	if err := ip("link", "set", nt.Bridge, "up"); err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		nd := &Node{Name: fmt.Sprintf("lifeline-%d-%s-%d", os.Getpid(), tag, i), IP: host(subnet, byte(i+2)), Link: fmt.Sprintf("ll%sh%d", tag, i)}
		peer := fmt.Sprintf("ll%sp%d", tag, i)
		nt.Nodes = append(nt.Nodes, nd)
		for _, args := range [][]string{
			{"netns", "add", nd.Name},
			{"link", "add", nd.Link, "type", "veth", "peer", "name", peer},
			{"link", "set", peer, "netns", nd.Name},
			{"link", "set", nd.Link, "master", nt.Bridge},
			{"link", "set", nd.Link, "up"},
			{"-n", nd.Name, "link", "set", "lo", "up"},
			{"-n", nd.Name, "link", "set", peer, "name", "eth0"},
			{"-n", nd.Name, "addr", "add", nd.IP.String() + "/24", "dev", "eth0"},
			{"-n", nd.Name, "link", "set", "eth0", "up"},
		} {
			if err := ip(args...); err != nil {
				return nil, err
			}
		}
	}
	return nt, nil
}

// Cut takes the node's link down: from now on every packet between it
// and anything outside its namespace is lost.
func (n *Node) Cut() error { return ip("link", "set", n.Link, "down") }

// Heal brings the node's link back up.
func (n *Node) Heal() error { return ip("link", "set", n.Link, "up") }

// Wrap returns the command that runs argv in the node's namespace:
// binary (a lifeline executable) re-executes itself there (`lifeline
// netns-exec`, which calls Exec).
func (n *Node) Wrap(binary string, argv []string) []string {
	return append([]string{binary, "netns-exec", n.Name, "--"}, argv...)
}

// Close removes the namespaces (their veths go with them) and the bridge.
func (nt *Net) Close() error {
	var errs []error
	for _, n := range nt.Nodes {
		if err := ip("netns", "del", n.Name); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	if err := ip("link", "del", nt.Bridge); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Exec replaces this process with argv run in namespace name: the calling
// thread joins the namespace, then execs (the new program has that one
// thread's namespace). It returns only on failure.
func Exec(name string, argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("netns: exec in %s: no command", name)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	runtime.LockOSThread()
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		f.Close()
		return fmt.Errorf("netns: join %s: %w", name, err)
	}
	f.Close()
	return syscall.Exec(path, argv, os.Environ())
}

// Reap removes the namespaces and bridges of runs whose process is gone,
// and says what it removed.
func Reap() []string {
	if Available() != nil {
		return nil
	}
	var gone []string
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		parts := strings.Split(name, "-")
		if len(parts) != 4 || parts[0] != "lifeline" {
			continue
		}
		if pid, err := strconv.Atoi(parts[1]); err == nil && !alive(pid) && ip("netns", "del", name) == nil {
			gone = append(gone, "namespace "+name)
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if pid, ok := bridgePID(name); ok && !alive(pid) && ip("link", "del", name) == nil {
			gone = append(gone, "bridge "+name)
		}
	}
	return gone
}

// bridgeTag names a run's links: its pid and a sequence number in base
// 36, joined by '_', which no base-36 digit is (an 'x' was, and a pid
// written with one was read as another).
func bridgeTag(pid int, n uint32) string {
	return strconv.FormatInt(int64(pid), 36) + "_" + strconv.FormatInt(int64(n), 36)
}

// bridgePID is the pid of the run that made the bridge name ("ll" +
// bridgeTag + "b"), if it is one of ours.
func bridgePID(name string) (int, bool) {
	tag, ok := strings.CutPrefix(name, "ll")
	p, rest, ok2 := strings.Cut(tag, "_")
	if !ok || !ok2 || !strings.HasSuffix(rest, "b") {
		return 0, false
	}
	pid, err := strconv.ParseInt(p, 36, 32)
	return int(pid), err == nil && pid > 0
}

func alive(pid int) bool {
	return pid > 0 && (syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM))
}

// freeSubnet picks a 10.x.y.0/24 that no address or route here overlaps.
func freeSubnet() (net.IP, error) {
	used := map[[2]byte]bool{}
	for _, args := range [][]string{{"-o", "-4", "addr", "show"}, {"-4", "route", "show", "table", "all"}} {
		out, err := exec.Command("ip", args...).Output()
		if err != nil {
			return nil, fmt.Errorf("netns: ip %s: %w", strings.Join(args, " "), err)
		}
		for _, f := range strings.Fields(string(out)) {
			addr, _, _ := strings.Cut(f, "/")
			if v4 := net.ParseIP(addr).To4(); v4 != nil && v4[0] == 10 {
				used[[2]byte{v4[1], v4[2]}] = true
			}
		}
	}
	start := os.Getpid()*31 + int(seq.Load())*7
	for i := 0; i < 200*250; i++ {
		k := (start + i) % (200 * 250)
		b := [2]byte{byte(50 + k/250), byte(k % 250)}
		if !used[b] {
			return net.IPv4(10, b[0], b[1], 0).To4(), nil
		}
	}
	return nil, errors.New("netns: no free 10.x.y.0/24")
}

func host(subnet net.IP, last byte) net.IP {
	ip := append(net.IP(nil), subnet.To4()...)
	ip[3] = last
	return ip
}

// ip runs `ip args…`.
func ip(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("netns: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
