package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// limitsNode is one tiny decode worker, its canaries out of the way.
func limitsNode(t *testing.T) *clustertest.Node {
	n := clustertest.NewNode(t, func(o *clustertest.Config) { o.CanaryIdle = agent.Duration(time.Hour) })
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	return n
}

// dialRaw opens a TCP connection to the frontend at url; a cleanup closes
// it.
func dialRaw(t *testing.T, url string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reads c until the server closes it and returns how long
// that took; it fails if c is still open after d.
func closedWithin(t *testing.T, c net.Conn, d time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open after %v", what, d)
	}
	return time.Since(start)
}

// TestFrontendSlowAndIdleClients: with 1 s timeouts, an idle keep-alive
// connection, a body dripped at 5 bytes/s and an idle h2c connection are
// each closed within their timeout (plus scheduling slack), the drip with
// a 408; a stream read slowly for longer than every timeout is not cut.
func TestFrontendSlowAndIdleClients(t *testing.T) {
	t.Parallel()
	n := limitsNode(t)
	url := clustertest.StartFrontend(t, n, "--idle-timeout", "1s", "--body-timeout", "1s", "--read-header-timeout", "2s")
	const slack = 8 * time.Second // 2 shared cores, other tests running

	t.Run("idle keep-alive", func(t *testing.T) {
		c := dialRaw(t, url)
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("healthz: %d, close %v", resp.StatusCode, resp.Close)
		}
		took := closedWithin(t, c, time.Second+slack, "an idle keep-alive connection")
		t.Logf("idle keep-alive connection closed %v after its response (idle timeout 1s)", took)
	})

	t.Run("dripped body", func(t *testing.T) {
		c := dialRaw(t, url)
		io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
		go func() {
			for i := 0; ; i++ {
				if _, err := c.Write([]byte{" {"[min(i, 1)]}); err != nil {
					return
				}
				time.Sleep(200 * time.Millisecond) // the drip: 5 bytes/s
			}
		}()
		start := time.Now()
		c.SetReadDeadline(start.Add(time.Second + slack))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer to a dripped body within %v: %v", time.Second+slack, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), `"code":"request_timeout"`) {
			t.Fatalf("dripped body: %d %s", resp.StatusCode, b)
		}
		closedWithin(t, c, slack, "the dripping connection after its 408")
		t.Logf("a body dripped at 5 bytes/s answered 408 after %v (body timeout 1s), connection closed", time.Since(start))
	})

	t.Run("idle h2c", func(t *testing.T) {
		c := dialRaw(t, url)
		// The prior-knowledge preface and an empty SETTINGS frame, then
		// nothing: no stream ever opens.
		io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
		took := closedWithin(t, c, time.Second+slack, "an idle h2c connection")
		t.Logf("idle h2c connection closed after %v (idle timeout 1s)", took)
	})

	t.Run("slow stream not cut", func(t *testing.T) {
		start := time.Now()
		toks, _ := clustertest.StreamCompletion(t, url, map[string]any{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 120,
			"seed": 3, "stream": true, "ignore_eos": true}, func(clustertest.Token) { time.Sleep(25 * time.Millisecond) }) // a slow reader
		if len(toks) != 120 {
			t.Fatalf("%d of 120 tokens", len(toks))
		}
		if d := time.Since(start); d < 2*time.Second {
			t.Fatalf("the stream took %v: not longer than the timeouts, proves nothing", d)
		}
	})
}

// TestFrontendRefusesOversizedRequests: bodies over the limit are a 413
// answered quickly (by Content-Length, or as the limit is crossed), a
// 1 MB prompt under it a 400 context_length_exceeded that no worker
// sees; under floods of 50 of either, frontend and worker memory stay
// bounded.
func TestFrontendRefusesOversizedRequests(t *testing.T) {
	t.Parallel()
	n := limitsNode(t)
	worker := n.WaitWorkerReady(t)
	f := clustertest.StartFrontendProc(t, n)
	small := clustertest.StartFrontend(t, n, "--max-body-bytes", "524288")
	wc := n.DialWorker(t, "n1-decode-tiny-0")
	started := func() uint64 {
		h, err := wc.Health(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return h.RequestsStarted
	}
	before := started()
	prompt := strings.Repeat("word ", 200_000) // 1 MB
	onePrompt, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 4})
	oneChat, _ := json.Marshal(map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": prompt}}})

	for _, c := range []struct {
		name, url, path string
		body            func() (io.Reader, int64)
		status          int
		param, code     string
	}{
		{"100 MB, Content-Length", f.URL, "/v1/completions", zeros(100<<20, true), 413, "", "request_too_large"},
		{"100 MB, chunked", f.URL, "/v1/chat/completions", zeros(100<<20, false), 413, "", "request_too_large"},
		{"1 MB over a 512 KiB limit", small, "/v1/completions", bytesBody(onePrompt), 413, "", "request_too_large"},
		{"1 MB prompt", f.URL, "/v1/completions", bytesBody(onePrompt), 400, "prompt", "context_length_exceeded"},
		{"1 MB chat", f.URL, "/v1/chat/completions", bytesBody(oneChat), 400, "messages", "context_length_exceeded"},
	} {
		start := time.Now()
		status, e, err := postBody(c.url+c.path, c.body)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		took := time.Since(start)
		if status != c.status || e.Code != c.code || e.Param != c.param {
			t.Fatalf("%s: %d %+v, want %d %s %q", c.name, status, e, c.status, c.code, c.param)
		}
		if took > 10*time.Second {
			t.Fatalf("%s: answered after %v", c.name, took)
		}
		t.Logf("%s: %d %s in %v", c.name, status, e.Code, took)
	}
	// A body not declared JSON: what a page on another origin can post
	// without a preflight. It used to be served.
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "", "application/json; charset=latin1"} {
		req, _ := http.NewRequest("POST", f.URL+"/v1/completions", strings.NewReader(`{"model":"tiny","prompt":"hi","max_tokens":2}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error apiError }
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 415 || e.Error.Code != "unsupported_media_type" {
			t.Fatalf("Content-Type %q: %d %+v, want 415 unsupported_media_type", ct, resp.StatusCode, e.Error)
		}
	}
	if got := started(); got != before {
		t.Fatalf("the worker started %d requests for refused ones", got-before)
	}

	// Floods: 50 of each at once, RSS sampled throughout.
	for _, flood := range []struct {
		name string
		body func() (io.Reader, int64)
		code int
	}{
		{"50 × 1 MB prompts", bytesBody(onePrompt), 400},
		{"50 × 100 MB bodies (chunked)", zeros(100<<20, false), 413},
	} {
		fBase, wBase := rssMB(t, f.PID()), rssMB(t, worker.PID)
		stop := make(chan struct{})
		var fPeak, wPeak float64
		var sampling sync.WaitGroup
		sampling.Go(func() {
			for {
				fPeak, wPeak = max(fPeak, rssMB(t, f.PID())), max(wPeak, rssMB(t, worker.PID))
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for i := 0; i < 50; i++ {
			wg.Go(func() {
				if status, e, err := postBody(f.URL+"/v1/completions", flood.body); err != nil || status != flood.code {
					errs <- fmt.Errorf("%d %+v %v", status, e, err)
				}
			})
		}
		wg.Wait()
		close(stop)
		sampling.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: %v", flood.name, err)
		}
		t.Logf("%s: frontend RSS %.0f MB → peak %.0f MB; worker %.0f MB → peak %.0f MB", flood.name, fBase, fPeak, wBase, wPeak)
		// Generous: a refused body is held up to the limit (4 MiB), 50 of
		// them 200 MB at worst; unbounded, 50 × 100 MB is 5 GB, and 50
		// 1 MB prompts tokenized and sent on took 700 MB.
		if fPeak-fBase > 300 || wPeak-wBase > 32 {
			t.Fatalf("%s: RSS grew by %.0f MB (frontend), %.0f MB (worker)", flood.name, fPeak-fBase, wPeak-wBase)
		}
	}
	if got := started(); got != before {
		t.Fatalf("the worker started %d requests for refused ones", got-before)
	}
}

// TestFrontendConnectionCap: beyond --max-conns a connection reads a 503
// with Retry-After and is closed, counted; a place freed serves again
// (and the metrics it is counted in are not on the API port).
// Under 2,000 idle hostile connections (below the default cap, held: no
// bytes sent) a normal request still completes.
func TestFrontendConnectionCap(t *testing.T) {
	t.Parallel()
	raiseNoFile(t, 4096)
	n := limitsNode(t)
	capped := clustertest.StartFrontend(t, n, "--max-conns", "16", "--read-header-timeout", "1m")
	// The metrics are on their own loopback listener, not the API port.
	if code, body := getJSON(capped + "/metrics"); code != 404 || !strings.Contains(body, "not_found") {
		t.Fatalf("/metrics on the API port: %d %s", code, body)
	}
	if m := clustertest.MetricsURL(t, capped); !strings.HasPrefix(m, "http://127.0.0.1:") || m == capped {
		t.Fatalf("metrics listener %s (API %s)", m, capped)
	}
	var held []net.Conn
	for range 16 {
		held = append(held, dialRaw(t, capped))
	}
	proctest.WaitFor(t, 30*time.Second, "16 connections accepted", func() (bool, string) {
		g := gauge(t, capped, "lifeline_frontend_client_connections")
		return g == 16, fmt.Sprint(g)
	})
	c := dialRaw(t, capped)
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the 17th connection: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "too_many_connections") {
		t.Fatalf("the 17th connection: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if v := gauge(t, capped, "lifeline_frontend_connections_refused_total"); v < 1 {
		t.Fatalf("refusals counted: %v", v)
	}
	held[0].Close()
	proctest.WaitFor(t, 30*time.Second, "a freed place to serve", func() (bool, string) {
		code, body := getJSON(capped + "/healthz")
		return code == 200, fmt.Sprint(code, body)
	})

	// 2,000 hostile connections that never send a byte, under the default
	// cap; the read-header timeout (10 s) would close them, so they are
	// held while the request runs.
	url := clustertest.StartFrontend(t, n)
	for range 2000 {
		dialRaw(t, url)
	}
	proctest.WaitFor(t, 30*time.Second, "2,000 hostile connections held", func() (bool, string) {
		g := gauge(t, url, "lifeline_frontend_client_connections")
		return g >= 2000, fmt.Sprint(g)
	})
	toks, _ := clustertest.StreamCompletion(t, url, map[string]any{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 20,
		"seed": 1, "stream": true, "ignore_eos": true}, nil)
	if len(toks) != 20 {
		t.Fatalf("%d of 20 tokens under 2,000 hostile connections", len(toks))
	}
	if g := gauge(t, url, "lifeline_frontend_client_connections"); g < 2000 {
		t.Fatalf("the hostile connections were gone before the request ended (%v open): proves nothing", g)
	}
}

// apiError is the OpenAI error shape's inside.
type apiError struct {
	Code  string `json:"code"`
	Param string `json:"param"`
	Type  string `json:"type"`
}

// postBody posts a JSON body and decodes the error it is answered with.
func postBody(url string, body func() (io.Reader, int64)) (int, apiError, error) {
	r, size := body()
	req, _ := http.NewRequestWithContext(context.Background(), "POST", url, r)
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, apiError{}, err
	}
	defer resp.Body.Close()
	var e struct{ Error apiError }
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error, nil
}

func bytesBody(b []byte) func() (io.Reader, int64) {
	return func() (io.Reader, int64) { return strings.NewReader(string(b)), int64(len(b)) }
}

// zeros is a body of size bytes, with its Content-Length or chunked.
func zeros(size int64, known bool) func() (io.Reader, int64) {
	return func() (io.Reader, int64) {
		r := io.LimitReader(zeroReader{}, size)
		if !known {
			return io.MultiReader(r), -1 // hides the length: chunked
		}
		return r, size
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// rssMB is a process's resident set, in MB.
func rssMB(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb float64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb / 1024
		}
	}
	return 0
}

// raiseNoFile raises this process's open-file limit to at least n,
// raising the hard limit too where it is lower (root may); a limit it
// cannot raise fails the test: the connection-cap checks need the
// descriptors.
func raiseNoFile(t *testing.T, n uint64) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	rl.Cur, rl.Max = n, max(rl.Max, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatalf("open-file limit to %d: %v (run as root or raise the hard limit)", n, err)
	}
}
