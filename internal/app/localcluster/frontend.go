package localcluster

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/internal/pki"
)

// Frontend is a frontend process of the Env's binary.
type Frontend struct {
	// URL is where it serves HTTP, once Ready is closed; MetricsURL its
	// metrics listener's (http://host:port, /metrics), set before; Debug
	// its debug socket's base ("unix:PATH", debugsock), set before.
	URL        string
	MetricsURL string
	Debug      string
	// Certs is its certificate directory: the cluster's CA is
	// pki.CAFile in it (what a client of an HTTPS frontend trusts).
	Certs  string
	cmd    *exec.Cmd
	ready  chan struct{}
	exited chan struct{}
}

// LaunchFrontend starts a frontend on this Env's etcd listening on listen
// with extra flags and a certificate of its own (named by its --id, or
// fe-<n>: its id then defaults to that name), copies its log to logTo (when not nil), and returns at
// once: Ready is closed when it serves (URL is set then).
func (e *Env) LaunchFrontend(listen string, logTo io.Writer, extra ...string) (*Frontend, error) {
	name := e.frontendName(extra)
	certs, err := e.Identity(pki.Frontend(name))
	if err != nil {
		return nil, fmt.Errorf("localcluster: frontend certificate: %w", err)
	}
	args := []string{"frontend", "--listen", listen, "--etcd", strings.Join(e.Endpoints, ","), "--etcd-tls", "--certs", certs}
	if !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--debug-socket") }) {
		// The debug pages on a socket of its own in the Env's directory
		// (private: 0700, the socket 0600).
		dir := filepath.Join(e.Dir, "debug")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		args = append(args, "--debug-socket", filepath.Join(dir, name+".sock"))
	}
	args = append(args, extra...)
	cmd := exec.Command(e.Binary, args...)
	// It stops (SIGTERM) when this process dies, even by SIGKILL: a
	// killed up or test leaves nothing running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = logTo
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: start frontend: %w", err)
	}
	f := &Frontend{cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{}), Certs: certs}
	scheme := "http://"
	if slices.Contains(extra, "--tls") {
		scheme = "https://"
	}
	go func() {
		scanLines(stderr, func(line string) {
			if a, ok := strings.CutPrefix(line, "frontend: metrics on "); ok && f.MetricsURL == "" {
				f.MetricsURL = "http://" + a
			}
			if a, ok := strings.CutPrefix(line, "frontend: debug on "); ok && f.Debug == "" {
				f.Debug = a
			}
			if a, ok := strings.CutPrefix(line, "frontend: listening on "); ok && f.URL == "" {
				if f.MetricsURL != "" {
					metricsURLs.Store(a, f.MetricsURL)
				}
				if f.Debug != "" {
					debugBases.Store(a, f.Debug)
				}
			}
			if a, ok := strings.CutPrefix(line, "frontend: listening on "); ok && f.URL == "" {
				f.URL = scheme + a
				close(f.ready)
			}
			if logTo != nil {
				fmt.Fprintln(logTo, line)
			}
		}, logTo)
		cmd.Wait()
		close(f.exited)
	}()
	return f, nil
}

// StartFrontend is LaunchFrontend that returns once the frontend serves,
// or fails if it exits or takes over a minute.
func (e *Env) StartFrontend(listen string, logTo io.Writer, extra ...string) (*Frontend, error) {
	f, err := e.LaunchFrontend(listen, logTo, extra...)
	if err != nil {
		return nil, err
	}
	select {
	case <-f.ready:
		return f, nil
	case <-f.exited:
		return nil, fmt.Errorf("localcluster: the frontend exited before listening")
	case <-time.After(time.Minute):
		f.Stop(time.Second)
		return nil, fmt.Errorf("localcluster: the frontend did not listen within a minute")
	}
}

// Ready is closed once the frontend serves.
func (f *Frontend) Ready() <-chan struct{} { return f.ready }

// Exited is closed when the frontend has exited.
func (f *Frontend) Exited() <-chan struct{} { return f.exited }

// Stop sends SIGTERM and waits up to timeout before killing it.
func (f *Frontend) Stop(timeout time.Duration) {
	f.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.exited:
	case <-time.After(timeout):
		f.cmd.Process.Kill()
		<-f.exited
	}
}

// Signal sends sig to the frontend process (SIGKILL, SIGSTOP in tests).
func (f *Frontend) Signal(sig syscall.Signal) error { return f.cmd.Process.Signal(sig) }

// PID is the frontend's process id.
func (f *Frontend) PID() int { return f.cmd.Process.Pid }

// ExitState says how the frontend process ended ("" while it runs).
func (f *Frontend) ExitState() string {
	select {
	case <-f.exited:
		return f.cmd.ProcessState.String()
	default:
		return ""
	}
}

// metricsURLs maps the host:port of every frontend this process launched
// to its metrics listener's URL.
var metricsURLs sync.Map

// debugBases maps the host:port of every frontend this process launched
// to its debug socket's base.
var debugBases sync.Map

// MetricsURLOf is the metrics listener's URL (http://host:port) of the
// frontend serving at url (http:// or https://), if this process
// launched it.
func MetricsURLOf(url string) (string, bool) { return lookup(&metricsURLs, url) }

// DebugOf is the debug socket's base ("unix:PATH") of the frontend
// serving at url, if this process launched it.
func DebugOf(url string) (string, bool) { return lookup(&debugBases, url) }

func lookup(m *sync.Map, url string) (string, bool) {
	if _, rest, ok := strings.Cut(url, "://"); ok {
		url = rest
	}
	v, ok := m.Load(strings.TrimSuffix(url, "/"))
	if !ok {
		return "", false
	}
	return v.(string), true
}

// frontendName is the name of the certificate a frontend started with
// extra gets: its --id, or a fresh fe-<n>.
func (e *Env) frontendName(extra []string) string {
	for i, a := range extra {
		if v, ok := strings.CutPrefix(a, "--id="); ok {
			return v
		}
		if a == "--id" && i+1 < len(extra) {
			return extra[i+1]
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.frontends++
	return fmt.Sprintf("fe-%d", e.frontends)
}
