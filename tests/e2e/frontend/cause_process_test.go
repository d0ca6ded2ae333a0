package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestFrontendStopIsNotAClientCancel: a frontend stopped (SIGTERM) while
// it streams ends the stream with a typed, retryable frontend_stopping
// error, written before the connection closes; the client cancelled
// nothing, and is not told it did.
func TestFrontendStopIsNotAClientCancel(t *testing.T) {
	t.Parallel() // waits on timers and processes: overlapped with the other waiting tests
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	log := &proctest.SyncBuffer{}
	f, err := n.Env.StartFrontend("127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Stop(10 * time.Second) })
	b, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "A very long story", "max_tokens": 1500, "stream": true, "ignore_eos": true})
	resp, err := http.Post(f.URL+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := sse.NewReader(resp.Body)
	var typ string
	tokens := 0
	for {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		if ev.Chunk != nil && ev.Chunk.Lifeline.SequenceNo > 0 {
			if tokens++; tokens == 20 {
				go f.Stop(10 * time.Second)
			}
		}
		if ev.Error != nil {
			typ = ev.Error.Type
		}
	}
	if typ != "frontend_stopping" || tokens >= 1500 {
		t.Fatalf("after %d tokens the stream ended with error %q; frontend log:\n%s", tokens, typ, log.String())
	}
}

// TestFrontendWorkerStopCompletes: a worker stopped (SIGTERM) mid-stream
// ends its streams and exits; its last frame may be lost as it closes its
// connection. The stream completes bit-identical with its true finish
// reason: not an error, and never a cancel (a worker that cancels its own
// sequences is a failure to migrate from; TestWorkerCancelMigrates).
func TestFrontendWorkerStopCompletes(t *testing.T) {
	t.Parallel() // waits on timers and processes: overlapped with the other waiting tests
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	url := startFrontend(t, n.Env)
	body := map[string]any{"model": "tiny", "prompt": "The clockmaker's apprentice", "max_tokens": 800,
		"temperature": 0.9, "seed": 31, "stream": true, "ignore_eos": true}
	want, _ := clustertest.StreamCompletion(t, url, body, nil)
	var stopped string
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var toks []clustertest.Token
	var errType, finish string
	for rd := sse.NewReader(resp.Body); ; {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		if ev.Error != nil {
			errType = ev.Error.Type
		}
		if ev.Chunk != nil && ev.Chunk.Finish() != "" {
			finish = ev.Chunk.Finish()
		}
		if ev.Chunk == nil || ev.Chunk.Lifeline.SequenceNo == 0 {
			continue
		}
		l := ev.Chunk.Lifeline
		toks = append(toks, clustertest.Token{Seq: l.SequenceNo, TokenID: l.TokenID, Text: ev.Chunk.Content(), Instance: l.InstanceID})
		if l.SequenceNo == 30 {
			stopped = l.InstanceID
			ws, _ := n.Workers(context.Background())
			for _, w := range ws {
				if w.InstanceID == stopped {
					syscall.Kill(w.PID, syscall.SIGTERM)
				}
			}
		}
	}
	if errType != "" || finish != "length" {
		t.Fatalf("the stream ended with error %q, finish %q after %d tokens (worker %s stopped at 30)", errType, finish, len(toks), stopped)
	}
	sameTokens(t, "the stream", toks, want)
}
