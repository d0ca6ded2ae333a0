package client

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// writeChoice writes choice i's token seq, with the event id of pos (i at
// seq), as the frontend does for several choices.
func writeChoice(w *sse.Writer, pos []int, i, seq int) {
	pos[i] = seq
	text := fmt.Sprint(" c", i, "t", seq)
	c := sse.Chunk{ID: "cmpl-1-c2", Object: "text_completion", Model: "m", Lifeline: sse.Lifeline{RequestID: "cmpl-1-c2", SequenceNo: seq, TokenID: seq}}
	c.Choices[0].Index, c.Choices[0].Text = i, &text
	w.WriteChunkID(&c, sse.FormatPositions(pos))
}

func writeChoiceEnd(w *sse.Writer, pos []int, i int, finish string) {
	pos[i]++
	empty := ""
	c := sse.Chunk{ID: "cmpl-1-c2", Object: "text_completion", Model: "m", Lifeline: sse.Lifeline{RequestID: "cmpl-1-c2", Migrations: i}}
	c.Choices[0].Index, c.Choices[0].Text, c.Choices[0].FinishReason = i, &empty, &finish
	w.WriteChunkID(&c, sse.FormatPositions(pos))
}

// TestStreamChoicesResume: a stream of two choices breaks; the client
// resumes with the last event's id (both choices' positions), drops what
// it already had of each choice, and delivers every token of each choice
// once, in order, with both finish reasons.
func TestStreamChoicesResume(t *testing.T) {
	var resumedAfter atomic.Value
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lifeline-Request-Id", "cmpl-1-c2")
		w.Header().Set("Lifeline-Resume-Token", "tok")
		sw := sse.NewWriter(w)
		pos := []int{0, 0}
		writeChoice(sw, pos, 0, 1)
		writeChoice(sw, pos, 1, 1)
		writeChoice(sw, pos, 1, 2)
		writeChoiceEnd(sw, pos, 1, "stop") // choice 1 done at 2 tokens: id 1.3
		writeChoice(sw, pos, 0, 2)         // id 2.3; then the connection breaks
	})
	mux.HandleFunc("GET /v1/streams/{id}", func(w http.ResponseWriter, r *http.Request) {
		resumedAfter.Store(r.Header.Get("Last-Event-ID"))
		sw := sse.NewWriter(w)
		pos := []int{1, 3}
		writeChoice(sw, pos, 0, 2) // a duplicate to drop
		writeChoice(sw, pos, 0, 3)
		writeChoiceEnd(sw, pos, 0, "length")
		sw.WriteDone()
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	got := map[int][]int{}
	res, err := New(srv.URL).Stream(context.Background(), Request{Model: "m", Prompt: "p", MaxTokens: 3, N: 2}, func(tok Token) {
		if want := fmt.Sprint(" c", tok.Index, "t", tok.SequenceNo); tok.Text != want {
			t.Errorf("token %+v, want text %q", tok, want)
		}
		got[tok.Index] = append(got[tok.Index], tok.SequenceNo)
	})
	if err != nil {
		t.Fatal(err)
	}
	if resumedAfter.Load() != "2.3" {
		t.Fatalf("resumed after %v, want 2.3", resumedAfter.Load())
	}
	if fmt.Sprint(got[0]) != "[1 2 3]" || fmt.Sprint(got[1]) != "[1 2]" {
		t.Fatalf("tokens %v", got)
	}
	if res.FinishReasons[0] != "length" || res.FinishReasons[1] != "stop" || res.FinishReason != "length" || res.Migrations != 1 {
		t.Fatalf("result %+v", res)
	}
}
