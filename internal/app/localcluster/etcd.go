package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/internal/embedetcd"
)

// EtcdMember is one member of an etcd cluster run as a process of its own
// (`lifeline etcd`): drills and tests kill, stop and restart it.
type EtcdMember struct {
	Name string
	// Endpoint is its client address.
	Endpoint string

	binary string
	m      embedetcd.Member
	log    io.Writer
	cmd    *exec.Cmd
	exited chan struct{}
}

// startMembers starts n member processes of one cluster (they bootstrap
// together) and returns once every one serves.
func startMembers(binary, dir, certs string, n int, hosts []string, election time.Duration, log io.Writer) ([]*EtcdMember, error) {
	ms := make([]*EtcdMember, n)
	var peers []string
	for i := range ms {
		cp, err := embedetcd.FreePort()
		if err != nil {
			return nil, err
		}
		pp, err := embedetcd.FreePort()
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("etcd-%d", i)
		m := embedetcd.Member{Name: name, Dir: filepath.Join(dir, name), ClientPort: cp, PeerPort: pp, CertDir: certs, ClientHosts: hosts, ElectionTimeout: election}
		ms[i] = &EtcdMember{Name: name, Endpoint: fmt.Sprintf("127.0.0.1:%d", cp), binary: binary, m: m, log: log}
		peers = append(peers, name+"="+m.PeerURL())
	}
	ready := make([]<-chan error, n)
	for i, m := range ms {
		m.m.InitialCluster = strings.Join(peers, ",")
		r, err := m.start()
		if err != nil {
			stopMembers(ms[:i])
			return nil, err
		}
		ready[i] = r
	}
	for i, r := range ready {
		if err := served(r); err != nil {
			stopMembers(ms)
			return nil, fmt.Errorf("localcluster: etcd member %s: %w", ms[i].Name, err)
		}
	}
	return ms, nil
}

// start runs the member's process; the channel says when it serves.
func (m *EtcdMember) start() (<-chan error, error) {
	args := []string{"etcd", "--name", m.m.Name, "--data-dir", m.m.Dir, "--client-port", fmt.Sprint(m.m.ClientPort),
		"--peer-port", fmt.Sprint(m.m.PeerPort), "--initial-cluster", m.m.InitialCluster, "--certs", m.m.CertDir}
	for _, h := range m.m.ClientHosts {
		args = append(args, "--client-host", h)
	}
	if m.m.Join {
		args = append(args, "--join")
	}
	if m.m.ElectionTimeout > 0 {
		args = append(args, "--election-timeout", m.m.ElectionTimeout.String())
	}
	cmd := exec.Command(m.binary, args...)
	// It stops (SIGTERM) when this process dies, even by SIGKILL: a
	// killed up or test leaves nothing running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Stderr = m.log
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: etcd member %s: %w", m.Name, err)
	}
	m.cmd, m.exited = cmd, make(chan struct{})
	ready := make(chan error, 1)
	go func() {
		served := false
		scanLines(out, func(line string) {
			if !served && strings.HasPrefix(line, "etcd: member ") {
				served = true
				ready <- nil
			}
			fmt.Fprintln(m.log, line)
		}, m.log)
		cmd.Wait()
		if !served {
			ready <- fmt.Errorf("exited before serving (%v)", cmd.ProcessState)
		}
		close(m.exited)
	}()
	return ready, nil
}

// served waits for a started member to serve, a minute at most.
func served(r <-chan error) error {
	select {
	case err := <-r:
		return err
	case <-time.After(time.Minute):
		return fmt.Errorf("not serving after a minute")
	}
}

// PID is the member's process id (0 once it exited).
func (m *EtcdMember) PID() int {
	select {
	case <-m.exited:
		return 0
	default:
		return m.cmd.Process.Pid
	}
}

// Signal sends sig to the member's process.
func (m *EtcdMember) Signal(sig syscall.Signal) error { return m.cmd.Process.Signal(sig) }

// Kill SIGKILLs the member and waits for its exit.
func (m *EtcdMember) Kill() {
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.exited
}

// Restart starts a member that exited again, on its data (it rejoins the
// cluster), and returns once it serves.
func (m *EtcdMember) Restart() error {
	select {
	case <-m.exited:
	default:
		return fmt.Errorf("localcluster: etcd member %s still runs", m.Name)
	}
	r, err := m.start()
	if err != nil {
		return err
	}
	return served(r)
}

// Exited is closed when the member's current process has exited.
func (m *EtcdMember) Exited() <-chan struct{} { return m.exited }

// ExitState says how the member's last process ended.
func (m *EtcdMember) ExitState() string {
	if m.cmd == nil || m.cmd.ProcessState == nil {
		return "running"
	}
	return m.cmd.ProcessState.String()
}

// Relaunch starts a member that exited again without waiting for it to
// serve: on its data when it has some (it rejoins the cluster); when its
// data is gone, as a new member in its place — the old one removed and
// the new one added through cli (a client of the cluster with etcd's root
// role), then started to join.
func (m *EtcdMember) Relaunch(ctx context.Context, cli *clientv3.Client) (replaced bool, err error) {
	if _, err := os.Stat(filepath.Join(m.m.Dir, "member")); errors.Is(err, fs.ErrNotExist) {
		if err := m.replace(ctx, cli); err != nil {
			return false, fmt.Errorf("localcluster: etcd member %s lost its data; replacing it: %w", m.Name, err)
		}
		replaced = true
	}
	_, err = m.start()
	return replaced, err
}

// replace removes the member from the cluster and adds a new one at its
// peer URL; its next start joins.
func (m *EtcdMember) replace(ctx context.Context, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return err
	}
	for _, mem := range list.Members {
		if slices.Contains(mem.PeerURLs, m.m.PeerURL()) {
			if _, err := cli.MemberRemove(ctx, mem.ID); err != nil {
				return fmt.Errorf("member remove: %w", err)
			}
		}
	}
	added, err := cli.MemberAdd(ctx, []string{m.m.PeerURL()})
	if err != nil {
		return fmt.Errorf("member add: %w", err)
	}
	var peers []string
	for _, mem := range added.Members {
		name := mem.Name
		if mem.ID == added.Member.ID {
			name = m.Name
		}
		for _, u := range mem.PeerURLs {
			peers = append(peers, name+"="+u)
		}
	}
	m.m.InitialCluster, m.m.Join = strings.Join(peers, ","), true
	os.MkdirAll(m.m.Dir, 0o700)
	return nil
}

// stop ends the member: SIGCONT (it may be stopped), SIGTERM, and SIGKILL
// after 10 s.
func (m *EtcdMember) stop() {
	if m.cmd == nil || m.PID() == 0 {
		return
	}
	m.cmd.Process.Signal(syscall.SIGCONT)
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		m.cmd.Process.Signal(syscall.SIGKILL)
		<-m.exited
	}
}

func stopMembers(ms []*EtcdMember) {
	for _, m := range ms {
		m.stop()
	}
}

// FreeLoopbackAddr is a loopback TCP address free now (a child process
// is told to listen there).
func FreeLoopbackAddr() (string, error) {
	p, err := embedetcd.FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p), nil
}
