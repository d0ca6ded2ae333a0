package e2e

import (
	"bufio"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestStreamKeepAliveWhileSilent: a stream that flows writes no keep-alive
// comment; once its worker stops (SIGSTOP: the request waits, nothing to
// send) the frontend writes ": keep-alive" every --sse-keepalive, so that a
// client can tell a silent stream from a cut connection.
func TestStreamKeepAliveWhileSilent(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	w := n.WaitWorkerReady(t)
	url := clustertest.StartFrontend(t, n, "--sse-keepalive", "400ms")
	body := `{"model":"tiny","prompt":"Once upon a time","max_tokens":400,"seed":3,"ignore_eos":true,"stream":true}`
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	type line struct {
		text string
		at   time.Time
	}
	lines := make(chan line, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() != "" {
				lines <- line{sc.Text(), time.Now()}
			}
		}
	}()
	t.Cleanup(func() { syscall.Kill(w.PID, syscall.SIGCONT) })
	tokens, stopped := 0, time.Time{}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the stream ended after %d tokens with no keep-alive", tokens)
			}
			switch {
			case strings.HasPrefix(l.text, "data: ") && stopped.IsZero():
				tokens++
				if tokens == 20 {
					syscall.Kill(w.PID, syscall.SIGSTOP)
					stopped = time.Now()
				}
			case l.text == ": keep-alive" && stopped.IsZero():
				t.Fatalf("a keep-alive after %d tokens, while the stream flowed", tokens)
			case l.text == ": keep-alive":
				if d := l.at.Sub(stopped); d > 3*time.Second {
					t.Fatalf("the first keep-alive %v after the worker stopped (interval 400ms)", d)
				}
				t.Logf("first keep-alive %v after the worker stopped", l.at.Sub(stopped).Round(time.Millisecond))
				return
			}
		case <-deadline:
			t.Fatalf("no keep-alive within 30 s (%d tokens, stopped %v)", tokens, !stopped.IsZero())
		}
	}
}

// TestClientResumesWhenItsFrontendGoesSilent: the frontend serving a
// stream over TCP freezes (SIGSTOP: no FIN, no RST; the kernel keeps the
// connection open, as for a host whose link was cut). The client hears
// not even a keep-alive for its ReadIdle, takes the connection for cut and
// resumes at the other frontend: bit-identical and contiguous.
func TestClientResumesWhenItsFrontendGoesSilent(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--sse-keepalive", "500ms")
	b := clustertest.StartFrontend(t, n, "--sse-keepalive", "500ms")
	want := collect(t, client.New(b), 0, nil)
	c := client.NewWith(client.Options{ReadIdle: 2 * time.Second}, a.URL, b)
	defer c.Close()
	var frozen time.Time
	got := collect(t, c, 40, func() { a.Signal(syscall.SIGSTOP); frozen = time.Now() })
	sameClientTokens(t, got, want)
	if st := c.Stats(); st.Resumes < 1 || st.Failovers < 1 {
		t.Fatalf("stats %+v: want a resume at the other frontend", st)
	}
	t.Logf("stream complete %v after its frontend froze", time.Since(frozen).Round(time.Millisecond))
}
