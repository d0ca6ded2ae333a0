package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/frontend"
	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// Several choices per request: each choice is a request of its own under
// the parent the client sees, so each migrates alone and resumes from its
// own position.

// choiceBody is a seeded streamed request of n choices of tokens tokens.
func choiceBody(n, tokens int, resumable bool) map[string]any {
	return map[string]any{"model": "tiny", "prompt": "The lighthouse keeper wrote", "max_tokens": tokens, "temperature": 0.9,
		"seed": 11, "n": n, "stream": true, "ignore_eos": true, "stream_options": map[string]any{"resumable": resumable, "include_usage": true}}
}

// choiceStream is a multiplexed stream as read: each choice's tokens, the
// last event's id, the finish chunks by choice, the usage, the error
// event, and whether [DONE] came.
type choiceStream struct {
	toks     [][]clustertest.Token
	lastID   string
	finishes []int
	usage    *sse.Usage
	errEv    *sse.Error
	done     bool
}

// readChoices reads a stream of k choices; stop (if set) is told each
// token with its choice and ends the reading by returning true.
func readChoices(r io.Reader, k int, stop func(i int, tok clustertest.Token) bool) choiceStream {
	cs := choiceStream{toks: make([][]clustertest.Token, k)}
	rd := sse.NewReader(r)
	for {
		ev, err := rd.Next()
		if err != nil {
			cs.done = errors.Is(err, io.EOF)
			return cs
		}
		if ev.Error != nil {
			cs.errEv = ev.Error
			continue
		}
		c := ev.Chunk
		if c.Usage != nil {
			cs.usage = c.Usage
			continue
		}
		cs.lastID = ev.ID
		i := c.Choices[0].Index
		if c.Finish() != "" {
			cs.finishes = append(cs.finishes, i)
			continue
		}
		l := c.Lifeline
		tok := clustertest.Token{Seq: l.SequenceNo, TokenID: l.TokenID, Text: c.Content(), Instance: l.InstanceID}
		cs.toks[i] = append(cs.toks[i], tok)
		if stop != nil && stop(i, tok) {
			return cs
		}
	}
}

func postChoices(t *testing.T, url string, body map[string]any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	return resp
}

// resumeChoices sends GET /v1/streams/{id} with Last-Event-ID lastID.
func resumeChoicesAt(url, id, token, lastID string) (*http.Response, error) {
	req, _ := http.NewRequest("GET", url+"/v1/streams/"+id, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return http.DefaultClient.Do(req)
}

// killWorker SIGKILLs the worker process of instance id on n.
func killWorker(t *testing.T, n *clustertest.Node, id string) {
	var ws []controlapi.Worker
	json.Unmarshal([]byte(n.Nodectl(t, "workers", "--json")), &ws)
	for _, w := range ws {
		if w.InstanceID == id {
			syscall.Kill(w.PID, syscall.SIGKILL)
			return
		}
	}
	t.Fatalf("no worker %s", id)
}

// TestChoicesMigrateOnWorkerKill: n = 4 streamed over two decode workers;
// the worker serving choice 0 is SIGKILLed mid-stream: every choice's
// tokens are identical to a fault-free run's, contiguous, with no
// duplicate; the choices on the other worker never moved (each choice
// migrates alone).
func TestChoicesMigrateOnWorkerKill(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	url := clustertest.StartFrontend(t, n)
	const tokens, k = 120, 4
	resp := postChoices(t, url, choiceBody(k, tokens, false))
	want := readChoices(resp.Body, k, nil)
	resp.Body.Close()
	for i, toks := range want.toks {
		if len(toks) != tokens {
			t.Fatalf("fault-free choice %d: %d tokens", i, len(toks))
		}
	}
	if want.toks[0][5].TokenID == want.toks[1][5].TokenID && want.toks[0][10].TokenID == want.toks[1][10].TokenID {
		t.Fatal("two choices sampled alike: the seeds are not per choice")
	}
	if want.usage == nil || want.usage.CompletionTokens != k*tokens {
		t.Fatalf("usage %+v", want.usage)
	}
	killed := ""
	at := make([]string, k) // each choice's worker when choice 0's was killed
	resp = postChoices(t, url, choiceBody(k, tokens, false))
	got := readChoices(resp.Body, k, func(i int, tok clustertest.Token) bool {
		if killed == "" {
			at[i] = tok.Instance
		}
		if i == 0 && tok.Seq == 30 && killed == "" {
			killed = tok.Instance
			killWorker(t, n, killed)
		}
		return false
	})
	resp.Body.Close()
	if killed == "" || got.errEv != nil || !got.done || len(got.finishes) != k {
		t.Fatalf("killed %q; error %v, [DONE] %v, finishes %v", killed, got.errEv, got.done, got.finishes)
	}
	for i := range k {
		if err := sameTail(got.toks[i], want.toks[i], 0); err != nil {
			t.Fatalf("choice %d after killing %s: %v", i, killed, err)
		}
	}
	moved := false
	for _, tok := range got.toks[0] {
		moved = moved || tok.Instance != killed
	}
	if !moved {
		t.Fatalf("choice 0 never moved off %s", killed)
	}
	alone := 0
	for i := 1; i < k; i++ {
		if at[i] == "" || at[i] == killed {
			continue
		}
		alone++
		for _, tok := range got.toks[i] {
			if tok.Instance != at[i] {
				t.Fatalf("choice %d moved from %s to %s though its worker lived", i, at[i], tok.Instance)
			}
		}
	}
	if alone == 0 {
		// The router spreads a burst by its own open streams: four choices
		// on two workers put some on the worker that lives.
		t.Fatalf("no choice ran on the surviving worker (choices on %v): independence not shown", at)
	}
	t.Logf("killed %s under choice 0 at 30 (choices on %v): every choice bit-identical, %d streamed on unmoved", killed, at, alone)
}

// TestChoicesResumeFromTheMiddle: a resumable n = 2 stream read to a
// point; a resume with the last event's id (every choice's position)
// gives exactly the rest of each choice; malformed positions are a 400
// naming Last-Event-ID.
func TestChoicesResumeFromTheMiddle(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	const tokens = 60
	resp := postChoices(t, url, choiceBody(2, tokens, true))
	want := readChoices(resp.Body, 2, nil)
	resp.Body.Close()
	resp = postChoices(t, url, choiceBody(2, tokens, true))
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	head := readChoices(resp.Body, 2, func(i int, tok clustertest.Token) bool { return i == 1 && tok.Seq == 20 })
	resp.Body.Close()
	pos, err := sse.ParsePositions(head.lastID, 2)
	if err != nil || pos[1] != 20 || pos[0] != len(head.toks[0]) {
		t.Fatalf("last event id %q: %v %v (choice 0 had %d)", head.lastID, pos, err, len(head.toks[0]))
	}
	for _, bad := range []string{"20", "1.2.3", "1;2", "-1.2", "1.x"} {
		r, err := resumeChoicesAt(url, id, token, bad)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error struct{ Param string } }
		json.NewDecoder(r.Body).Decode(&body)
		r.Body.Close()
		if r.StatusCode != 400 || body.Error.Param != "Last-Event-ID" {
			t.Fatalf("Last-Event-ID %q: %d, param %q", bad, r.StatusCode, body.Error.Param)
		}
	}
	r, err := resumeChoicesAt(url, id, token, head.lastID)
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("resume: %v %v", err, r)
	}
	rest := readChoices(r.Body, 2, nil)
	r.Body.Close()
	if rest.errEv != nil || !rest.done || len(rest.finishes) != 2 {
		t.Fatalf("resumed: error %v, [DONE] %v, finishes %v", rest.errEv, rest.done, rest.finishes)
	}
	for i := range 2 {
		if err := sameTail(append(head.toks[i], rest.toks[i]...), want.toks[i], 0); err != nil {
			t.Fatalf("choice %d: head %d + rest %d: %v", i, len(head.toks[i]), len(rest.toks[i]), err)
		}
	}
}

// TestChoicesFrontendFailover: a resumable n = 2 stream on frontend A,
// read to a point; A is SIGKILLed; resumed on B with the last event's id,
// every choice completes bit-identical to a fault-free run.
func TestChoicesFrontendFailover(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	const tokens = 64
	resp := postChoices(t, b, choiceBody(2, tokens, true))
	want := readChoices(resp.Body, 2, nil)
	resp.Body.Close()
	resp = postChoices(t, a.URL, choiceBody(2, tokens, true))
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	head := readChoices(resp.Body, 2, func(i int, tok clustertest.Token) bool { return i == 0 && tok.Seq == 15 })
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	resp.Body.Close()
	r, err := resumeChoicesAt(b, id, token, head.lastID)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if r.StatusCode != 200 {
		msg, _ := io.ReadAll(r.Body)
		t.Fatalf("resume on B after %q: %d %s", head.lastID, r.StatusCode, msg)
	}
	rest := readChoices(r.Body, 2, nil)
	if rest.errEv != nil || !rest.done {
		t.Fatalf("resumed on B: error %v, [DONE] %v", rest.errEv, rest.done)
	}
	for i := range 2 {
		if err := sameTail(append(head.toks[i], rest.toks[i]...), want.toks[i], 0); err != nil {
			t.Fatalf("choice %d: %v", i, err)
		}
	}
	if got := metric(t, b, `lifeline_frontend_takeovers_total{result="ok"}`); got != 2 {
		t.Errorf("takeovers on B: %v, want one per choice", got)
	}
}

// TestChoicesBatchWhole: a prompt array of 2 with n = 2, not streamed: 4
// choices in index order (prompt_i·n + j), each the text a request of its
// prompt alone with the choice's seed gives; prompt tokens counted once
// per prompt.
func TestChoicesBatchWhole(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	prompts := []string{"The river", "A quiet morning in the old town"}
	whole := func(body map[string]any) map[string]any {
		b, _ := json.Marshal(body)
		resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, out)
		}
		return out
	}
	out := whole(map[string]any{"model": "tiny", "prompt": prompts, "n": 2, "max_tokens": 12, "temperature": 0.9, "seed": 5, "ignore_eos": true})
	choices, _ := out["choices"].([]any)
	if len(choices) != 4 {
		t.Fatalf("%d choices: %v", len(choices), out)
	}
	promptTokens := 0
	for i, c := range choices {
		ch := c.(map[string]any)
		one := whole(map[string]any{"model": "tiny", "prompt": prompts[i/2], "max_tokens": 12, "temperature": 0.9,
			"seed": frontend.ChoiceSeed(5, i), "ignore_eos": true})
		oc := one["choices"].([]any)[0].(map[string]any)
		if ch["index"] != float64(i) || ch["text"] != oc["text"] || ch["finish_reason"] != "length" {
			t.Fatalf("choice %d: %v, want the text %q", i, ch, oc["text"])
		}
		if i%2 == 0 {
			promptTokens += int(one["usage"].(map[string]any)["prompt_tokens"].(float64))
		}
	}
	if choices[0].(map[string]any)["text"] == choices[1].(map[string]any)["text"] {
		t.Fatal("two choices of one prompt alike: the seeds are not per choice")
	}
	u := out["usage"].(map[string]any)
	if int(u["prompt_tokens"].(float64)) != promptTokens || u["completion_tokens"] != float64(48) || !strings.HasPrefix(out["id"].(string), "cmpl-") {
		t.Fatalf("usage %v, want %d prompt tokens (once per prompt) and 48 completion tokens; id %v", u, promptTokens, out["id"])
	}
}
