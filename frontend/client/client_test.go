package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
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
		Lifeline: sse.Lifeline{RequestID: "cmpl-1", Migrations: 1, LastMigration: map[string]int64{"routed_unix_ns": 5}}}
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
	if res.FinishReason != "length" || res.Migrations != 1 || res.LastMigration["routed_unix_ns"] != 5 {
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
