package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/tracing"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestFrontendMigratesOnWorkerKill is the article's opening scene: a
// seeded stream is under way, the decode worker serving it is SIGKILLed,
// and the client receives the rest from the other worker — same tokens as
// a run that never failed, contiguous sequence numbers, no duplicate.
func TestFrontendMigratesOnWorkerKill(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	url := clustertest.StartFrontend(t, n)
	body := map[string]any{"model": "tiny", "prompt": "Once upon a time there was a little dog", "max_tokens": 240,
		"temperature": 0.9, "seed": 9, "stream": true, "ignore_eos": true}
	want, _ := clustertest.StreamCompletion(t, url, body, nil)
	if len(want) != 240 {
		t.Fatalf("fault-free run: %d tokens", len(want))
	}
	var killed string
	killedAt := 0
	got, last := clustertest.StreamCompletion(t, url, body, func(tok clustertest.Token) {
		if tok.Seq == 30 && killed == "" {
			killed = tok.Instance
			killedAt = tok.Seq
			var ws []controlapi.Worker
			json.Unmarshal([]byte(n.Nodectl(t, "workers", "--json")), &ws)
			for _, w := range ws {
				if w.InstanceID == killed {
					syscall.Kill(w.PID, syscall.SIGKILL)
				}
			}
		}
	})
	if killed == "" {
		t.Fatal("never killed anything")
	}
	if len(got) != len(want) {
		t.Fatalf("after killing %s at %d: %d tokens, want %d", killed, killedAt, len(got), len(want))
	}
	moved := false
	for i := range got {
		if got[i].Seq != i+1 || got[i].TokenID != want[i].TokenID || got[i].Text != want[i].Text {
			t.Fatalf("token %d: %+v, want %+v", i+1, got[i], want[i])
		}
		moved = moved || (got[i].Instance != "" && got[i].Instance != killed)
	}
	if !moved {
		t.Fatalf("the stream never moved off %s", killed)
	}
	ll, _ := last["lifeline"].(map[string]any)
	if m, _ := ll["migrations"].(float64); m < 1 {
		t.Fatalf("final chunk reports %v migrations", ll["migrations"])
	}
	metrics := clustertest.Metrics(t, url)
	for _, want := range []string{`lifeline_frontend_migrations_total{result="success"} 1`, "lifeline_frontend_sequence_gaps_total 0",
		"lifeline_frontend_routed_to_not_ready_total 0", "lifeline_frontend_migration_seconds_count 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	t.Logf("killed %s at sequence %d; stream continued on the other worker, bit-identical (%d tokens)", killed, killedAt, len(got))
	checkMigrationTrace(t, clustertest.Debug(t, url), ll["request_id"].(string), killed)
	// The debug pages are on the 0600 debug socket alone, never on the
	// metrics port every local user reaches.
	for _, page := range []string{"/debug/traces", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap"} {
		resp, err := http.Get(clustertest.MetricsURL(t, url) + page)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("the metrics port serves %s: %s", page, resp.Status)
		}
	}
}

// checkMigrationTrace: the frontend traced the request: its span, a first
// decode attempt on the killed worker ended with the failure, a migration
// span with the recovery's steps in order (failure seen, epoch bump,
// route, re-prefill of the delivered tokens, first token), and a second
// decode attempt elsewhere, all of one trace under the request's span.
func checkMigrationTrace(t *testing.T, debug, id, killed string) {
	t.Helper()
	spans, err := tracing.Fetch(context.Background(), debug, "request_id", id)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string][]tracing.Span{}
	for _, s := range spans {
		by[s.Name] = append(by[s.Name], s)
	}
	root, decodes, migs := by["lifeline.request"], by["lifeline.decode"], by["lifeline.migration"]
	if len(root) != 1 || len(decodes) != 2 || len(migs) != 1 {
		t.Fatalf("spans of %s: %d request, %d decode, %d migration: %+v", id, len(root), len(decodes), len(migs), spans)
	}
	for _, s := range spans {
		if s.TraceID != root[0].TraceID || (s.Name != "lifeline.request" && s.ParentID != root[0].SpanID) {
			t.Errorf("span %s is not under the request's span: %+v", s.Name, s)
		}
	}
	first, second := decodes[0], decodes[1]
	if first.Attrs["instance_id"] != killed || first.Error == "" || first.Attrs["decode_attempt"] != "1" ||
		second.Attrs["instance_id"] == killed || second.Error != "" || second.Attrs["decode_attempt"] != "2" || second.Attrs["sequence_no"] == "0" {
		t.Errorf("decode attempts: %+v, %+v", first, second)
	}
	m := migs[0]
	var steps []string
	for i, e := range m.Events {
		steps = append(steps, e.Name)
		if i > 0 && e.At.Before(m.Events[i-1].At) {
			t.Errorf("migration event %s at %v before %s", e.Name, e.At, m.Events[i-1].Name)
		}
	}
	if got := strings.Join(steps, " "); got != "failure_detected epoch_bump route re_prefill first_token" {
		t.Errorf("migration steps: %s", got)
	}
	if m.Start.Before(first.Start) || m.End.After(root[0].End) || m.Error != "" || m.Attrs["failure_reason"] == "" {
		t.Errorf("migration span %+v (first decode %v, request ends %v)", m, first.Start, root[0].End)
	}
	t.Logf("trace: decode on %s failed (%s), migration %v (%s), decode on %s", killed, first.Error,
		m.End.Sub(m.Start).Round(time.Millisecond), strings.Join(steps, " → "), second.Attrs["instance_id"])
}

func TestFrontendBadInput(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
	})
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	for _, c := range []struct {
		body string
		code int
		typ  string
	}{
		{`{"model": "tiny", "prompt": `, 400, "invalid_request_error"},
		{`{"model": "tiny", "prompt": "hi", "max_tokens": -1}`, 400, "invalid_request_error"},
		{`{"model": "tiny", "prompt": "hi", "max_tokens": 99999999999}`, 400, "invalid_request_error"},
		{`{"model": "tiny", "prompt": ""}`, 400, "invalid_request_error"},
		{`{"model": "nonexistent", "prompt": "hi"}`, 404, "invalid_request_error"},
		{`{"model": "tiny", "prompt": "` + strings.Repeat("the ", 5000) + `", "max_tokens": 5}`, 400, "invalid_request_error"}, // past tiny's 4,096-token context
		{`{"model": "tiny", "prompt": "hi", "max_tokens": 5, "unknown_field": 1, "ignore_eos": true}`, 200, ""},
	} {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || (c.typ != "" && !regexp.MustCompile(`"type":"`+c.typ+`"`).Match(b)) {
			t.Errorf("%s: %d %s, want %d %s", c.body, resp.StatusCode, b, c.code, c.typ)
		}
	}
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"id":"tiny"`) {
		t.Fatalf("models: %s", b)
	}
	// Chat: a non-streaming answer in the OpenAI shape, and bad messages.
	resp, err = http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":6,"ignore_eos":true,"seed":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var chat struct {
		Object  string
		Choices []struct {
			Message struct{ Role, Content string }
		}
	}
	json.NewDecoder(resp.Body).Decode(&chat)
	resp.Body.Close()
	if resp.StatusCode != 200 || chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Choices[0].Message.Role != "assistant" || chat.Choices[0].Message.Content == "" {
		t.Fatalf("chat: %d %+v", resp.StatusCode, chat)
	}
	// The same chat streamed: chat.completion.chunk deltas that add up to
	// the same answer, then a chunk with the finish reason.
	resp, err = http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":6,"ignore_eos":true,"seed":1,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	var streamed strings.Builder
	finish := ""
	for rd := sse.NewReader(resp.Body); ; {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil || ev.Chunk == nil || ev.Chunk.Object != "chat.completion.chunk" || ev.Chunk.Choices[0].Delta == nil {
			t.Fatalf("chat chunk %s: %v", ev.Data, err)
		}
		streamed.WriteString(ev.Chunk.Content())
		if f := ev.Chunk.Finish(); f != "" {
			finish = f
		}
	}
	resp.Body.Close()
	if streamed.String() != chat.Choices[0].Message.Content || finish != "length" {
		t.Fatalf("streamed chat %q (finish %q), whole %q", streamed.String(), finish, chat.Choices[0].Message.Content)
	}
	for _, bad := range []string{`{"model":"tiny","messages":[]}`, `{"model":"tiny","messages":[{"role":"wizard","content":"x"}]}`} {
		resp, _ := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(bad))
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%s: %d", bad, resp.StatusCode)
		}
	}
}

// TestFrontendResume: a client that asked for a resumable stream drops its
// connection after 20 tokens and comes back with Last-Event-ID (and
// another with starting_after): it gets exactly the rest, identical to an
// uninterrupted run. Resume tokens are checked.
func TestFrontendResume(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	body := map[string]any{"model": "tiny", "prompt": "The old river", "max_tokens": 150, "temperature": 0.9, "seed": 4,
		"stream": true, "ignore_eos": true, "stream_options": map[string]any{"resumable": true}}
	want, _ := clustertest.StreamCompletion(t, url, body, nil)
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	first := clustertest.ReadSSE(t, resp.Body, func(tok clustertest.Token) bool { return tok.Seq == 20 })
	resp.Body.Close() // the client's connection drops
	resume := func(after string, query string, tok string) (*http.Response, []clustertest.Token) {
		req, _ := http.NewRequest("GET", url+"/v1/streams/"+id+query, nil)
		if after != "" {
			req.Header.Set("Last-Event-ID", after)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return resp, nil
		}
		return resp, clustertest.ReadSSE(t, resp.Body, nil)
	}
	_, rest := resume("20", "", token)
	got := append(first, rest...)
	if len(got) != len(want) {
		t.Fatalf("resumed: %d + %d tokens, want %d", len(first), len(rest), len(want))
	}
	for i := range got {
		if got[i].Seq != i+1 || got[i].TokenID != want[i].TokenID || got[i].Text != want[i].Text {
			t.Fatalf("token %d after resume: %+v, want %+v", i+1, got[i], want[i])
		}
	}
	if _, tail := resume("", "?starting_after=100", token); len(tail) != 50 || tail[0].Seq != 101 {
		t.Fatalf("starting_after=100: %d tokens from %v", len(tail), tail)
	}
	// Forged, foreign and missing tokens are refused.
	other, _ := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"tiny","prompt":"x","max_tokens":2,"ignore_eos":true}`))
	io.Copy(io.Discard, other.Body)
	other.Body.Close()
	for name, tok := range map[string]string{"forged": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "another request's": other.Header.Get("Lifeline-Resume-Token"), "none": ""} {
		if r, _ := resume("0", "", tok); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s token: status %d", name, r.StatusCode)
		}
	}
	if r, _ := resume("abc", "", token); r.StatusCode != http.StatusBadRequest {
		t.Errorf("bad Last-Event-ID: status %d", r.StatusCode)
	}
}

// TestFrontendDisconnectCancels: a plain (not resumable) stream whose
// client goes away is cancelled — its worker stops — and DELETE cancels a
// resumable one.
func TestFrontendDisconnectCancels(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	check := func(id, token string) string {
		req, _ := http.NewRequest("GET", url+"/v1/streams/"+id+"?starting_after=0", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	body := `{"model":"tiny","prompt":"A long tale","max_tokens":900,"seed":1,"stream":true,"ignore_eos":true%s}`
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(body, "")))
	if err != nil {
		t.Fatal(err)
	}
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	clustertest.ReadSSE(t, resp.Body, func(tok clustertest.Token) bool { return tok.Seq == 5 })
	resp.Body.Close()
	if out := check(id, token); !strings.Contains(out, `"type":"cancelled"`) || strings.Count(out, "\nid: ") >= 899 {
		t.Fatalf("a plain stream whose client left was not cancelled: %d events, %q", strings.Count(out, "\nid: "), out[max(0, len(out)-200):])
	}
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(body, `,"stream_options":{"resumable":true}`)))
	if err != nil {
		t.Fatal(err)
	}
	id, token = resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	clustertest.ReadSSE(t, resp.Body, func(tok clustertest.Token) bool { return tok.Seq == 5 })
	resp.Body.Close()
	req, _ := http.NewRequest("DELETE", url+"/v1/streams/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	dresp, err := http.DefaultClient.Do(req)
	if err != nil || dresp.StatusCode != 200 {
		t.Fatalf("DELETE: %v %v", dresp, err)
	}
	dresp.Body.Close()
	if out := check(id, token); !strings.Contains(out, `"type":"cancelled"`) {
		t.Fatalf("DELETE did not cancel: %q", out[max(0, len(out)-200):])
	}
}

// TestFrontendThirtyKillPoints kills the serving worker at 30 seeded random
// points of 30 streams, at temperature 0 and 0.9: every stream's tokens
// equal its fault-free run, with contiguous sequence numbers and nothing
// delivered twice.
func TestFrontendThirtyKillPoints(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
		o.RestartBackoff = agent.Duration(50 * time.Millisecond)
		o.RestartMax = agent.Duration(100 * time.Millisecond)
		o.CrashLoopLimit = 100
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", StepInterval: agent.Duration(clustertest.PacedStep), Count: 2}}
	})
	gens := map[string]uint64{}
	for _, id := range []string{"n1-decode-tiny-0", "n1-decode-tiny-1"} {
		gens[id] = n.WaitRegistration(t, id, 0).Generation
	}
	url := clustertest.StartFrontend(t, n)
	rng := rand.New(rand.NewPCG(30, 2026))
	bodies := make([]map[string]any, 30)
	for i := range bodies {
		temp := 0.0
		if i%2 == 1 {
			temp = 0.9
		}
		bodies[i] = map[string]any{"model": "tiny", "prompt": fmt.Sprintf("Story number %d began when", i), "max_tokens": 120,
			"temperature": temp, "top_p": 0.95, "seed": i, "stream": true, "ignore_eos": true}
	}
	wants := clustertest.StreamCompletions(t, url, bodies)
	for i, body := range bodies {
		temp, want := body["temperature"], wants[i]
		k := 3 + rng.IntN(110)
		var victim string
		got, _ := clustertest.StreamCompletion(t, url, body, func(tok clustertest.Token) {
			if tok.Seq == k && victim == "" {
				victim = tok.Instance
				for _, w := range n.NodectlWorkers(t) {
					if w.InstanceID == victim {
						syscall.Kill(w.PID, syscall.SIGKILL)
					}
				}
			}
		})
		if len(got) != len(want) {
			t.Fatalf("stream %d (temperature %v, killed %s at %d): %d tokens, want %d", i, temp, victim, k, len(got), len(want))
		}
		for j := range got {
			if got[j].Seq != j+1 || got[j].TokenID != want[j].TokenID || got[j].Text != want[j].Text {
				t.Fatalf("stream %d (temperature %v, killed %s at %d): token %d = %+v, want %+v", i, temp, victim, k, j+1, got[j], want[j])
			}
		}
		// Wait for the killed instance to be back before the next kill.
		gens[victim] = n.WaitRegistration(t, victim, gens[victim]).Generation
	}
}

// cuttingConn closes itself after reading budget bytes: a connection that
// breaks mid-stream.
type cuttingConn struct {
	net.Conn
	budget int
}

func (c *cuttingConn) Read(p []byte) (int, error) {
	if c.budget <= 0 {
		c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) > c.budget {
		p = p[:c.budget]
	}
	n, err := c.Conn.Read(p)
	c.budget -= n
	return n, err
}

// TestClientResumesAfterBrokenConnections: the Go client's connection breaks
// every few kilobytes; it reconnects, resumes after its last sequence
// number, drops duplicates, and ends with exactly the uninterrupted run.
// lifeline generate (the CLI over the same client) prints the same text.
func TestClientResumesAfterBrokenConnections(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	temp := 0.9
	req := client.Request{Model: "tiny", Prompt: "Far away", MaxTokens: 160, Temperature: &temp, Seed: 11, IgnoreEOS: true}
	var want []client.Token
	if _, err := client.New(url).Stream(t.Context(), req, func(tok client.Token) { want = append(want, tok) }); err != nil {
		t.Fatal(err)
	}
	cuts := 0
	c := client.New(url)
	c.MaxReconnects = 100
	c.HTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cuts++
		return &cuttingConn{Conn: conn, budget: 6000}, nil
	}}}
	var got []client.Token
	if _, err := c.Stream(t.Context(), req, func(tok client.Token) { got = append(got, tok) }); err != nil {
		t.Fatal(err)
	}
	if cuts < 3 || len(got) != len(want) {
		t.Fatalf("%d connections, %d tokens, want %d", cuts, len(got), len(want))
	}
	for i := range got {
		if got[i].SequenceNo != i+1 || got[i].TokenID != want[i].TokenID || got[i].Text != want[i].Text {
			t.Fatalf("token %d: %+v, want %+v", i+1, got[i], want[i])
		}
	}
	out, errOut, err := proctest.Run(t, "generate", "--url", url, "--model", "tiny", "--max-tokens", "160", "--seed", "11", "--temperature", "0.9", "--ignore-eos", "Far away")
	var text strings.Builder
	for _, tok := range want {
		text.WriteString(tok.Text)
	}
	if err != nil || strings.TrimSuffix(out, "\n") != text.String() {
		t.Fatalf("lifeline generate: %v %s\n%q\nwant %q", err, errOut, out, text.String())
	}
	t.Logf("%d connections for one stream of %d tokens", cuts, len(got))
}

// TestFrontendProtocols: with --tls the same stream is served over HTTP/2
// (ALPN) with an Alt-Svc advertisement, and over HTTP/3 on the same port;
// without it, cleartext HTTP/2 with prior knowledge works too.
func TestFrontendProtocols(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
	})
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	addr := strings.TrimPrefix(clustertest.StartFrontend(t, n, "--tls"), "https://")
	caTLS, err := pki.Load(n.Env.Certs, "h2")
	if err != nil {
		t.Fatal(err)
	}
	roots := &tls.Config{RootCAs: caTLS.RootCAs, ServerName: "localhost"}
	body := `{"model":"tiny","prompt":"hello","max_tokens":10,"seed":2,"stream":true,"ignore_eos":true}`
	post := func(c *http.Client, url string) (*http.Response, []clustertest.Token) {
		resp, err := c.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp, clustertest.ReadSSE(t, resp.Body, nil)
	}
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: roots, ForceAttemptHTTP2: true}}
	r2, t2 := post(h2, "https://"+addr)
	if r2.ProtoMajor != 2 || !strings.Contains(r2.Header.Get("Alt-Svc"), "h3=") || len(t2) != 10 {
		t.Fatalf("HTTP/2: proto %s, Alt-Svc %q, %d tokens", r2.Proto, r2.Header.Get("Alt-Svc"), len(t2))
	}
	h3tr := &http3.Transport{TLSClientConfig: roots}
	defer h3tr.Close()
	r3, t3 := post(&http.Client{Transport: h3tr}, "https://"+addr)
	if r3.ProtoMajor != 3 || len(t3) != 10 {
		t.Fatalf("HTTP/3: proto %s, %d tokens", r3.Proto, len(t3))
	}
	for i := range t2 {
		if t2[i].TokenID != t3[i].TokenID {
			t.Fatalf("HTTP/2 and HTTP/3 streams differ at %d", i+1)
		}
	}
	// Cleartext HTTP/2 with prior knowledge on a plain frontend.
	plain := clustertest.StartFrontend(t, n)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	rc, tc := post(h2c, plain)
	if rc.ProtoMajor != 2 || len(tc) != 10 {
		t.Fatalf("h2c: proto %s, %d tokens", rc.Proto, len(tc))
	}
}

// TestFrontendOverloadIs429: the only worker is at its hard limit (one
// running sequence, no queue); a second request is refused at once with
// 429, Retry-After and the overloaded type, not queued and not hung.
func TestFrontendOverloadIs429(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", StepInterval: agent.Duration(clustertest.PacedStep), Count: 1, MaxRunning: 1, MaxQueued: 0}}
	})
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	long, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"tiny","prompt":"a long one","max_tokens":600,"stream":true,"ignore_eos":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer long.Body.Close()
	clustertest.ReadSSE(t, long.Body, func(tok clustertest.Token) bool { return tok.Seq == 2 })
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"tiny","prompt":"x","max_tokens":5}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"type":"overloaded"`) {
		t.Fatalf("second request: %d, Retry-After %q, %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the refusal took %v", d)
	}
}

// TestFrontendDropsOldEpochFrames: the worker (failpoint) sends a frame of
// the request's previous epoch before the real ones, as a zombie of an
// older attempt would. It never reaches the client, and is counted.
func TestFrontendDropsOldEpochFrames(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
		o.ExtraEnv = []string{"LIFELINE_FAILPOINTS=worker.stale-frame=error"}
	})
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	toks, _ := clustertest.StreamCompletion(t, url, map[string]any{"model": "tiny", "prompt": "hello", "max_tokens": 20, "seed": 1, "stream": true, "ignore_eos": true}, nil)
	if len(toks) != 20 {
		t.Fatalf("%d tokens", len(toks))
	}
	for i, tok := range toks {
		if tok.Seq != i+1 || strings.Contains(tok.Text, "STALE") {
			t.Fatalf("token %d: %+v", i+1, tok)
		}
	}
	b := clustertest.Metrics(t, url)
	if !strings.Contains(b, "lifeline_frontend_stale_epoch_frames_total 1") {
		t.Fatalf("stale frame not counted:\n%s", b)
	}
}

// TestFrontendMigrationExhausted: every worker that takes the request is
// killed; after the budget of 3 migrations the client gets a typed
// migration_exhausted error, promptly, not a hang.
func TestFrontendMigrationExhausted(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
		o.RestartBackoff = agent.Duration(5 * time.Second)
		o.RestartMax = agent.Duration(5 * time.Second)
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", StepInterval: agent.Duration(clustertest.PacedStep), Count: 4}}
		o.ArenaSlots = 512
	})
	for i := 0; i < 4; i++ {
		n.WaitRegistration(t, fmt.Sprintf("n1-decode-tiny-%d", i), 0)
	}
	url := clustertest.StartFrontend(t, n)
	b, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "doomed", "max_tokens": 900, "seed": 1, "stream": true, "ignore_eos": true})
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	killed := map[string]bool{}
	var final string
	for rd := sse.NewReader(resp.Body); ; {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		data, id := string(ev.Data), ""
		if ev.Chunk != nil {
			id = ev.Chunk.Lifeline.InstanceID
		}
		if id != "" && !killed[id] {
			killed[id] = true
			for _, w := range n.NodectlWorkers(t) {
				if w.InstanceID == id {
					syscall.Kill(w.PID, syscall.SIGKILL)
				}
			}
		}
		if strings.Contains(data, `"error"`) {
			final = data
		}
	}
	if !strings.Contains(final, `"type":"migration_exhausted"`) || len(killed) != 4 {
		t.Fatalf("after killing %v: final %q", killed, final)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestFrontendNonStreamingSurvivesMigration: a non-streaming request whose
// worker is killed as soon as it is dispatched still gets the whole
// answer, equal to a fault-free run's.
func TestFrontendNonStreamingSurvivesMigration(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	// The frontend's log lines, to see where it dispatches.
	logs, logw := io.Pipe()
	t.Cleanup(func() { logw.Close() })
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	f, err := n.Env.StartFrontend("127.0.0.1:0", logw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Stop(10 * time.Second) })
	url := f.URL
	body := `{"model":"tiny","prompt":"Tell it all at once","max_tokens":300,"seed":8,"temperature":0.9,"ignore_eos":true}`
	post := func() map[string]any {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err) // also called from a goroutine: no Fatal
			return nil
		}
		defer resp.Body.Close()
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		return v
	}
	want := post()
	for len(lines) > 0 {
		<-lines
	}
	got := make(chan map[string]any, 1)
	go func() { got <- post() }()
	// Kill the worker the request was dispatched to, as soon as it is.
	for {
		var l struct {
			Msg        string
			InstanceID string `json:"instance_id"`
		}
		if json.Unmarshal([]byte(<-lines), &l) == nil && l.Msg == "dispatch" {
			for _, w := range n.NodectlWorkers(t) {
				if w.InstanceID == l.InstanceID {
					syscall.Kill(w.PID, syscall.SIGKILL)
				}
			}
			break
		}
	}
	res := <-got
	text := func(v map[string]any) string {
		ch, _ := v["choices"].([]any)
		if len(ch) == 0 {
			return ""
		}
		s, _ := ch[0].(map[string]any)["text"].(string)
		return s
	}
	ll, _ := res["lifeline"].(map[string]any)
	if text(res) == "" || text(res) != text(want) || ll["migrations"] != float64(1) {
		t.Fatalf("non-streaming answer after a kill: migrations %v, equal %v\n%v", ll["migrations"], text(res) == text(want), res)
	}
}

// TestFrontendDeadline: a request whose timeout passes while it is being
// generated ends with a typed deadline_exceeded (504 before anything was
// streamed), quickly; a bad timeout is a 400.
func TestFrontendDeadline(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
	})
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	for _, c := range []struct {
		name   string
		body   string
		header string
	}{
		{"body", `{"model":"tiny","prompt":"Once upon a time","max_tokens":480,"ignore_eos":true,"timeout_ms":5}`, ""},
		{"header", `{"model":"tiny","prompt":"Once upon a time","max_tokens":480,"ignore_eos":true}`, "5"},
	} {
		req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		if c.header != "" {
			req.Header.Set("Lifeline-Timeout-Ms", c.header)
		}
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(raw), "deadline_exceeded") || time.Since(start) > 2*time.Second {
			t.Fatalf("%s: %d %s after %v", c.name, resp.StatusCode, raw, time.Since(start))
		}
	}
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"tiny","prompt":"x","timeout_ms":-1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("negative timeout: %d", resp.StatusCode)
	}
}

// TestMain runs 4 tests at once: they mostly wait (their test times sum
// to 532 s; the package took 272 s at go test's default of 2 here, 159 s
// at 4).
func TestMain(m *testing.M) { proctest.MainParallel(m, 4) }
