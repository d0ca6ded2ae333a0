package localcluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/internal/netns"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/private"
)

// up is a running `lifeline up`: it supervises its children (each agent,
// the frontend), restarting one that exits with backoff and saying why,
// while the rest keeps running. Only its context ending stops everything.
type up struct {
	env  *Env
	opts Options
	out  io.Writer
	log  *os.File

	nodes []*Node
	// net, with --netns, holds every node's network namespace.
	net *netns.Net
	wg  sync.WaitGroup
	// arenaSlots is every node's arena.
	arenaSlots int

	// mu orders restarts against stop: once stopping is closed (under
	// mu) nothing is started again.
	mu       sync.Mutex
	stopping chan struct{}
	// frontends[i] is frontend i; listens[i] its address, fixed at its
	// first start so that a restarted frontend serves where clients were
	// told to connect.
	frontends []*Frontend
	listens   []string
}

// Run starts everything, prints how to use it to out once a completion can
// be served, and stops everything when ctx ends.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	dir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return err
	}
	// 0700 even when it existed: the CA key, etcd and every node's data
	// live under it. One another user owns or can write into is refused:
	// they could have planted a CA, or a link for up.lock to truncate.
	if err := private.Dir(dir); err != nil {
		return fmt.Errorf("up: --data-dir: %w", err)
	}
	unlock, err := lockDataDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	reapLeftovers(dir, out)
	log, err := private.OpenFile(filepath.Join(dir, "lifeline.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	var nt *netns.Net
	var etcdHosts []string
	if opts.NetNS {
		for _, g := range netns.Reap() {
			fmt.Fprintf(out, "up: removed %s a killed run left\n", g)
		}
		if nt, err = netns.Create(opts.Nodes); err != nil {
			return fmt.Errorf("up: --netns: %w", err)
		}
		defer nt.Close()
		etcdHosts = []string{nt.HostIP.String()}
	}
	env, err := NewEnvWith(dir, opts.Binary, "", EnvOptions{EtcdMembers: opts.EtcdMembers, EtcdLog: log, EtcdHosts: etcdHosts})
	if err != nil {
		return err
	}
	defer env.Close()
	listens, err := frontendListens(opts.Listen, max(opts.Frontends, 1))
	if err != nil {
		return err
	}
	u := &up{env: env, net: nt, opts: opts, out: out, log: log, listens: listens, frontends: make([]*Frontend, len(listens)), stopping: make(chan struct{})}
	defer u.stop()
	for _, m := range env.Members {
		u.superviseMember(m)
	}
	if err := u.startNodes(); err != nil {
		return err
	}
	for i := range u.listens {
		if err := u.startFrontend(ctx, i); err != nil || ctx.Err() != nil {
			return err
		}
	}
	if err := u.waitServable(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	u.printUsage(out, opts)
	<-ctx.Done()
	fmt.Fprintln(out, "stopping…")
	return nil
}

// startNodes starts one agent per node, each with a decode instance;
// prefill instance k goes to node Nodes-1-(k mod Nodes).
func (u *up) startNodes() error {
	opts := u.opts
	var why string
	if u.arenaSlots, why = ArenaSize(opts.Nodes); opts.ArenaMB > 0 {
		u.arenaSlots, why = opts.ArenaMB<<20/ArenaSlotBytes, "--arena-mb"
	}
	fmt.Fprintf(u.out, "arena per node: %d slots × %d KiB = %d MiB (%s): %d prompts of 2,048 tokens at once\n",
		u.arenaSlots, ArenaSlotBytes>>10, u.arenaSlots*ArenaSlotBytes>>20, why, PromptsHeld(u.arenaSlots, 2048))
	arenaTag := rand.Text()[:8]
	for i := 0; i < opts.Nodes; i++ {
		dir := filepath.Join(u.env.Dir, fmt.Sprintf("node-%d", i))
		o := u.env.NodeOptions(fmt.Sprintf("node-%d", i), dir)
		o.DataDir = dir
		// A random part: another user who could guess the name would
		// pre-create it and the agent would refuse an arena not its own.
		o.ArenaPath = filepath.Join("/dev/shm", fmt.Sprintf("lifeline-up-%d-%s-node-%d", os.Getpid(), arenaTag, i))
		o.ArenaSlots, o.ArenaSlotBytes = u.arenaSlots, ArenaSlotBytes
		o.WorkerBinary = ""
		// Each agent serves its metrics on a loopback port of its own,
		// printed with the usage.
		var err error
		if o.Metrics, err = FreeLoopbackAddr(); err != nil {
			return fmt.Errorf("up: metrics port: %w", err)
		}
		o.Instances = []agent.InstanceSpec{opts.instance()}
		if np := opts.Prefill/opts.Nodes + b2i((opts.Nodes-1-i) < opts.Prefill%opts.Nodes); np > 0 {
			o.Instances = append(o.Instances, agent.InstanceSpec{Role: "prefill", Preset: opts.Preset, Count: np})
		}
		n := u.env.NewNode(o)
		n.Stdout, n.Stderr = u.log, u.log
		if u.net != nil {
			if err := u.env.InNamespace(n, u.net.Nodes[i]); err != nil {
				return fmt.Errorf("up: %w", err)
			}
		}
		if err := n.Start(); err != nil {
			return fmt.Errorf("up: %w", err)
		}
		u.nodes = append(u.nodes, n)
		u.supervise(fmt.Sprintf("agent %d", i), n.Exited, n.ExitState, func() error { return u.restartAgent(i, n) })
	}
	return nil
}

// frontendListens are the addresses of n frontends: listen's port + i
// (port 0: each a free one).
func frontendListens(listen string, n int) ([]string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("up: listen: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+n-1 > 65535 {
		return nil, fmt.Errorf("up: listen: port %q for %d frontends", port, n)
	}
	out := make([]string, n)
	for i := range out {
		q := p + i
		if p == 0 {
			q = 0
		}
		out[i] = net.JoinHostPort(host, strconv.Itoa(q))
	}
	return out, nil
}

// startFrontend starts frontend i and waits until it listens.
func (u *up) startFrontend(ctx context.Context, i int) error {
	u.mu.Lock()
	err := u.launchFrontend(i)
	f := u.frontends[i]
	u.mu.Unlock()
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	select {
	case <-f.Ready():
	case <-f.Exited():
		return fmt.Errorf("up: the frontend exited while starting (%s); see %s", f.ExitState(), u.log.Name())
	case <-time.After(time.Minute):
		return fmt.Errorf("up: the frontend did not start within a minute; see %s", u.log.Name())
	case <-ctx.Done():
		return nil
	}
	u.mu.Lock()
	u.listens[i] = strings.TrimPrefix(strings.TrimPrefix(f.URL, "http://"), "https://")
	u.mu.Unlock()
	name := "frontend"
	if len(u.listens) > 1 {
		name = fmt.Sprintf("frontend %d", i)
	}
	u.supervise(name, func() <-chan struct{} {
		u.mu.Lock()
		defer u.mu.Unlock()
		return u.frontends[i].Exited()
	}, func() string {
		u.mu.Lock()
		defer u.mu.Unlock()
		return u.frontends[i].ExitState()
	}, func() error { return u.launchFrontend(i) })
	return nil
}

// launchFrontend starts frontend i (id frontend-i) on its address. The
// caller holds u.mu (supervise does, around every restart).
func (u *up) launchFrontend(i int) error {
	args := []string{"--id", fmt.Sprintf("frontend-%d", i)}
	if u.opts.TLS {
		args = append(args, "--tls")
	}
	f, err := u.env.LaunchFrontend(u.listens[i], u.log, args...)
	if err != nil {
		return err
	}
	u.frontends[i] = f
	return nil
}

// supervise restarts a child when it exits (start runs with u.mu held), with exponential backoff
// (100 ms doubling to 10 s, back to 100 ms after a minute of running),
// saying why on the terminal and in the log, until up stops.
func (u *up) supervise(name string, exited func() <-chan struct{}, state func() string, start func() error) {
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		backoff := 100 * time.Millisecond
		for {
			since := time.Now()
			select {
			case <-exited():
			case <-u.stopping:
				return
			}
			if time.Since(since) > time.Minute {
				backoff = 100 * time.Millisecond
			}
			for {
				select {
				case <-u.stopping:
					return
				default:
				}
				u.say("up: %s exited (%s); restarting it in %v", name, state(), backoff)
				select {
				case <-time.After(backoff):
				case <-u.stopping:
					return
				}
				backoff = min(2*backoff, 10*time.Second)
				u.mu.Lock()
				err := errStopping
				select {
				case <-u.stopping:
				default:
					err = start()
				}
				u.mu.Unlock()
				if err == nil {
					break
				} else if err == errStopping {
					return
				}
				u.say("up: restarting %s: %v", name, err)
			}
		}
	}()
}

var errStopping = errors.New("up: stopping")

// restartAgent starts agent i again (under u.mu). Its metrics port was
// free when up picked it, not reserved: another process may have bound
// it since (an agent that exited and found it taken would otherwise exit
// at every restart). Such a port is replaced by a free one, and said.
func (u *up) restartAgent(i int, n *Node) error {
	moved, err := n.FreeMetricsPort()
	if err != nil {
		return err
	}
	if moved != "" {
		u.say("up: agent %d: %s", i, moved)
	}
	return n.Start()
}

// superviseMember restarts etcd member m whenever it exits: on its data,
// or, when its data is gone, as a new member in its place (member remove,
// member add). Without it, a killed leader and then the next one lose the
// quorum for good.
func (u *up) superviseMember(m *EtcdMember) {
	u.supervise("etcd member "+m.Name, m.Exited, m.ExitState, func() error {
		replaced, err := m.Relaunch(context.Background(), u.env.Client)
		if replaced {
			u.say("up: etcd member %s had lost its data: replaced it (member remove, member add); it joins anew", m.Name)
		}
		return err
	})
}

// say writes a line to the terminal and to the log.
func (u *up) say(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	fmt.Fprintln(u.out, line)
	fmt.Fprintf(u.log, "%s %s\n", time.Now().Format(time.RFC3339Nano), line)
}

// waitServable waits until a completion is served end to end: a one-token
// request through the frontend to a worker. Until then nothing is
// announced, so that the first request a user sends is served.
func (u *up) waitServable(ctx context.Context) error {
	u.mu.Lock()
	url, certs := u.frontends[0].URL, u.frontends[0].Certs
	u.mu.Unlock()
	client, err := apiClient(certs)
	if err != nil {
		return err
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":"ready","max_tokens":1,"temperature":0}`, u.opts.ModelID())
	deadline := time.Now().Add(2 * time.Minute)
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && u.nodesReady(ctx) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("up: nothing could be served within 2 minutes; see %s", u.log.Name())
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// apiClient is an HTTP client of the frontends: trusting the cluster's
// CA in certs, for HTTPS ones.
func apiClient(certs string) (*http.Client, error) {
	pem, err := os.ReadFile(filepath.Join(certs, pki.CAFile))
	if err != nil {
		return nil, fmt.Errorf("up: the cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

// nodesReady reports whether every node's agent answers and calls all
// its instances ready (a big arena takes its agent a while to allocate).
func (u *up) nodesReady(ctx context.Context) bool {
	for _, n := range u.nodes {
		ws, err := nodectl.Workers(ctx, n.Options.Socket)
		if err != nil || len(ws) == 0 {
			return false
		}
		for _, w := range ws {
			if !w.Ready {
				return false
			}
		}
	}
	return true
}

// stop stops supervising, then the agents (SIGTERM: each stops its
// workers), then the frontend, which stays up until the agents are done so
// that what the workers still send reaches the clients.
func (u *up) stop() {
	u.mu.Lock()
	close(u.stopping)
	fs := append([]*Frontend(nil), u.frontends...)
	u.mu.Unlock()
	for i := len(u.nodes) - 1; i >= 0; i-- {
		u.nodes[i].Signal(syscall.SIGTERM)
	}
	for _, n := range u.nodes {
		n.Wait(90 * time.Second)
		n.RemoveArena()
	}
	var wg sync.WaitGroup
	for _, f := range fs {
		if f != nil {
			wg.Go(func() { f.Stop(20 * time.Second) })
		}
	}
	wg.Wait()
	u.wg.Wait()
}

func (u *up) printUsage(out io.Writer, opts Options) {
	u.mu.Lock()
	var urls, metrics, debugs []string
	for _, f := range u.frontends {
		urls, metrics, debugs = append(urls, f.URL), append(metrics, f.MetricsURL), append(debugs, f.Debug)
	}
	u.mu.Unlock()
	url := urls[0]
	fmt.Fprintf(out, "Lifeline is up: %d node(s), %d prefill instance(s), %d frontend(s), model %s, etcd %s (mutual TLS), logs in %s\n",
		opts.Nodes, opts.Prefill, len(urls), opts.ModelID(), strings.Join(u.env.Endpoints, ","), u.log.Name())
	if opts.Model != "" {
		fmt.Fprintf(out, "  %s: engine %s\n", opts.Model, opts.Engine)
	}
	if opts.EngineNote != "" {
		fmt.Fprintf(out, "  (%s)\n", opts.EngineNote)
	}
	fmt.Fprintln(out)
	cacert := ""
	if opts.TLS {
		u.mu.Lock()
		certs := u.frontends[0].Certs
		u.mu.Unlock()
		cacert = "--cacert " + filepath.Join(certs, pki.CAFile) + " "
		fmt.Fprintf(out, "  HTTPS and HTTP/3 on each frontend's port; the cluster's CA: %s\n", filepath.Join(certs, pki.CAFile))
	}
	fmt.Fprintf(out, "  curl -N %s%s/v1/completions -H 'Content-Type: application/json' \\\n", cacert, url)
	fmt.Fprintf(out, "    -d '{\"model\":\"%s\",\"prompt\":\"Once upon a time\",\"max_tokens\":64,\"seed\":7,\"stream\":true}'\n", opts.ModelID())
	if opts.TLS {
		u.mu.Lock()
		certs := u.frontends[0].Certs
		u.mu.Unlock()
		fmt.Fprintf(out, "  %s generate --h3 --cert-dir %s --model %s", u.env.Binary, certs, opts.ModelID())
		for _, l := range urls {
			fmt.Fprintf(out, " --url %s", l)
		}
		fmt.Fprintf(out, " 'Once upon a time'\n")
	} else {
		fmt.Fprintf(out, "  (HTTPS and HTTP/3: lifeline up --tls)\n")
	}
	fmt.Fprintln(out)
	// nodectl is built beside lifeline (make build: bin/); not on PATH.
	nodectl := filepath.Join(filepath.Dir(u.env.Binary), "nodectl")
	for _, n := range u.nodes {
		u.mu.Lock()
		metrics := n.Options.Metrics // a restart may move it
		u.mu.Unlock()
		fmt.Fprintf(out, "  %s --socket %s status    (agent metrics http://%s/metrics)\n", nodectl, n.Options.Socket, metrics)
	}
	if len(u.env.Members) > 0 {
		fmt.Fprintf(out, "  etcd: %d member processes, restarted (or replaced) whenever one exits; their health: nodectl status\n", len(u.env.Members))
	}
	if u.net != nil {
		fmt.Fprintf(out, "\n  Each node in a network namespace of its own, on bridge %s (%s):\n", u.net.Bridge, u.net.HostIP)
		for i, ns := range u.net.Nodes {
			fmt.Fprintf(out, "  node-%d: namespace %s, %s; cut it off: ip link set %s down\n", i, ns.Name, ns.IP, ns.Link)
		}
	}
	if len(urls) > 1 {
		fmt.Fprintf(out, "\n  Any frontend resumes any stream (GET /v1/streams/{id} with its resume token and Last-Event-ID).\n")
	}
	fmt.Fprintln(out)
	for i, l := range urls {
		fmt.Fprintf(out, "URL %s\n", l)
		fmt.Fprintf(out, "  metrics %s/metrics\n", metrics[i])
		if path, ok := strings.CutPrefix(debugs[i], "unix:"); ok {
			fmt.Fprintf(out, "  debug   curl --unix-socket %s http://debug/debug/traces   (pprof: /debug/pprof/...)\n", path)
		}
	}
	fmt.Fprintf(out, "Ctrl-C stops everything.\n")
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
