package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// A takeover attaches to the sequence still running on its worker when
// the worker holds it (no recomputation), and regenerates from the record
// only when the worker is gone too.

// resumeOn resumes stream o on url after seen tokens and checks the rest
// against want: 200, bit-identical, contiguous, [DONE].
func resumeOn(t *testing.T, url string, o opened, seen int, want []clustertest.Token) {
	t.Helper()
	resp, err := resumeAt(url, o.id, o.token, seen)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("resume: %d %s", resp.StatusCode, msg)
	}
	toks, errEv, done := readAll(resp.Body)
	if errEv != nil || !done {
		t.Fatalf("resumed stream ended with %v, [DONE] %v", errEv, done)
	}
	if err := sameTail(toks, want, seen); err != nil {
		t.Fatalf("resumed after %d: %v", seen, err)
	}
}

// TestTakeoverAttachesAfterFrontendStop: frontend A is stopped (SIGTERM)
// mid-stream: it detaches its worker streams instead of cancelling them,
// its client gets frontend_stopping, and B, resuming, attaches to the
// sequence still running: no request starts on any worker, the tail is
// bit-identical.
func TestTakeoverAttachesAfterFrontendStop(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	want, _ := clustertest.StreamCompletion(t, b, seeded(3, 96), nil)
	o := open(t, a.URL, seeded(3, 96))
	got := clustertest.ReadSSE(t, o.resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 20 })
	started := requestsStarted(t, n, "n1-decode-tiny-0")
	a.Signal(syscall.SIGTERM)
	rest, errEv, _ := readAll(o.resp.Body)
	o.resp.Body.Close()
	if errEv == nil || errEv.Type != "frontend_stopping" {
		t.Fatalf("A's client: stream ended with %+v; want frontend_stopping", errEv)
	}
	seen := len(got) + len(rest)
	<-a.Exited()
	resumeOn(t, b, o, seen, want)
	if now := requestsStarted(t, n, "n1-decode-tiny-0"); now != started {
		t.Errorf("worker requests started: %d after the takeover, %d before: the request was regenerated, not attached", now, started)
	}
	if got := metric(t, b, `lifeline_frontend_takeover_starts_total{how="attached"}`); got != 1 {
		t.Errorf("takeovers attached on B: %v, want 1", got)
	}
}

// TestTakeoverRegeneratesWhenWorkerDiedToo: frontend A and the stream's
// decode worker are SIGKILLed together: no worker holds the request any
// more, so B regenerates it from the record; the tail is bit-identical.
func TestTakeoverRegeneratesWhenWorkerDiedToo(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	want, _ := clustertest.StreamCompletion(t, b, seeded(5, 96), nil)
	o := open(t, a.URL, seeded(5, 96))
	got := clustertest.ReadSSE(t, o.resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 20 })
	on := got[len(got)-1].Instance
	pid := 0
	for _, w := range n.NodectlWorkers(t) {
		if w.InstanceID == on {
			pid = w.PID
		}
	}
	if pid == 0 {
		t.Fatalf("no pid for %s", on)
	}
	a.Signal(syscall.SIGKILL)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.Exited()
	o.resp.Body.Close()
	resumeOn(t, b, o, len(got), want)
	if got := metric(t, b, `lifeline_frontend_takeover_starts_total{how="regenerated"}`); got != 1 {
		t.Errorf("takeovers regenerated on B: %v, want 1", got)
	}
}

// roundRobin is a TCP load balancer on loopback: each connection goes to
// the next backend that accepts it.
func roundRobin(t *testing.T, backends ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var next atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for range backends {
					addr := strings.TrimPrefix(backends[int(next.Add(1))%len(backends)], "http://")
					up, err := net.DialTimeout("tcp", addr, time.Second)
					if err != nil {
						continue
					}
					defer up.Close()
					go io.Copy(up, c)
					io.Copy(c, up)
					return
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestEventSourceReconnectsThroughABalancer: an EventSource-style client
// (plain GETs of the stream's URL, the token in the query since it cannot
// set headers, Last-Event-ID on reconnection) behind a round-robin load
// balancer of two frontends: the frontend serving it is SIGKILLed, the
// client reconnects to the same address and gets the rest, bit-identical.
func TestEventSourceReconnectsThroughABalancer(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	want, _ := clustertest.StreamCompletion(t, b, seeded(7, 96), nil)
	o := open(t, a.URL, seeded(7, 96))
	o.resp.Body.Close() // the page hands the stream to an EventSource
	lb := roundRobin(t, a.URL, b)
	get := func(after int) *http.Response {
		req, _ := http.NewRequest("GET", lb+"/v1/streams/"+o.id+"?token="+url.QueryEscape(o.token), nil)
		if after > 0 {
			req.Header.Set("Last-Event-ID", strconv.Itoa(after))
		}
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			msg, _ := io.ReadAll(resp.Body)
			t.Fatalf("GET through the balancer: %d %s", resp.StatusCode, msg)
		}
		return resp
	}
	// The first GET may land on B, which takes the stream over from A:
	// either way A is then killed and the stream goes on.
	resp := get(0)
	got := clustertest.ReadSSE(t, resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 30 })
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	resp.Body.Close()
	resp = get(len(got))
	defer resp.Body.Close()
	toks, errEv, done := readAll(resp.Body)
	if errEv != nil || !done {
		t.Fatalf("reconnected stream ended with %v, [DONE] %v", errEv, done)
	}
	if err := sameTail(toks, want, len(got)); err != nil {
		t.Fatal(err)
	}
}

// TestClientLibraryResumesStreamsOnB: eight seeded streams through the
// client library with frontends A and B; once every stream passed its
// random point (5..50% of its tokens), A is SIGKILLed; the library resumes
// each on B: bit-identical to undisturbed runs, contiguous, no duplicate.
// The streams are 400 tokens: at 96, a one-thread small worker (~3 ms a
// step; these are paced at clustertest.PacedStep) finished two of them, and A sent them whole into their readers' socket
// buffers, before the last reader passed its point (no resume at all).
func TestClientLibraryResumesStreamsOnB(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	const streams, tokens = 8, 400
	req := func(i int) client.Request {
		temp := 0.9
		return client.Request{Model: "tiny", Prompt: fmt.Sprintf("Tale %d opened with", i), MaxTokens: tokens, Temperature: &temp, Seed: uint64(40 + i), IgnoreEOS: true}
	}
	// The fault-free runs at once: a paced worker's batch steps as fast as
	// one stream's.
	want, errs := make([][]client.Token, streams), make([]error, streams)
	var fresh sync.WaitGroup
	for i := range want {
		fresh.Go(func() {
			c := client.New(b)
			defer c.Close()
			_, errs[i] = c.Stream(t.Context(), req(i), func(tok client.Token) { want[i] = append(want[i], tok) })
		})
	}
	fresh.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var passed sync.WaitGroup
	passed.Add(streams)
	kill := make(chan struct{})
	go func() { passed.Wait(); a.Signal(syscall.SIGKILL); close(kill) }()
	got := make([][]client.Token, streams)
	var wg sync.WaitGroup
	for i := range got {
		k := tokens*5/100 + rand.IntN(tokens*45/100)
		wg.Go(func() {
			c := client.New(a.URL, b)
			defer c.Close()
			_, err := c.Stream(t.Context(), req(i), func(tok client.Token) {
				got[i] = append(got[i], tok)
				if tok.SequenceNo == k {
					passed.Done()
					// Read on slowly until A is gone: the kill lands
					// mid-stream for every one.
					<-kill
				}
			})
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	for i := range got {
		if len(got[i]) != len(want[i]) {
			t.Errorf("stream %d: %d tokens, want %d", i, len(got[i]), len(want[i]))
			continue
		}
		for j := range got[i] {
			if got[i][j].SequenceNo != j+1 || got[i][j].TokenID != want[i][j].TokenID || got[i][j].Text != want[i][j].Text {
				t.Errorf("stream %d token %d: %+v, want %+v", i, j+1, got[i][j], want[i][j])
				break
			}
		}
	}
	// A stream still running at A's death is taken over; one that A's
	// worker finished while its reader waited is replayed from its record.
	// Either way B served every resume.
	ok := metric(t, b, `lifeline_frontend_takeovers_total{result="ok"}`)
	replayed := metric(t, b, `lifeline_frontend_takeovers_total{result="done_replay"}`)
	if ok+replayed != streams {
		t.Errorf("resumes on B: %v taken over + %v replayed, want %d", ok, replayed, streams)
	}
	t.Logf("on B: %v taken over, %v replayed finished", ok, replayed)
}

// workerHealth is instance's health as its worker reports it.
func workerHealth(t *testing.T, n *clustertest.Node, instance string) *wire.HealthReply {
	t.Helper()
	c := n.DialWorker(t, instance)
	defer c.Close()
	h, err := c.Health(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestCancelAtAnotherFrontend: A is SIGKILLed mid-stream, its worker keeps
// the request detached; a DELETE at B takes the request over and cancels
// it there, and with it the worker's sequence (long before the detach
// grace would end it); a resume then reports it cancelled, and a DELETE
// of a finished stream at a frontend that never held it says finished.
func TestCancelAtAnotherFrontend(t *testing.T) {
	t.Parallel()
	// 480 tokens a step every 20 ms: ~10 s, long after the cancel.
	n := clustertest.NewNode(t, clustertest.PacedDecodeEvery(1, 20*time.Millisecond))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	o := open(t, a.URL, seeded(9, 480))
	clustertest.ReadSSE(t, o.resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 10 })
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	o.resp.Body.Close()
	del := func(url, id, token string) map[string]any {
		req, _ := http.NewRequest("DELETE", url+"/v1/streams/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != 200 {
			t.Fatalf("DELETE at %s: %d %v", url, resp.StatusCode, out)
		}
		return out
	}
	if out := del(b, o.id, o.token); out["cancelled"] != true {
		t.Fatalf("DELETE at B: %v", out)
	}
	proctest.WaitFor(t, 10*time.Second, "the worker's sequence cancelled", func() (bool, string) {
		h := workerHealth(t, n, "n1-decode-tiny-0")
		return h.InFlight == 0 && h.Detached == 0 && h.Running == 0, fmt.Sprintf("in flight %d, detached %d, running %d", h.InFlight, h.Detached, h.Running)
	})
	resp, err := resumeAt(b, o.id, o.token, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, errEv, _ := readAll(resp.Body)
	resp.Body.Close()
	if errEv == nil || errEv.Type != "cancelled" {
		t.Fatalf("resume after the cancel: %+v, want a cancelled end", errEv)
	}

	// A finished stream, deleted at a frontend that never held it.
	c := clustertest.StartFrontend(t, n, "--id", "C")
	f := open(t, b, seeded(2, 8))
	readAll(f.resp.Body)
	f.resp.Body.Close()
	proctest.WaitFor(t, 10*time.Second, "the record completed", func() (bool, string) {
		v := metric(t, b, `lifeline_frontend_request_record_writes_total{kind="complete"}`)
		return v >= 2, fmt.Sprint("completions written: ", v)
	})
	if out := del(c, f.id, f.token); out["cancelled"] != false || out["finished"] != true {
		t.Fatalf("DELETE of a finished stream at C: %v", out)
	}
}

// TestTakeoverAfterAMigration: the stream's worker is SIGKILLed (A
// migrates it to the other worker, which continues from a prefix, and
// writes the prefix into the request's record), then A is SIGKILLed: B
// takes the prefix from the record and attaches to the continuation from
// the sequence after it — no request starts on any worker, the tail is
// bit-identical. It used to ask for sequence 1, be refused, and
// regenerate the whole request (1–21 s to the next token under load).
func TestTakeoverAfterAMigration(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	// 400 tokens: a paced worker steps every 5 ms, and the stream
	// must still run after the kill at 15 reached the worker and after
	// A's death (B attaches to the continuation, not to a finished one).
	want, _ := clustertest.StreamCompletion(t, b, seeded(11, 400), nil)
	o := open(t, a.URL, seeded(11, 400))
	got := clustertest.ReadSSE(t, o.resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 15 })
	first := got[len(got)-1].Instance
	for _, w := range n.NodectlWorkers(t) {
		if w.InstanceID == first {
			if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The killed worker's tokens already sent come first, then the
	// other worker's.
	got = append(got, clustertest.ReadSSE(t, o.resp.Body, func(tok clustertest.Token) bool { return tok.Instance != first })...)
	if moved := got[len(got)-1].Instance; moved == first {
		t.Fatalf("token %d, the stream's last read, still from %s, the killed worker", got[len(got)-1].Seq, moved)
	}
	moved := got[len(got)-1].Instance
	// The continuation's record has its prefix once A's write lands.
	proctest.WaitFor(t, 10*time.Second, "the record's prefix", func() (bool, string) {
		resp, err := n.Env.Client.Get(t.Context(), "/lifeline/v1/requests/"+o.id)
		if err != nil || len(resp.Kvs) == 0 {
			return false, fmt.Sprint(err)
		}
		var rec struct{ Prefix []json.RawMessage }
		json.Unmarshal(resp.Kvs[0].Value, &rec)
		return len(rec.Prefix) >= 15, fmt.Sprintf("%d prefix tokens", len(rec.Prefix))
	})
	started := requestsStarted(t, n, moved)
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	o.resp.Body.Close()
	began := time.Now()
	resumeOn(t, b, o, len(got), want)
	t.Logf("resumed on B after the migration and A's death: the whole tail in %v", time.Since(began))
	if now := requestsStarted(t, n, moved); now != started {
		t.Errorf("requests started on %s: %d after the takeover, %d before: regenerated, not attached", moved, now, started)
	}
	if r := metric(t, b, `lifeline_frontend_takeover_starts_total{how="attached"}`); r != 1 {
		t.Errorf("takeovers attached on B: %v, want 1 (regenerated: %v)", r, metric(t, b, `lifeline_frontend_takeover_starts_total{how="regenerated"}`))
	}
}
