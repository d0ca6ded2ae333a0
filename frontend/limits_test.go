package frontend

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/frontend/route"
)

// TestResumeTokenLifetimeCapped: a token signed with a valid key but an
// expiry beyond now + the maximum lifetime is refused, 2^63-1 included;
// IssueFor never issues one beyond it.
func TestResumeTokenLifetimeCapped(t *testing.T) {
	k := newResumeKeys([]byte("a static secret of some length"))
	k.maxAge = 2 * time.Hour
	if err := k.Check(k.Issue("r", t0.Add(time.Hour)), "r", t0); err != nil {
		t.Fatalf("within the cap: %v", err)
	}
	for name, exp := range map[string]time.Time{"past the cap": t0.Add(3 * time.Hour), "2^63-1": time.Unix(math.MaxInt64, 0)} {
		err := k.Check(k.Issue("r", exp), "r", t0)
		if !errors.Is(err, ErrBadResumeToken) || !strings.Contains(err.Error(), "maximum lifetime") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The raw encoding of 2^63-1, as a key holder would mint it.
	b, _ := base64.RawURLEncoding.DecodeString(k.Issue("r", t0))
	binary.BigEndian.PutUint64(b[2+int(b[1]):], math.MaxInt64)
	copy(b[2+int(b[1])+8:], mac(k.keys[0], "r", math.MaxInt64))
	if err := k.Check(base64.RawURLEncoding.EncodeToString(b), "r", t0); !errors.Is(err, ErrBadResumeToken) {
		t.Fatalf("2^63-1 minted: %v", err)
	}
	now := time.Now()
	tok := k.IssueFor("r", now, 5*time.Hour) // window + 1 h > the cap
	if err := k.Check(tok, "r", now); err != nil {
		t.Fatalf("IssueFor past the cap: %v", err)
	}
	if err := k.Check(tok, "r", now.Add(2*time.Hour+time.Second)); err == nil {
		t.Fatal("IssueFor: a token outlives the cap")
	}
}

// TestResumeTokenUnknownKeyChecked: a token of an unknown key id takes
// the same path as a bad MAC (a MAC computed and compared), and is
// refused naming the key.
func TestResumeTokenUnknownKeyChecked(t *testing.T) {
	k := newResumeKeys(nil)
	other := newResumeKeys(nil)
	err := k.Check(other.Issue("r", t0.Add(time.Minute)), "r", t0)
	if !errors.Is(err, ErrBadResumeToken) || !strings.Contains(err.Error(), "unknown key") {
		t.Fatalf("unknown key: %v", err)
	}
	// A decoy-signed token (the decoy is never in a ring) is refused too.
	d := &resumeKeys{keys: []schema.ResumeKey{decoyKey}}
	if err := k.Check(d.Issue("r", t0.Add(time.Minute)), "r", t0); !errors.Is(err, ErrBadResumeToken) {
		t.Fatalf("decoy key: %v", err)
	}
}

// TestCapListenerRefuses: beyond the cap a cleartext connection reads a
// whole 503 with Retry-After and is closed; a closed connection frees
// its place.
func TestCapListenerRefuses(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	var goes owned
	t.Cleanup(func() {
		if left := goes.wait(5 * time.Second); left != 0 {
			t.Errorf("%d refusal goroutines still running", left)
		}
	})
	ln := newCapListener(inner, &goes, 2, true, func() { refused.Add(1) })
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(), dial()
	_, _ = a, b
	sa, sb := <-accepted, <-accepted
	c := dial()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "too_many_connections") {
		t.Fatalf("refusal: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if refused.Load() != 1 || ln.Open() != 2 {
		t.Fatalf("refused %d, open %d", refused.Load(), ln.Open())
	}
	sa.Close()
	sa.Close() // twice: one place back
	if ln.Open() != 1 {
		t.Fatalf("open %d after a close", ln.Open())
	}
	dial()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("a connection under the cap again was not accepted")
	}
	sb.Close()
}

// TestPromptSizeCheckedAtAdmission: a prompt that cannot fit the model's
// registered context is refused by bytes (no tokenizing) or by tokens,
// naming the parameter; one that fits is kept encoded for the run.
func TestPromptSizeCheckedAtAdmission(t *testing.T) {
	s := &Server{router: route.NewRouter()}
	body := func(prompt string, maxTokens int) CompletionRequest {
		return CompletionRequest{Model: "m", Prompt: prompt, MaxTokens: &maxTokens}
	}
	b := body(strings.Repeat("word ", 200_000), 4)
	if err := s.checkPromptSize(&b, false); err != nil {
		t.Fatalf("no registered context: %v", err) // the worker's to say
	}
	s.router.Update(route.Instance{ID: "i", Generation: 1, Model: "m", Ready: true, ContextLen: 512, TokenizerHash: tokenizer.NewBuiltin().Hash()})
	for _, c := range []struct {
		name  string
		b     CompletionRequest
		chat  bool
		param string
	}{
		{"1 MB", body(strings.Repeat("word ", 200_000), 4), false, "prompt"},
		{"1 MB chat", body(strings.Repeat("word ", 200_000), 4), true, "messages"},
		{"tokens", body(strings.Repeat("\x01", 600), 4), false, "prompt"},
		{"max_tokens", body("hello", 600), false, "max_tokens"},
		{"ids", CompletionRequest{Model: "m", PromptTokens: make([]int, 600)}, false, "prompt"},
		{"batch", CompletionRequest{Model: "m", Batch: []BatchPrompt{{Prompt: "a"}, {Prompt: strings.Repeat("word ", 10_000)}}}, false, "prompt[1]"},
	} {
		var pe *ParamError
		if err := s.checkPromptSize(&c.b, c.chat); !errors.As(err, &pe) || pe.Param != c.param || pe.Code != CodeContextLengthExceeded {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	ok := body("hello there", 16)
	if err := s.checkPromptSize(&ok, false); err != nil || ok.tokenized == nil || ok.tokenized.text != ok.Prompt {
		t.Fatalf("fits: %v %+v", err, ok.tokenized)
	}
}
