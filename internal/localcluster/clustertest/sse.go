package clustertest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
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
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	var toks []Token
	var last map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices  []struct{ Text string }
			Lifeline struct {
				SequenceNo int    `json:"sequence_no"`
				TokenID    int    `json:"token_id"`
				InstanceID string `json:"instance_id"`
			}
		}
		json.Unmarshal([]byte(data), &chunk)
		if chunk.Lifeline.SequenceNo == 0 {
			json.Unmarshal([]byte(data), &last)
			continue
		}
		tok := Token{chunk.Lifeline.SequenceNo, chunk.Lifeline.TokenID, chunk.Choices[0].Text, chunk.Lifeline.InstanceID}
		toks = append(toks, tok)
		if each != nil {
			each(tok)
		}
	}
	return toks, last
}

// ReadSSE reads tokens from an SSE body until stop returns true or the
// stream ends.
func ReadSSE(t testing.TB, r io.Reader, stop func(Token) bool) []Token {
	t.Helper()
	var toks []Token
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices  []struct{ Text string }
			Lifeline struct {
				SequenceNo int `json:"sequence_no"`
				TokenID    int `json:"token_id"`
			}
		}
		json.Unmarshal([]byte(data), &chunk)
		if chunk.Lifeline.SequenceNo == 0 {
			continue
		}
		tok := Token{Seq: chunk.Lifeline.SequenceNo, TokenID: chunk.Lifeline.TokenID, Text: chunk.Choices[0].Text}
		toks = append(toks, tok)
		if stop != nil && stop(tok) {
			break
		}
	}
	return toks
}

// Metrics returns the frontend's Prometheus metrics page.
func Metrics(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
