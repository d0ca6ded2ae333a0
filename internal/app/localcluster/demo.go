package localcluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/frontend/client"
)

// DemoOptions are the flags of `lifeline demo failover`.
type DemoOptions struct {
	Preset    string
	KillAfter int // the sequence number after which the worker dies
	MaxTokens int
	Seed      uint64
}

type demoToken struct {
	seq      int
	token    int
	text     string
	instance string
	at       time.Time
}

// Failover is the article's opening scene: a seeded stream, its decode
// worker SIGKILLed right after sequence KillAfter reaches the client, the
// stream continuing on another worker, and a check against a run that
// never failed.
func Failover(ctx context.Context, opts DemoOptions, out io.Writer) error {
	if opts.KillAfter < 1 || opts.MaxTokens <= opts.KillAfter {
		return fmt.Errorf("demo: kill-after %d must be within max-tokens %d", opts.KillAfter, opts.MaxTokens)
	}
	dir, err := os.MkdirTemp("", "lifeline-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	url, stop, err := demoCluster(ctx, dir, opts.Preset)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(out, "cluster up: 2 nodes × 1 %s decode worker, frontend %s\n", opts.Preset, url)
	temp := 0.9
	req := client.Request{Model: opts.Preset, Prompt: "Once upon a time, in a small town by the river,", MaxTokens: opts.MaxTokens,
		Temperature: &temp, Seed: opts.Seed, IgnoreEOS: true}
	var reference []demoToken
	for deadline := time.Now().Add(60 * time.Second); ; {
		reference, _, err = demoStream(ctx, url, req, nil)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("demo: fault-free run: %w", err)
	}
	fmt.Fprintf(out, "fault-free run: %d tokens\n\n", len(reference))

	var killedAt time.Time
	var victim string
	start := time.Now()
	got, res, err := demoStream(ctx, url, req, func(t demoToken) {
		if t.seq == opts.KillAfter && victim == "" {
			victim = t.instance
			pid, err := workerPID(ctx, dir, victim)
			if err != nil {
				fmt.Fprintf(out, "cannot find the worker of %s: %v\n", victim, err)
				return
			}
			killedAt = time.Now()
			syscall.Kill(pid, syscall.SIGKILL)
			fmt.Fprintf(out, "%8.1f ms  sequence %d reached the client from %s\n", ms(t.at.Sub(start)), t.seq, victim)
			fmt.Fprintf(out, "%8.1f ms  SIGKILL %s (pid %d)\n", ms(killedAt.Sub(start)), victim, pid)
		}
	})
	if err != nil {
		return fmt.Errorf("demo: run with failure: %w", err)
	}
	reportMigration(out, opts, start, killedAt, got, res)
	identical := len(got) == len(reference)
	for i := 0; identical && i < len(got); i++ {
		identical = got[i].seq == i+1 && got[i].token == reference[i].token && got[i].text == reference[i].text
	}
	if identical {
		fmt.Fprintln(out, "bit-identical: yes")
		return nil
	}
	fmt.Fprintln(out, "bit-identical: no")
	return fmt.Errorf("demo: the stream differs from the fault-free run")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// demoStream runs one stream through the frontend client and stamps each
// token with the time it arrived.
func demoStream(ctx context.Context, url string, req client.Request, each func(demoToken)) ([]demoToken, client.Result, error) {
	var toks []demoToken
	res, err := client.New(url).Stream(ctx, req, func(t client.Token) {
		dt := demoToken{t.SequenceNo, t.TokenID, t.Text, t.Instance, time.Now()}
		toks = append(toks, dt)
		if each != nil {
			each(dt)
		}
	})
	return toks, res, err
}

// workerPID asks each node's agent which pid serves instance.
func workerPID(ctx context.Context, dir, instance string) (int, error) {
	socks, _ := filepath.Glob(filepath.Join(dir, "node-*", "agent.sock"))
	for _, s := range socks {
		ws, err := nodectl.Workers(ctx, s)
		if err != nil {
			continue
		}
		for _, w := range ws {
			if w.InstanceID == instance && w.PID > 0 {
				return w.PID, nil
			}
		}
	}
	return 0, fmt.Errorf("no agent knows %s", instance)
}

// lineWriter turns writes into lines on a channel.
type lineWriter struct {
	buf   []byte
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case w.lines <- string(w.buf[:i]):
		default:
		}
		w.buf = w.buf[i+1:]
	}
}

// demoCluster runs `lifeline up` with two nodes in dir and returns the
// frontend's URL once it serves, and how to stop it.
func demoCluster(ctx context.Context, dir, preset string) (url string, stop func(), err error) {
	listen, err := FreeLoopbackAddr()
	if err != nil {
		return "", nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	upOut := &lineWriter{lines: make(chan string, 64)}
	done := make(chan error, 1)
	go func() { done <- Run(cctx, Options{DataDir: dir, Nodes: 2, Preset: preset, Listen: listen}, upOut) }()
	stop = func() { cancel(); <-done }
	for {
		select {
		case l := <-upOut.lines:
			if u, ok := strings.CutPrefix(l, "URL "); ok {
				return u, stop, nil
			}
		case err := <-done:
			cancel()
			return "", nil, fmt.Errorf("demo: lifeline up: %v", err)
		case <-time.After(120 * time.Second):
			stop()
			return "", nil, fmt.Errorf("demo: lifeline up did not start")
		}
	}
}

// reportMigration prints the failover's timeline.
func reportMigration(out io.Writer, opts DemoOptions, start, killedAt time.Time, got []demoToken, res client.Result) {
	if tl := res.LastMigration; tl != nil {
		at := func(k string) time.Time { return time.Unix(0, tl[k]) }
		fmt.Fprintf(out, "%8.1f ms  frontend sees the failure (agent's eBPF detection → deregistration → etcd watch); epoch bumped\n", ms(at("failure_seen_unix_ns").Sub(start)))
		fmt.Fprintf(out, "%8.1f ms  routed; stream opened on the other worker with prompt + %d tokens to continue from\n", ms(at("dispatched_unix_ns").Sub(start)), opts.KillAfter)
	}
	for _, t := range got {
		if t.seq == opts.KillAfter+1 {
			fmt.Fprintf(out, "%8.1f ms  sequence %d from %s — %.1f ms after the kill\n",
				ms(t.at.Sub(start)), t.seq, t.instance, ms(t.at.Sub(killedAt)))
		}
	}
	fmt.Fprintf(out, "%8.1f ms  sequence %d, stream complete; migrations: %d\n\n", ms(got[len(got)-1].at.Sub(start)), got[len(got)-1].seq, res.Migrations)
}
