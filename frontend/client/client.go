// Package client is the Go client of a Lifeline frontend: it streams
// completions, and when the connection breaks it reconnects with backoff and
// jitter, resumes after the last sequence number it saw (Last-Event-ID),
// drops duplicates, and surfaces the frontend's typed errors.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// Error is a typed error the frontend returned (OpenAI shape).
type Error struct {
	Status     int
	Type       string
	Message    string
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("lifeline: %s (%d): %s", e.Type, e.Status, e.Message)
}

// Request is a completion request.
type Request struct {
	Model       string   `json:"model"`
	Prompt      string   `json:"prompt"`
	MaxTokens   int      `json:"max_tokens"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	Seed        uint64   `json:"seed"`
	Stop        []string `json:"stop,omitempty"`
	IgnoreEOS   bool     `json:"ignore_eos,omitempty"`
}

// Token is one streamed token.
type Token struct {
	SequenceNo int
	TokenID    int
	Text       string
	Instance   string
}

// Result is what a finished stream reports besides its tokens.
type Result struct {
	FinishReason string
	// Migrations is how many times the frontend moved the request to
	// another worker; LastMigration is the timeline of the last move
	// (unix nanoseconds by step), nil when it never moved.
	Migrations    int
	LastMigration map[string]int64
}

// Client talks to one frontend.
type Client struct {
	URL  string
	HTTP *http.Client
	// MaxReconnects bounds reconnections of one stream (default 10).
	MaxReconnects int
}

// New returns a client of the frontend at url.
func New(url string) *Client {
	return &Client{URL: strings.TrimRight(url, "/"), HTTP: &http.Client{}, MaxReconnects: 10}
}

// Stream runs a resumable streaming completion and calls each for every
// token exactly once, in order, across reconnections.
func (c *Client) Stream(ctx context.Context, r Request, each func(Token)) (Result, error) {
	body, _ := json.Marshal(struct {
		Request
		Stream        bool           `json:"stream"`
		StreamOptions map[string]any `json:"stream_options"`
	}{r, true, map[string]any{"resumable": true}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Result{}, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return Result{}, readError(resp)
	}
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	last := 0
	for attempt := 0; ; attempt++ {
		res, err := readStream(resp.Body, &last, each)
		resp.Body.Close()
		if err == nil {
			return res, nil
		}
		var typed *Error
		if errors.As(err, &typed) || ctx.Err() != nil {
			return Result{}, err
		}
		if attempt >= c.MaxReconnects {
			return Result{}, fmt.Errorf("lifeline: stream %s: gave up after %d reconnections: %w", id, attempt, err)
		}
		// Exponential backoff with jitter, then resume after `last`.
		wait := time.Duration(1<<min(attempt, 6)) * 20 * time.Millisecond
		wait += time.Duration(rand.Int64N(int64(wait)))
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(wait):
		}
		rreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/v1/streams/"+id, nil)
		rreq.Header.Set("Authorization", "Bearer "+token)
		rreq.Header.Set("Last-Event-ID", strconv.Itoa(last))
		if resp, err = c.HTTP.Do(rreq); err != nil {
			resp = &http.Response{Body: io.NopCloser(strings.NewReader(""))}
			continue
		}
		if resp.StatusCode != http.StatusOK {
			defer resp.Body.Close()
			return Result{}, readError(resp)
		}
	}
}

// readStream reads SSE events, delivering tokens after *last; it returns
// the end chunk's result at the end of the stream, or an error if the stream
// broke before its end (io.ErrUnexpectedEOF) or ended with a typed error.
func readStream(body io.Reader, last *int, each func(Token)) (Result, error) {
	rd := sse.NewReader(body)
	var res Result
	for {
		ev, err := rd.Next()
		switch {
		case err == io.EOF: // [DONE]
			return res, nil
		case err != nil:
			return Result{}, err
		case ev.Error != nil:
			return Result{}, &Error{Status: http.StatusOK, Type: ev.Error.Type, Message: ev.Error.Message}
		}
		c := ev.Chunk
		if f := c.Finish(); f != "" {
			res.FinishReason = f
		}
		seq := c.Lifeline.SequenceNo
		if seq == 0 {
			res.Migrations, res.LastMigration = c.Lifeline.Migrations, c.Lifeline.LastMigration
			continue // the end chunk
		}
		if seq <= *last {
			continue // a duplicate after a resume
		}
		if seq != *last+1 {
			return Result{}, fmt.Errorf("lifeline: sequence gap: %d after %d", seq, *last)
		}
		*last = seq
		each(Token{SequenceNo: seq, TokenID: c.Lifeline.TokenID, Text: c.Content(), Instance: c.Lifeline.InstanceID})
	}
}

func readError(resp *http.Response) error {
	var body struct {
		Error struct{ Type, Message string }
	}
	json.NewDecoder(resp.Body).Decode(&body)
	e := &Error{Status: resp.StatusCode, Type: body.Error.Type, Message: body.Error.Message}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}
