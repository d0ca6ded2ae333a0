package worker

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// TestWatchAgent: a socket that answers keeps the worker; one gone for
// the timeout ends it with ErrOrphaned naming the socket; a context that
// ends first is not an orphan.
// Not in parallel: its 300 ms timeout is checked to the tick.
func TestWatchAgent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if err := WatchAgent(ctx, path, 300*time.Millisecond); err != nil {
		t.Fatalf("an agent that answers: %v", err)
	}
	ln.Close()
	start := time.Now()
	err = WatchAgent(context.Background(), path, 300*time.Millisecond)
	if !errors.Is(err, ErrOrphaned) || !strings.Contains(err.Error(), path) {
		t.Fatalf("no agent: %v", err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("orphaned after %v, before the timeout", took)
	}
}

// TestWorkerStopsWhenItsReadyLineIsUnread: a worker whose agent died
// before reading its Ready line (the pipe's read end is gone) stops with
// ErrReadyUnread instead of serving on: nobody has it on record, so no
// restarted agent can adopt it, and its agent socket answering again (the
// restarted agent's) would keep it from ever counting as an orphan.
func TestWorkerStopsWhenItsReadyLineIsUnread(t *testing.T) {
	t.Parallel()
	certs, err := pki.InitIdentity(t.TempDir(), pki.Worker("test", "w"))
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer w.Close()
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), Options{InstanceID: "w", Generation: 1, Role: "decode", Listen: "127.0.0.1:0", CertDir: certs,
			Engine: decode.Options{Preset: "tiny", WeightSeed: 1}}, w)
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrReadyUnread) || !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("Run with nobody reading its Ready line: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the worker served on with nobody reading its Ready line")
	}
}
