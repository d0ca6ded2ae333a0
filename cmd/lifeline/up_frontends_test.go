package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestUpSeveralFrontends: `lifeline up --frontends 2` prints both URLs
// and both serve; a stream started on frontend 0, which is then
// SIGKILLed, is resumed on frontend 1 to its end; up restarts frontend 0
// where it was, and frontend 1 serves throughout.
func TestUpSeveralFrontends(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	up := startUp(t, dir, "--nodes", "1", "--frontends", "2", "--listen", "127.0.0.1:0")
	var urls []string
	for _, l := range strings.Split(up.out.String(), "\n") {
		if a, ok := strings.CutPrefix(l, "URL "); ok {
			urls = append(urls, a)
		}
	}
	if len(urls) != 2 || urls[0] == urls[1] {
		t.Fatalf("URLs printed: %v\n%s", urls, up.out.String())
	}
	body := map[string]any{"model": "tiny", "prompt": "two doors", "max_tokens": 40, "seed": 5, "stream": true, "ignore_eos": true,
		"stream_options": map[string]any{"resumable": true}}
	want, _ := clustertest.StreamCompletion(t, urls[1], body, nil)
	if len(want) != 40 {
		t.Fatalf("frontend 1 streamed %d tokens", len(want))
	}
	b, _ := json.Marshal(body)
	resp, err := http.Post(urls[0]+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("frontend 0: %v %v", resp, err)
	}
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	first := clustertest.ReadSSE(t, resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 8 })
	var pids []int
	for _, p := range procfs.Mentioning(dir + "/") {
		if a := strings.Join(p.Args(), " "); strings.Contains(a, " frontend ") && strings.HasSuffix(a, " --id frontend-0") {
			pids = append(pids, p.PID)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("frontend 0 processes: %v", pids)
	}
	syscall.Kill(pids[0], syscall.SIGKILL)
	resp.Body.Close()
	req, _ := http.NewRequest("GET", urls[1]+"/v1/streams/"+id, nil)
	req.Header.Set("Last-Event-ID", strconv.Itoa(len(first)))
	req.Header.Set("Authorization", "Bearer "+token)
	var rresp *http.Response
	rresp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer rresp.Body.Close()
	if rresp.StatusCode != 200 {
		msg, _ := io.ReadAll(rresp.Body)
		t.Fatalf("resume on frontend 1: %d %s", rresp.StatusCode, msg)
	}
	got := append(first, clustertest.ReadSSE(t, rresp.Body, nil)...)
	if !sameTokens(got, want) {
		t.Fatalf("resumed on frontend 1: %d tokens, differs from the fault-free run", len(got))
	}
	proctest.WaitFor(t, 30*time.Second, "up to restart frontend 0", func() (bool, string) {
		resp, err := http.Get(urls[0] + "/v1/models")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	if out := up.out.String(); !strings.Contains(out, "up: frontend 0 exited (signal: killed); restarting it") {
		t.Fatalf("up did not say why it restarted frontend 0:\n%s", out)
	}
	again, _ := clustertest.StreamCompletion(t, urls[1], body, nil)
	if !sameTokens(again, want) {
		t.Fatal("frontend 1 after the restart of frontend 0: the stream differs")
	}
}
