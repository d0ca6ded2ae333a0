package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// writeTokens writes tokens from..to of a stream as the frontend does.
func writeTokens(w *sse.Writer, from, to int) {
	for seq := from; seq <= to; seq++ {
		text := fmt.Sprint(" t", seq)
		c := sse.Chunk{ID: "cmpl-1", Object: "text_completion", Model: "m",
			Lifeline: sse.Lifeline{RequestID: "cmpl-1", SequenceNo: seq, TokenID: 100 + seq, InstanceID: "i" + strconv.Itoa(seq/3)}}
		c.Choices[0].Text = &text
		w.WriteChunk(&c)
	}
}

func writeEnd(w *sse.Writer) {
	finish, empty := "length", ""
	c := sse.Chunk{ID: "cmpl-1", Object: "text_completion", Model: "m",
		Lifeline: sse.Lifeline{RequestID: "cmpl-1", Migrations: 1, KVReusedPositions: 48, LastMigration: map[string]int64{"routed_unix_ns": 5}}}
	c.Choices[0].Text, c.Choices[0].FinishReason = &empty, &finish
	w.WriteChunk(&c)
	w.WriteDone()
}

// TestStreamResumes: the first connection breaks after three tokens; the
// client resumes after the last one it saw, drops the replayed duplicate,
// and reports every token once, in order, and the end chunk's result.
func TestStreamResumes(t *testing.T) {
	var resumedAfter atomic.Value
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lifeline-Request-Id", "cmpl-1")
		w.Header().Set("Lifeline-Resume-Token", "tok")
		sw := sse.NewWriter(w)
		sw.WriteComment("lifeline")
		writeTokens(sw, 1, 3)
		// The connection breaks: no end, no [DONE].
	})
	mux.HandleFunc("GET /v1/streams/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "cmpl-1" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "bad resume", http.StatusUnauthorized)
			return
		}
		resumedAfter.Store(r.Header.Get("Last-Event-ID"))
		sw := sse.NewWriter(w)
		writeTokens(sw, 3, 5) // 3 again: a duplicate to drop
		writeEnd(sw)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var got []Token
	res, err := New(srv.URL).Stream(context.Background(), Request{Model: "m", Prompt: "p", MaxTokens: 5}, func(tok Token) { got = append(got, tok) })
	if err != nil {
		t.Fatal(err)
	}
	if resumedAfter.Load() != "3" {
		t.Fatalf("resumed after %v", resumedAfter.Load())
	}
	if len(got) != 5 {
		t.Fatalf("tokens %+v", got)
	}
	for i, tok := range got {
		if tok.SequenceNo != i+1 || tok.TokenID != 101+i || tok.Text != fmt.Sprint(" t", i+1) || tok.Instance != "i"+strconv.Itoa((i+1)/3) {
			t.Fatalf("token %d: %+v", i, tok)
		}
	}
	if res.FinishReason != "length" || res.Migrations != 1 || res.LastMigration["routed_unix_ns"] != 5 || res.KVReusedPositions != 48 || res.RequestID != "cmpl-1" {
		t.Fatalf("result %+v", res)
	}
}

// TestStreamTypedErrors: an error event ends the stream with the
// frontend's typed error; a refusal before streaming is an HTTP status.
func TestStreamTypedErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		sw := sse.NewWriter(w)
		writeTokens(sw, 1, 2)
		sw.WriteError(sse.Error{Message: "3 migrations used", Type: "migration_exhausted"})
		sw.WriteDone()
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	n := 0
	_, err := New(srv.URL).Stream(context.Background(), Request{Model: "m"}, func(Token) { n++ })
	var typed *Error
	if !errors.As(err, &typed) || typed.Type != "migration_exhausted" || typed.Status != http.StatusOK || n != 2 {
		t.Fatalf("%v after %d tokens", err, n)
	}

	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"busy","type":"overloaded","code":"overloaded"}}`)
	}))
	defer refuse.Close()
	_, err = New(refuse.URL).Stream(context.Background(), Request{Model: "m"}, func(Token) {})
	if !errors.As(err, &typed) || typed.Type != "overloaded" || typed.Status != http.StatusTooManyRequests || typed.RetryAfter.Seconds() != 1 {
		t.Fatalf("refusal: %v", err)
	}
}

// TestStreamGap: a stream that skips a sequence number is an error, not
// silently lost tokens.
func TestStreamGap(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := sse.NewWriter(w)
		writeTokens(sw, 1, 1)
		writeTokens(sw, 3, 3)
		writeEnd(sw)
	}))
	defer srv.Close()
	c := New(srv.URL)
	c.MaxReconnects = 0
	_, err := c.Stream(context.Background(), Request{Model: "m"}, func(Token) {})
	if err == nil || !strings.Contains(err.Error(), "sequence gap: 3 after 1") {
		t.Fatalf("gap: %v", err)
	}
}

// TestStreamFailsOverAndFollowsTheOwner: the stream breaks on A; the next
// URL, B, answers 409 naming C as the stream's owner; the client resumes
// on C with the token A gave, after the last token it saw, and delivers
// every token once.
func TestStreamFailsOverAndFollowsTheOwner(t *testing.T) {
	var resumedOnC atomic.Value
	c := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "bad resume", http.StatusUnauthorized)
			return
		}
		resumedOnC.Store(r.Header.Get("Last-Event-ID"))
		sw := sse.NewWriter(w)
		writeTokens(sw, 4, 6)
		writeEnd(sw)
	}))
	defer c.Close()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lifeline-Owner-URL", c.URL)
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"error":{"message":"owned by another frontend","type":"taken_over"}}`)
	}))
	defer b.Close()
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lifeline-Request-Id", "cmpl-1")
		w.Header().Set("Lifeline-Resume-Token", "tok")
		writeTokens(sse.NewWriter(w), 1, 3)
	}))
	defer a.Close()
	cl := New(a.URL, b.URL)
	var got []int
	if _, err := cl.Stream(context.Background(), Request{Model: "m"}, func(tok Token) { got = append(got, tok.SequenceNo) }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[1 2 3 4 5 6]" || resumedOnC.Load() != "3" {
		t.Fatalf("tokens %v, resumed on C after %v", got, resumedOnC.Load())
	}
	if st := cl.Stats(); st.Resumes != 2 || st.Failovers != 2 {
		t.Fatalf("stats %+v: want two resumes (B, C), both elsewhere", st)
	}
}

// TestStartSkipsADeadURL: nothing listens at the first URL; the POST goes
// to the second, and the next stream starts there.
func TestStartSkipsADeadURL(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := sse.NewWriter(w)
		writeTokens(sw, 1, 2)
		writeEnd(sw)
	}))
	defer live.Close()
	cl := New(dead.URL, live.URL)
	for range 2 {
		n := 0
		if _, err := cl.Stream(context.Background(), Request{Model: "m"}, func(Token) { n++ }); err != nil || n != 2 {
			t.Fatalf("%v after %d tokens", err, n)
		}
	}
	if st := cl.Stats(); st.Failovers != 1 {
		t.Fatalf("stats %+v: want one failover (the second stream starts on the live URL)", st)
	}
	// With one URL a refusal to connect is the error, at once.
	if _, err := New(dead.URL).Stream(context.Background(), Request{Model: "m"}, func(Token) {}); err == nil {
		t.Fatal("a dead single URL streamed")
	}
}

// TestStartElsewhereWhenAFrontendDiesBeforeItAnswers: a frontend that
// read the request and closed its connection with no response (SIGKILLed
// as it admitted it) is a request the caller saw nothing of: the client
// starts it on the next URL instead of failing with EOF.
func TestStartElsewhereWhenAFrontendDiesBeforeItAnswers(t *testing.T) {
	var took atomic.Int32
	dying := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		took.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close()
	}))
	defer dying.Close()
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := sse.NewWriter(w)
		writeTokens(sw, 1, 3)
		writeEnd(sw)
	}))
	defer live.Close()
	var seqs []int
	if _, err := New(dying.URL, live.URL).Stream(context.Background(), Request{Model: "m"}, func(tk Token) { seqs = append(seqs, tk.SequenceNo) }); err != nil {
		t.Fatalf("%v after %v", err, seqs)
	}
	if took.Load() != 1 || !slices.Equal(seqs, []int{1, 2, 3}) {
		t.Fatalf("the dying frontend took %d requests; tokens %v, want 1 and [1 2 3]", took.Load(), seqs)
	}
	// A frontend that took the POST is never sent it again: with the
	// other one refusing (503) too, the client gives up after one POST
	// to the dying one, not one every other attempt.
	took.Store(0)
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"busy","type":"overloaded"}}`, http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	if _, err := NewWith(Options{MaxReconnects: 4}, dying.URL, busy.URL).Stream(context.Background(), Request{Model: "m"}, func(Token) {}); err == nil || took.Load() != 1 {
		t.Fatalf("the dying frontend took %d POSTs (want 1); %v", took.Load(), err)
	}
	// Two frontends that both take the POST and die: each gets it once,
	// then the client says so instead of sending it again.
	took.Store(0)
	dying2 := httptest.NewServer(dying.Config.Handler)
	defer dying2.Close()
	if _, err := New(dying.URL, dying2.URL).Stream(context.Background(), Request{Model: "m"}, func(Token) {}); err == nil ||
		!strings.Contains(err.Error(), "every frontend took the request and gave no answer") || took.Load() != 2 {
		t.Fatalf("two dying frontends took %d POSTs (want 2): %v", took.Load(), err)
	}
	// A caller's own deadline is not a frontend's death: no retry.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New(dying.URL, live.URL).Stream(ctx, Request{Model: "m"}, func(Token) {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestParseAltSvcH3(t *testing.T) {
	for _, c := range []struct{ origin, header, want string }{
		{"127.0.0.1:8443", `h3=":8443"; ma=86400`, "127.0.0.1:8443"},
		{"example.com:443", `h3-29=":443", h3="alt.example.com:9443"; ma=60`, "alt.example.com:9443"},
		{"example.com:443", `h2=":443"`, ""},
		{"example.com:443", `h3=nonsense`, ""},
	} {
		got, _ := parseAltSvcH3(c.origin, c.header)
		if got != c.want {
			t.Errorf("%s %q: %q, want %q", c.origin, c.header, got, c.want)
		}
	}
}
