package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestUpHealsItsEtcd: under `lifeline up --etcd-members 3`, the etcd
// leader is SIGKILLed, up restarts it, the cluster heals, and the next
// leader is killed: five times, the third time with the member's data
// gone too (up replaces it: member remove, member add). Streams served
// throughout are bit-identical to a reference run, and afterwards the
// cluster has three healthy members. Without supervision the second kill
// lost the quorum for good.
func TestUpHealsItsEtcd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	up := startUp(t, dir, "--nodes", "1", "--etcd-members", "3")
	m := regexp.MustCompile(`etcd (\S+) \(mutual TLS\)`).FindStringSubmatch(up.out.String())
	if m == nil {
		t.Fatalf("no etcd endpoints in %q", up.out.String())
	}
	endpoints := strings.Split(m[1], ",")
	tlsConf, err := pki.EtcdClientTLS(filepath.Join(dir, "certs", pki.Admin("local").DirName()))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, TLS: tlsConf})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	body := map[string]any{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 200, "seed": 11, "ignore_eos": true, "stream": true}
	want, _ := clustertest.StreamCompletion(t, up.url, body, nil)
	healed := make(chan error, 1)
	go func() { healed <- killLeaders(dir, cli, endpoints, 5) }()
	streams := 0
	for done := false; !done; {
		got, _ := clustertest.StreamCompletion(t, up.url, body, nil)
		if !sameTokens(got, want) {
			t.Fatalf("stream %d during the kills: %d tokens, differs from the reference (%d)", streams, len(got), len(want))
		}
		streams++
		select {
		case err := <-healed:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
		}
	}
	out := up.out.String()
	if n := strings.Count(out, "up: etcd member etcd-"); n < 5 || !strings.Contains(out, "had lost its data: replaced it") {
		t.Fatalf("up said %d times that a member exited, and of the replacement %v:\n%s", n, strings.Contains(out, "replaced it"), out)
	}
	t.Logf("5 leaders killed (one with its data gone); %d streams bit-identical throughout", streams)

	// nodectl status shows each member's health: all three healthy, one
	// leader; a member stopped (SIGSTOP) does not answer and is shown so.
	socket := regexp.MustCompile(`nodectl --socket (\S+) status`).FindStringSubmatch(out)
	if socket == nil {
		t.Fatalf("no nodectl command in up's output:\n%s", out)
	}
	status := func(want ...string) string {
		var got string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			b, _ := exec.Command(proctest.Nodectl(t), "--socket", socket[1], "status").CombinedOutput()
			got = string(b)
			all := true
			for _, w := range want {
				all = all && strings.Contains(got, w)
			}
			if all {
				return got
			}
		}
		t.Fatalf("nodectl status never showed %q:\n%s", want, got)
		return ""
	}
	status("etcd members: 3 of 3 healthy (a quorum needs 2)", "healthy, leader")
	follower := ""
	if name, err := leaderName(cli, endpoints); err == nil {
		for _, n := range []string{"etcd-0", "etcd-1", "etcd-2"} {
			if n != name {
				follower = n
			}
		}
	}
	pid := memberPID(dir, follower)
	if pid == 0 {
		t.Fatalf("no follower process (%q)", follower)
	}
	syscall.Kill(pid, syscall.SIGSTOP)
	defer syscall.Kill(pid, syscall.SIGCONT)
	got := status("etcd members: 2 of 3 healthy")
	if !regexp.MustCompile(follower + `\s+\S+\s+unhealthy: `).MatchString(got) {
		t.Fatalf("the stopped member %s is not shown unhealthy:\n%s", follower, got)
	}
}

// killLeaders kills the etcd leader times times, waiting each time for
// the cluster to heal; the third time the leader's data is removed first.
func killLeaders(dir string, cli *clientv3.Client, endpoints []string, times int) error {
	for i := range times {
		name, err := leaderName(cli, endpoints)
		if err != nil {
			return err
		}
		pid := memberPID(dir, name)
		if pid == 0 {
			return fmt.Errorf("kill %d: no process of member %s", i, name)
		}
		if i == 2 {
			// Its files stay open while it runs; the next start finds none.
			if err := os.RemoveAll(filepath.Join(dir, "etcd", name)); err != nil {
				return err
			}
		}
		syscall.Kill(pid, syscall.SIGKILL)
		deadline := time.Now().Add(90 * time.Second)
		for {
			err := healthy(cli, endpoints)
			if err == nil && memberPID(dir, name) != 0 && memberPID(dir, name) != pid {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kill %d (leader %s, pid %d): the cluster did not heal within 90 s: %v", i, name, pid, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// leaderName is the name of the member that leads.
func leaderName(cli *clientv3.Client, endpoints []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return "", err
	}
	for _, ep := range endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil || st.Leader == 0 {
			continue
		}
		for _, mem := range list.Members {
			if mem.ID == st.Leader {
				return mem.Name, nil
			}
		}
	}
	return "", errors.New("no leader")
}

// healthy: three started members, every endpoint answers, one leader.
func healthy(cli *clientv3.Client, endpoints []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return err
	}
	if len(list.Members) != 3 || slices.ContainsFunc(list.Members, func(m *etcdserverpb.Member) bool { return m.Name == "" }) {
		return fmt.Errorf("members %v", list.Members)
	}
	for _, ep := range endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return fmt.Errorf("%s: %w", ep, err)
		}
		if st.Leader == 0 {
			return fmt.Errorf("%s: no leader", ep)
		}
	}
	if _, err := cli.Put(ctx, "/lifeline/v1/test/healed", "ok"); err != nil {
		return err
	}
	return nil
}

// memberPID is the process of etcd member name of the up on dir (0:
// none).
func memberPID(dir, name string) int {
	for _, p := range procfs.Mentioning(dir + "/") {
		if args := p.Args(); len(args) > 3 && args[1] == "etcd" && slices.Contains(args, name) {
			return p.PID
		}
	}
	return 0
}

// TestAnElectionLongerThanTheLeaseLosesNoLease: the agent's lease lasts
// 3 s. Killing etcd's leader while a follower is stopped leaves no quorum
// until the test lets the follower go (then an election of 2–4 s): the
// renewals stop for longer than the TTL, and the agent fences its
// worker (it cannot prove its lease). But the new leader extends every
// lease as it takes over, so the lease is still there: the agent renews
// it and lets its worker accept again at the same generation, instead of
// re-registering it at the next one (what it did before, and what drill 8
// saw as a lost lease when an election took 3.6 s on a loaded machine).
// A request a frontend sends the fenced worker is refused (FENCED), waits,
// and is served there once the lease is kept, identical to a reference
// (a follower stopped meanwhile holds the election off until then).
func TestAnElectionLongerThanTheLeaseLosesNoLease(t *testing.T) {
	t.Parallel()
	env := clustertest.NewEnvWith(t, localcluster.EnvOptions{EtcdMembers: 3, EtcdElection: 2 * time.Second})
	n := clustertest.StartNode(t, env, "n1")
	w := n.WaitWorkerReady(t)
	reg := n.WaitRegistration(t, w.InstanceID, 0)
	var flog proctest.SyncBuffer
	f, err := env.StartFrontend("127.0.0.1:0", &flog)
	if err != nil {
		t.Fatalf("%v: %s", err, flog.String())
	}
	defer f.Stop(10 * time.Second)
	body := map[string]any{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 24, "seed": 5, "ignore_eos": true, "stream": true}
	want, _ := clustertest.StreamCompletion(t, f.URL, body, nil)
	c := n.DialWorker(t, w.InstanceID) // through etcd: before it has no quorum
	// The leader as of now (not before the reference ran: under load a
	// leader may change meanwhile, and killing a follower fences nothing).
	// A follower is stopped first and the leader killed: one member of
	// three runs, so no election ends before the follower is let go —
	// the fence lasts until the frontend's request met it.
	var endpoints []string
	for _, m := range env.Members {
		endpoints = append(endpoints, m.Endpoint)
	}
	name, err := leaderName(env.Client, endpoints)
	if err != nil {
		t.Fatal(err)
	}
	var leader, held *localcluster.EtcdMember
	for _, m := range env.Members {
		switch {
		case m.Name == name:
			leader = m
		case held == nil:
			held = m
		}
	}
	if err := held.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer held.Signal(syscall.SIGCONT)
	killed := time.Now()
	leader.Kill()
	// While the agent cannot prove its lease its worker refuses new work
	// (FENCED); a request the frontend sends it meanwhile waits and is
	// served there once the lease is kept, the only instance of its model
	// (it used to be excluded for good: no_capacity after 15 s).
	proctest.WaitFor(t, 30*time.Second, "the worker to refuse new work (fenced)", func() (bool, string) {
		s, err := c.Generate(context.Background(), &wire.Generate{RequestId: fmt.Sprintf("probe-%d", time.Now().UnixNano()), Prompt: "hi", MaxTokens: 1, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		fs := clustertest.CollectFrames(t, s)
		if len(fs) == 1 && fs[0].Error.GetCode() == wire.Code_FENCED {
			return true, ""
		}
		// What the agent saw, for a run where the fence never came.
		evs, _ := n.Events(context.Background())
		var kinds []string
		for _, e := range evs {
			kinds = append(kinds, e.Kind)
		}
		return false, fmt.Sprintf("killed %s %v ago; the probe got %+v; agent events %v", name, time.Since(killed).Round(time.Millisecond), fs, kinds)
	})
	// The follower goes on once the frontend's request met the fence (or
	// after 15 s, and the check below fails).
	refused := make(chan bool, 1)
	go func() {
		deadline := time.Now().Add(15 * time.Second)
		for !strings.Contains(flog.String(), "worker refused (fenced)") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		held.Signal(syscall.SIGCONT)
		refused <- strings.Contains(flog.String(), "worker refused (fenced)")
	}()
	got, _ := clustertest.StreamCompletion(t, f.URL, body, nil)
	if !<-refused {
		t.Fatalf("the frontend's request was never refused as fenced:\n%s", flog.String())
	}
	if !sameTokens(got, want) {
		t.Fatalf("the request sent to the fenced worker: %d tokens, differs from the reference (%d)", len(got), len(want))
	}
	proctest.WaitFor(t, 60*time.Second, "the agent to keep its lease", func() (bool, string) {
		evs, err := n.Events(context.Background())
		if err != nil {
			return false, err.Error()
		}
		kinds := []string{}
		for _, e := range evs {
			kinds = append(kinds, e.Kind)
		}
		return slices.Contains(kinds, controlapi.EventLeaseKept), fmt.Sprint(kinds)
	})
	t.Logf("lease kept %v after the leader's SIGKILL", time.Since(killed).Round(time.Millisecond))
	evs, _ := n.Events(context.Background())
	for _, e := range evs {
		if e.Kind == controlapi.EventReregistered {
			t.Fatalf("the worker was re-registered (generation %d): %+v", e.Generation, evs)
		}
	}
	lost := false
	for _, e := range evs {
		lost = lost || e.Kind == controlapi.EventLeaseLost
	}
	if !lost {
		t.Fatalf("the renewals never stopped for longer than the TTL (no lease_lost): the election was too quick to test anything: %+v", evs)
	}
	// Ready, routable and accepting at the generation it had.
	now := n.WaitWorkerReady(t)
	if now.Generation != reg.Generation || now.PID != w.PID {
		t.Fatalf("worker now %d at generation %d, was %d at %d", now.PID, now.Generation, w.PID, reg.Generation)
	}
	s, err := c.Generate(context.Background(), &wire.Generate{RequestId: "after", RequestEpoch: 1, Prompt: "hello", MaxTokens: 4, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	if fs := clustertest.CollectFrames(t, s); len(fs) != 5 || fs[4].Generation != reg.Generation {
		t.Fatalf("the worker after the election: %d frames %+v", len(fs), fs)
	}
	if st := n.NodectlStatus(t); !st.Etcd.Routable {
		t.Fatalf("not routable: %+v", st.Etcd)
	}
}
