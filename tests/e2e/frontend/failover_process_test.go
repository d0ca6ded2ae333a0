package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// Frontend failover: every streamed request has a record in etcd, resume
// tokens are signed with the cluster's key ring, and a frontend that holds
// no log of a stream takes it over (or replays it) from the record.

// seeded is the body of a resumable, seeded stream i of n tokens.
func seeded(i, n int) map[string]any {
	return map[string]any{"model": "tiny", "prompt": fmt.Sprintf("Story number %d began when", i), "max_tokens": n, "temperature": 0.9,
		"seed": i + 1, "stream": true, "ignore_eos": true, "stream_options": map[string]any{"resumable": true}}
}

// opened is a stream a test started: its id, resume token and response.
type opened struct {
	id, token string
	resp      *http.Response
}

func open(t *testing.T, url string, body map[string]any) opened {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	return opened{id: resp.Header.Get("Lifeline-Request-Id"), token: resp.Header.Get("Lifeline-Resume-Token"), resp: resp}
}

// resumeAt sends GET /v1/streams/{id} to url after sequence number after.
func resumeAt(url, id, token string, after int) (*http.Response, error) {
	req, _ := http.NewRequest("GET", url+"/v1/streams/"+id, nil)
	req.Header.Set("Last-Event-ID", strconv.Itoa(after))
	req.Header.Set("Authorization", "Bearer "+token)
	return http.DefaultClient.Do(req)
}

// readAll reads a resumed stream to its end: the tokens, any error event,
// and whether [DONE] came.
func readAll(r io.Reader) (toks []clustertest.Token, errEv *sse.Error, done bool) {
	rd := sse.NewReader(r)
	for {
		ev, err := rd.Next()
		if err != nil {
			// io.EOF: the stream ended with [DONE].
			return toks, errEv, errors.Is(err, io.EOF)
		}
		switch {
		case ev.Error != nil:
			errEv = ev.Error
		case ev.Chunk != nil && ev.Chunk.Lifeline.SequenceNo > 0:
			l := ev.Chunk.Lifeline
			toks = append(toks, clustertest.Token{Seq: l.SequenceNo, TokenID: l.TokenID, Text: ev.Chunk.Content(), Instance: l.InstanceID})
		}
	}
}

// sameTail checks that got is want after sequence number after: contiguous,
// bit-identical, complete.
func sameTail(got, want []clustertest.Token, after int) error {
	if len(got) != len(want)-after {
		return fmt.Errorf("%d tokens after %d, want %d", len(got), after, len(want)-after)
	}
	for i, tok := range got {
		w := want[after+i]
		if tok.Seq != after+i+1 || tok.TokenID != w.TokenID || tok.Text != w.Text {
			return fmt.Errorf("token %d: %+v, want %+v", after+i+1, tok, w)
		}
	}
	return nil
}

var metricLine = regexp.MustCompile(`(?m)^(\S+) (\S+)$`)

// metric is the value of a metric (name with labels, as printed) on a
// frontend's page; 0 if absent.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	for _, m := range metricLine.FindAllStringSubmatch(clustertest.Metrics(t, url), -1) {
		if m[1] == name {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return 0
}

// requestsStarted sums the workers' started requests on node n.
func requestsStarted(t *testing.T, n *clustertest.Node, instances ...string) uint64 {
	t.Helper()
	var sum uint64
	for _, id := range instances {
		sum += workerHealth(t, n, id).RequestsStarted
	}
	return sum
}

// TestFailoverResumesOnAnotherFrontend: eight seeded resumable streams on
// frontend A, each read to a random point (5..70% of its tokens); A is
// SIGKILLed; each stream resumed on B with its token and Last-Event-ID
// completes, bit-identical to an undisturbed run, with contiguous
// sequence numbers and no duplicate.
func TestFailoverResumesOnAnotherFrontend(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	const streams, tokens = 8, 64
	want := make([][]clustertest.Token, streams)
	for i := range want {
		want[i], _ = clustertest.StreamCompletion(t, b, seeded(i, tokens), nil)
	}
	opens := make([]opened, streams)
	seen := make([]int, streams)
	var wg sync.WaitGroup
	for i := range opens {
		opens[i] = open(t, a.URL, seeded(i, tokens))
		k := tokens*5/100 + rand.IntN(tokens*65/100)
		wg.Go(func() {
			got := clustertest.ReadSSE(t, opens[i].resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= k })
			seen[i] = len(got)
			if err := sameTail(got, want[i][:len(got)], 0); err != nil {
				t.Errorf("stream %d on A: %v", i, err)
			}
		})
	}
	wg.Wait()
	started := requestsStarted(t, n, "n1-decode-tiny-0", "n1-decode-tiny-1")
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	for i, o := range opens {
		o.resp.Body.Close()
		wg.Go(func() {
			resp, err := resumeAt(b, o.id, o.token, seen[i])
			if err != nil {
				t.Errorf("stream %d: resume on B: %v", i, err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				msg, _ := io.ReadAll(resp.Body)
				t.Errorf("stream %d: resume on B: %d %s", i, resp.StatusCode, msg)
				return
			}
			toks, errEv, done := readAll(resp.Body)
			if errEv != nil || !done {
				t.Errorf("stream %d: resumed stream ended with %v, [DONE] %v", i, errEv, done)
			}
			if err := sameTail(toks, want[i], seen[i]); err != nil {
				t.Errorf("stream %d resumed on B after %d: %v", i, seen[i], err)
			}
		})
	}
	wg.Wait()
	// A stream still running at A's death is taken over; one that A's
	// worker finished (and A recorded) while its reader waited is replayed
	// from its record — on an idle machine 2 of the 8 64-token streams
	// did. Either way B served every resume.
	ok := metric(t, b, `lifeline_frontend_takeovers_total{result="ok"}`)
	replayed := metric(t, b, `lifeline_frontend_takeovers_total{result="done_replay"}`)
	if ok+replayed != streams || ok < 1 {
		t.Errorf("resumes on B: %v taken over + %v replayed, want %d with one taken over at least", ok, replayed, streams)
	}
	// Every worker still held its request: B attached, nothing restarted.
	if got := metric(t, b, `lifeline_frontend_takeover_starts_total{how="attached"}`); got != ok {
		t.Errorf("takeovers attached on B: %v, want %v (every takeover)", got, ok)
	}
	t.Logf("on B: %v taken over, %v replayed finished", ok, replayed)
	if now := requestsStarted(t, n, "n1-decode-tiny-0", "n1-decode-tiny-1"); now != started {
		t.Errorf("worker requests started: %d after the takeovers, %d before", now, started)
	}
}

// TestFailoverReplaysAFinishedStream: a stream completed on A, then A is
// SIGKILLed: resumed on B within the window, its tail is replayed from
// the record, bit-identical, without any worker work.
func TestFailoverReplaysAFinishedStream(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	o := open(t, a.URL, seeded(1, 40))
	want, errEv, done := readAll(o.resp.Body)
	o.resp.Body.Close()
	if len(want) != 40 || errEv != nil || !done {
		t.Fatalf("on A: %d tokens, %v, [DONE] %v", len(want), errEv, done)
	}
	// The completion write follows the end of the stream.
	proctest.WaitFor(t, 10*time.Second, "A to write the completed record", func() (bool, string) {
		v := metric(t, a.URL, `lifeline_frontend_request_record_writes_total{kind="complete"}`)
		return v == 1, fmt.Sprint(v)
	})
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	started := requestsStarted(t, n, "n1-decode-tiny-0")
	resp, err := resumeAt(b, o.id, o.token, 25)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("resume on B: %d %s", resp.StatusCode, msg)
	}
	tail, errEv, done := readAll(resp.Body)
	if err := sameTail(tail, want, 25); err != nil || errEv != nil || !done {
		t.Fatalf("replayed tail: %v, error %v, [DONE] %v", err, errEv, done)
	}
	if now := requestsStarted(t, n, "n1-decode-tiny-0"); now != started {
		t.Fatalf("the replay started worker requests: %d, then %d", started, now)
	}
	if v := metric(t, b, `lifeline_frontend_takeovers_total{result="done_replay"}`); v != 1 {
		t.Fatalf("done replays on B: %v", v)
	}
}

// TestFailoverTakeoverRace: A is killed and two frontends are asked to
// take its stream over at once. When both read the record before either
// writes it, exactly one wins (200) and the other answers 409 taken_over
// naming the winner. When one reads it after the other's takeover (a slow
// reader on a loaded machine), its resume takes the request over from
// the first, as any resume at a frontend without the stream does: the
// first's stream then ends with a taken_over error naming the second.
// Either way the request is driven by one frontend at a time and the
// client ends with the exact tail.
func TestFailoverTakeoverRace(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	urls := map[string]string{"B": clustertest.StartFrontend(t, n, "--id", "B"), "C": clustertest.StartFrontend(t, n, "--id", "C")}
	want, _ := clustertest.StreamCompletion(t, urls["B"], seeded(3, 48), nil)
	o := open(t, a.URL, seeded(3, 48))
	clustertest.ReadSSE(t, o.resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 10 })
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	o.resp.Body.Close()
	type answer struct {
		name, owner string
		code        int
		body        []byte
		toks        []clustertest.Token
		errEv       *sse.Error
	}
	answers := make(chan answer, 2)
	start := make(chan struct{})
	for name, url := range urls {
		go func() {
			<-start
			resp, err := resumeAt(url, o.id, o.token, 10)
			if err != nil {
				answers <- answer{name: name, code: -1, body: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			an := answer{name: name, code: resp.StatusCode, owner: resp.Header.Get("Lifeline-Owner-URL")}
			if resp.StatusCode == 200 {
				an.toks, an.errEv, _ = readAll(resp.Body)
			} else {
				an.body, _ = io.ReadAll(resp.Body)
			}
			answers <- an
		}()
	}
	close(start)
	got := map[int][]answer{}
	for range 2 {
		an := <-answers
		got[an.code] = append(got[an.code], an)
	}
	sum := metric(t, urls["B"], `lifeline_frontend_takeovers_total{result="ok"}`) + metric(t, urls["C"], `lifeline_frontend_takeovers_total{result="ok"}`)
	switch {
	case len(got[200]) == 1 && len(got[409]) == 1:
		win, lose := got[200][0], got[409][0]
		if lose.owner != urls[win.name] || !strings.Contains(string(lose.body), `"taken_over"`) {
			t.Fatalf("the loser (%s) named %q (winner %s at %s): %s", lose.name, lose.owner, win.name, urls[win.name], lose.body)
		}
		if err := sameTail(win.toks, want, 10); err != nil || win.errEv != nil {
			t.Fatalf("the winner's stream: %v, error %v", err, win.errEv)
		}
		if sum != 1 {
			t.Fatalf("takeovers ok over B and C: %v", sum)
		}
	case len(got[200]) == 2:
		// One after the other: the first's stream ends taken over by the
		// second, whose stream is the whole tail.
		first, second := got[200][0], got[200][1]
		if first.errEv == nil {
			first, second = second, first
		}
		if first.errEv == nil || first.errEv.Type != "taken_over" || first.errEv.OwnerURL != urls[second.name] {
			t.Fatalf("two takeovers, but %s's stream did not end taken over by %s: %+v", first.name, second.name, first.errEv)
		}
		if err := sameTail(first.toks, want[:10+len(first.toks)], 10); err != nil {
			t.Fatalf("the first taker's stream: %v", err)
		}
		if err := sameTail(second.toks, want, 10); err != nil || second.errEv != nil {
			t.Fatalf("the second taker's stream: %v, error %v", err, second.errEv)
		}
		if sum != 2 {
			t.Fatalf("takeovers ok over B and C: %v", sum)
		}
		t.Logf("sequential takeovers: %s streamed %d tokens, then %s took over", first.name, len(first.toks), second.name)
	default:
		t.Fatalf("answers: %+v", got)
	}
}

// TestFailoverTokens: forged, expired-looking, other-request and missing
// tokens are refused by every frontend; after rotate-resume-key a token
// of the previous key works on every frontend, after a second rotation
// it is refused.
func TestFailoverTokens(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	urls := []string{clustertest.StartFrontend(t, n, "--id", "A"), clustertest.StartFrontend(t, n, "--id", "B")}
	o := open(t, urls[0], seeded(5, 8))
	readAll(o.resp.Body)
	o.resp.Body.Close()
	other := open(t, urls[1], seeded(6, 4))
	readAll(other.resp.Body)
	other.resp.Body.Close()
	status := func(url, tok string) int {
		resp, err := resumeAt(url, o.id, tok, 0)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	bad := map[string]string{"forged": "AhBmb3JnZWRrZXkAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"another request's": other.token, "none": "", "garbage": "!!", "truncated": o.token[:len(o.token)-4],
		"expired": ringToken(t, n, o.id, time.Now().Add(-time.Minute))}
	for _, url := range urls {
		if got := status(url, o.token); got != 200 {
			t.Fatalf("%s: the stream's own token: %d", url, got)
		}
		// The same construction, unexpired, is accepted: the expired one
		// is refused for its expiry alone.
		if got := status(url, ringToken(t, n, o.id, time.Now().Add(time.Hour))); got != 200 {
			t.Fatalf("%s: a token made by the test with the ring's key: %d", url, got)
		}
		for name, tok := range bad {
			if got := status(url, tok); got != http.StatusUnauthorized {
				t.Errorf("%s: %s token: %d", url, name, got)
			}
		}
	}
	rotate := func() {
		out, errOut, err := proctest.Run(t, "frontend", "rotate-resume-key", "--etcd", n.Env.Etcd.Endpoint, "--etcd-tls", "--certs", n.Env.Certs)
		if err != nil {
			t.Fatalf("rotate-resume-key: %v %s %s", err, out, errOut)
		}
	}
	rotate()
	for _, url := range urls {
		proctest.WaitFor(t, 10*time.Second, "the rotated ring at "+url, func() (bool, string) {
			fresh := open(t, url, seeded(7, 2))
			readAll(fresh.resp.Body)
			fresh.resp.Body.Close()
			return fresh.token[:12] != o.token[:12], fresh.token
		})
		if got := status(url, o.token); got != 200 {
			t.Errorf("%s: the previous key's token after one rotation: %d", url, got)
		}
	}
	rotate()
	for _, url := range urls {
		proctest.WaitFor(t, 10*time.Second, "the second rotation at "+url, func() (bool, string) {
			got := status(url, o.token)
			return got == http.StatusUnauthorized, fmt.Sprint(got)
		})
	}
}

// ringToken signs a resume token for request id, valid until expiry, with
// the current key of the cluster's ring, in the documented format:
// base64url(2, len(key id), key id, expiry (unix seconds, big-endian),
// HMAC-SHA256(secret, key id ‖ 0 ‖ request id ‖ 0 ‖ expiry)).
func ringToken(t *testing.T, n *clustertest.Node, id string, expiry time.Time) string {
	t.Helper()
	resp, err := n.Env.Client.Get(t.Context(), schema.ResumeKeysKey)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read the key ring: %v, %d keys", err, len(resp.Kvs))
	}
	ring, err := schema.DecodeResumeKeyRing(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	key := ring.Keys[0]
	e := binary.BigEndian.AppendUint64(nil, uint64(expiry.Unix()))
	m := hmac.New(sha256.New, key.Secret)
	m.Write([]byte(key.ID))
	m.Write([]byte{0})
	m.Write([]byte(id))
	m.Write([]byte{0})
	m.Write(e)
	b := append([]byte{2, byte(len(key.ID))}, key.ID...)
	b = append(append(b, e...), m.Sum(nil)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestFailoverEtcdDownDuringTakeover: with etcd stopped, a resume that
// needs a takeover is answered 503 takeover_unavailable quickly; once etcd
// is back the same resume succeeds, and the request was driven by one
// frontend.
func TestFailoverEtcdDownDuringTakeover(t *testing.T) {
	t.Parallel() // waits on timers and processes: overlapped with the other waiting tests
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	want, _ := clustertest.StreamCompletion(t, b, seeded(9, 48), nil)
	o := open(t, a.URL, seeded(9, 48))
	clustertest.ReadSSE(t, o.resp.Body, func(tok clustertest.Token) bool { return tok.Seq >= 12 })
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	o.resp.Body.Close()
	env := n.Env
	dir, port, certs := env.Etcd.Dir(), env.Etcd.Port(), env.Etcd.CertDir()
	env.Etcd.Close()
	began := time.Now()
	resp, err := resumeAt(b, o.id, o.token, 12)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(began)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(msg), `"takeover_unavailable"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("resume with etcd down: %d %s (Retry-After %q)", resp.StatusCode, msg, resp.Header.Get("Retry-After"))
	}
	if took > 5*time.Second {
		t.Fatalf("the refusal took %v", took)
	}
	if env.Etcd, err = embedetcd.Start(dir, port, certs); err != nil {
		t.Fatal(err)
	}
	var toks []clustertest.Token
	proctest.WaitFor(t, time.Minute, "the resume to succeed with etcd back", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", b+"/v1/streams/"+o.id, nil)
		req.Header.Set("Last-Event-ID", "12")
		req.Header.Set("Authorization", "Bearer "+o.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			msg, _ := io.ReadAll(resp.Body)
			return false, fmt.Sprintf("%d %s", resp.StatusCode, msg)
		}
		toks, _, _ = readAll(resp.Body)
		return true, ""
	})
	if err := sameTail(toks, want, 12); err != nil {
		t.Fatalf("after etcd came back: %v", err)
	}
	if v := metric(t, b, `lifeline_frontend_takeovers_total{result="ok"}`); v != 1 {
		t.Fatalf("takeovers ok on B: %v, want 1", v)
	}
}

// TestFailoverOwnerLearnsOfTakeover: a stream is resumed on B while A,
// which admitted it, still runs it: B takes it over; A stops driving it
// and its client gets a final taken_over error naming B (no [DONE]); the
// client that resumed on B gets the whole rest, bit-identical.
func TestFailoverOwnerLearnsOfTakeover(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	a := clustertest.StartFrontend(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	want, _ := clustertest.StreamCompletion(t, a, seeded(11, 200), nil)
	o := open(t, a, seeded(11, 200))
	defer o.resp.Body.Close()
	rd := sse.NewReader(o.resp.Body)
	for seen := 0; seen < 5; {
		ev, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Chunk != nil && ev.Chunk.Lifeline.SequenceNo > 0 {
			seen = ev.Chunk.Lifeline.SequenceNo
		}
	}
	resp, err := resumeAt(b, o.id, o.token, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("resume on B: %d %s", resp.StatusCode, msg)
	}
	// A's client: tokens, then the taken_over event, and no [DONE].
	var last *sse.Error
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			t.Fatal("A's stream ended with [DONE] after the takeover")
		}
		if err != nil {
			break
		}
		if ev.Error != nil {
			last = ev.Error
		}
	}
	if last == nil || last.Type != "taken_over" || last.OwnerURL != b {
		t.Fatalf("A's stream ended with %+v, want taken_over naming %s", last, b)
	}
	toks, errEv, done := readAll(resp.Body)
	if err := sameTail(toks, want, 5); err != nil || errEv != nil || !done {
		t.Fatalf("on B: %v, error %v, [DONE] %v", err, errEv, done)
	}
	if v := metric(t, a, `lifeline_frontend_request_records_outstanding`); v != 0 {
		t.Fatalf("A still counts %v records as its own", v)
	}
}
