package worker

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWatchAgent: a socket that answers keeps the worker; one gone for
// the timeout ends it with ErrOrphaned naming the socket; a context that
// ends first is not an orphan.
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
