package clustertest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
)

// Token is one streamed token as a test sees it.
type Token struct {
	Seq      int
	TokenID  int
	Text     string
	Instance string
}

// StreamCompletion posts a streaming request and calls each(token) as SSE
// events arrive; it returns the tokens and the final chunk.
func StreamCompletion(t testing.TB, url string, body map[string]any, each func(Token)) ([]Token, map[string]any) {
	t.Helper()
	toks, last, err := Stream(url, body, each)
	if err != nil {
		t.Fatal(err)
	}
	return toks, last
}

// StreamCompletions streams every body at once and returns their tokens
// in order, failing the test on any error: fault-free reference runs,
// which a paced worker steps in one batch as fast as one stream.
func StreamCompletions(t testing.TB, url string, bodies []map[string]any) [][]Token {
	t.Helper()
	toks, errs := make([][]Token, len(bodies)), make([]error, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Go(func() { toks[i], _, errs[i] = Stream(url, b, nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return toks
}

// Stream is StreamCompletion for goroutines that must not fail the test:
// a request that is not answered 200 is an error.
func Stream(url string, body map[string]any, each func(Token)) ([]Token, map[string]any, error) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		return nil, nil, fmt.Errorf("status %d: %s", resp.StatusCode, msg)
	}
	var last map[string]any
	toks := readTokens(resp.Body, func(tok Token) bool {
		if each != nil {
			each(tok)
		}
		return false
	}, func(ev sse.Event) { json.Unmarshal(ev.Data, &last) })
	return toks, last, nil
}

// ReadSSE reads tokens from an SSE body until stop returns true or the
// stream ends.
func ReadSSE(t testing.TB, r io.Reader, stop func(Token) bool) []Token {
	t.Helper()
	return readTokens(r, stop, nil)
}

// readTokens reads SSE events with the frontend's own reader: token
// chunks go to each (which ends the reading by returning true), any other
// event to other. It stops at the end of the stream or at the first error
// (a cut connection).
func readTokens(r io.Reader, each func(Token) bool, other func(sse.Event)) []Token {
	var toks []Token
	rd := sse.NewReader(r)
	for {
		ev, err := rd.Next()
		if err != nil {
			return toks
		}
		if ev.Chunk == nil || ev.Chunk.Lifeline.SequenceNo == 0 {
			if other != nil {
				other(ev)
			}
			continue
		}
		l := ev.Chunk.Lifeline
		tok := Token{Seq: l.SequenceNo, TokenID: l.TokenID, Text: ev.Chunk.Content(), Instance: l.InstanceID}
		toks = append(toks, tok)
		if each != nil && each(tok) {
			return toks
		}
	}
}

// MetricsURL is the metrics listener's URL (http://host:port) of the
// frontend serving at url (http:// or https://), one this process started.
func MetricsURL(t testing.TB, url string) string {
	t.Helper()
	return known(t, "metrics listener", localcluster.MetricsURLOf, url)
}

// known is what of looks up for the frontend at url, or fails t.
func known(t testing.TB, what string, of func(string) (string, bool), url string) string {
	t.Helper()
	v, ok := of(url)
	if !ok {
		t.Fatalf("no %s known for the frontend at %s", what, url)
	}
	return v
}

// Debug is the debug socket's base ("unix:PATH") of the frontend serving
// at url, one this process started.
func Debug(t testing.TB, url string) string {
	t.Helper()
	return known(t, "debug socket", localcluster.DebugOf, url)
}

// Metrics returns the frontend's Prometheus metrics page, from its
// metrics listener.
func Metrics(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(MetricsURL(t, url) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
