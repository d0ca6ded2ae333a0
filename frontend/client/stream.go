package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// session is one stream's state across reconnections: where it is, what
// it was given at the start, and what it has delivered.
type session struct {
	c     *Client
	id    string
	token string
	// at is the index of the URL that served the last request; owner, when
	// set, is where a frontend said the stream is now (used once).
	at    int
	owner string
	last  int
	// multi tracks a stream of several choices (nil: one).
	multi *choices
}

// start posts the request, to the preferred URL first and on to the next
// while a frontend cannot be reached or refuses with a status another
// frontend may not (5xx), within MaxReconnects. A POST that reached a
// frontend is never re-sent to the same one, and never as 0-RTT early data.
func (c *Client) start(ctx context.Context, body []byte) (*session, *http.Response, error) {
	n := len(c.URLs)
	first := int(c.preferred.Load()) % n
	// took are the frontends that read the POST and gave no answer: each
	// may have admitted it, so it is never sent there again.
	took := map[string]bool{}
	for attempt := 0; ; attempt++ {
		at := (first + attempt) % n
		for k := 0; k < n && took[c.URLs[at]]; k++ {
			at = (at + 1) % n
		}
		if took[c.URLs[at]] {
			return nil, nil, fmt.Errorf("lifeline: every frontend took the request and gave no answer")
		}
		if attempt > 0 {
			if err := backoff(ctx, attempt-1); err != nil {
				return nil, nil, err
			}
			if prev := (first + attempt - 1) % n; c.URLs[at] != c.URLs[prev] {
				c.stats.failovers.Add(1)
			}
		}
		resp, err := c.do(ctx, http.MethodPost, c.URLs[at], "/v1/completions", body, nil)
		if err == nil && resp.StatusCode == http.StatusOK {
			c.preferred.Store(int64(at))
			return &session{c: c, at: at, id: resp.Header.Get("Lifeline-Request-Id"), token: resp.Header.Get("Lifeline-Resume-Token")}, resp, nil
		}
		if err == nil {
			err = readError(resp)
			resp.Body.Close()
		}
		// With one URL there is nowhere else to go: the error as it is.
		if n == 1 || ctx.Err() != nil || !startElsewhere(err) {
			return nil, nil, err
		}
		if !isDialError(err) && !isTyped(err) {
			took[c.URLs[at]] = true
		}
		if attempt >= c.MaxReconnects {
			return nil, nil, fmt.Errorf("lifeline: no frontend took the request after %d attempts: %w", attempt+1, err)
		}
	}
}

// isTyped says whether err is a frontend's answer (an HTTP error).
func isTyped(err error) bool {
	var typed *Error
	return errors.As(err, &typed)
}

// startElsewhere tells a POST failure another frontend may not have: the
// frontend could not be reached, it refused with a 5xx (it is stopping,
// or sees no capacity), or it took the request and died before it
// answered (the connection closed with no response). In that last case
// the dead frontend may have admitted it; but its caller saw no token
// of it, so starting it elsewhere neither loses nor repeats one (a
// seeded request streams the same tokens), as the OpenAI SDKs retry a
// request whose connection broke; it is never sent to that frontend
// again (start). What the dead one started ends at its max_tokens, or
// when the worker finds its client gone.
func startElsewhere(err error) bool {
	var typed *Error
	if errors.As(err, &typed) {
		return typed.Status >= 500
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// follow reads the stream to its end, resuming on the next URL (or the
// one a frontend named) whenever it breaks.
func (s *session) follow(ctx context.Context, resp *http.Response, each func(Token)) (Result, error) {
	c := s.c
	var err error
	for attempt := 0; ; attempt++ {
		if resp != nil {
			var res Result
			body := watchIdle(resp.Body, c.opts.ReadIdle)
			if s.multi != nil {
				res, err = s.multi.read(body, each)
			} else {
				res, err = readStream(body, &s.last, each)
			}
			body.Close()
			if err == nil {
				return res, nil
			}
		}
		// err says why the stream broke, or why the last resume request
		// got no stream.
		var typed *Error
		if errors.As(err, &typed) && !resumeElsewhere(typed, len(c.URLs)) || ctx.Err() != nil {
			return Result{}, err
		}
		if typed != nil && typed.OwnerURL != "" {
			s.owner = typed.OwnerURL
		}
		if attempt >= c.MaxReconnects {
			return Result{}, fmt.Errorf("lifeline: stream %s: gave up after %d reconnections: %w", s.id, attempt, err)
		}
		if err := backoff(ctx, attempt); err != nil {
			return Result{}, err
		}
		resp, err = s.resume(ctx)
	}
}

// resume asks the next frontend for the stream after s.last: the owner a
// frontend named if any, else the URL after the current one. It returns
// the response only when it is the stream (200).
func (s *session) resume(ctx context.Context) (*http.Response, error) {
	c := s.c
	url := s.owner
	if url == "" {
		next := (s.at + 1) % len(c.URLs)
		url = c.URLs[next]
		if c.URLs[next] != c.URLs[s.at] {
			c.stats.failovers.Add(1)
		}
		s.at = next
	} else {
		c.stats.failovers.Add(1)
		// Past the owner on the next round: if it is the one that
		// died, the round robin does not come back to it at once.
		if i := slices.Index(c.URLs, url); i >= 0 {
			s.at = i
		}
	}
	s.owner = ""
	h := http.Header{}
	h.Set("Authorization", "Bearer "+s.token)
	switch {
	case s.multi == nil:
		h.Set("Last-Event-ID", strconv.Itoa(s.last))
	case s.multi.id != "":
		h.Set("Last-Event-ID", s.multi.id)
	}
	c.stats.resumes.Add(1)
	resp, err := c.do(ctx, http.MethodGet, url, "/v1/streams/"+s.id, nil, h)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

// resumeElsewhere tells a typed error another attempt may cure: a
// frontend that is stopping, overloaded or not the stream's owner (5xx,
// 409, 421, 425 Too Early, 429), or one that does not know the stream
// (404) while another URL may.
func resumeElsewhere(e *Error, urls int) bool {
	switch e.Status {
	case http.StatusOK: // an error event in the stream
		switch e.Type {
		case "frontend_stopping", "taken_over", "not_owner":
			return true
		}
		return false
	case http.StatusNotFound:
		return urls > 1 || e.OwnerURL != ""
	case http.StatusConflict, http.StatusMisdirectedRequest, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return e.Status >= 500 || e.OwnerURL != ""
}

// backoff waits 20 ms × 2^attempt (capped at 64×) plus up to as much
// again of jitter.
func backoff(ctx context.Context, attempt int) error {
	wait := time.Duration(1<<min(attempt, 6)) * 20 * time.Millisecond
	wait += time.Duration(rand.Int64N(int64(wait)))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
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
			return Result{}, &Error{Status: http.StatusOK, Type: ev.Error.Type, Message: ev.Error.Message, OwnerURL: ownerOf(ev.Data)}
		}
		c := ev.Chunk
		if c.Usage != nil {
			continue // the usage chunk (stream_options.include_usage)
		}
		if f := c.Finish(); f != "" {
			res.FinishReason = f
		}
		seq := c.Lifeline.SequenceNo
		if seq == 0 {
			res.Migrations, res.LastMigration = c.Lifeline.Migrations, c.Lifeline.LastMigration
			res.KVReusedPositions, res.RequestID = c.Lifeline.KVReusedPositions, c.Lifeline.RequestID
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

// errorBody is the OpenAI error shape, with the owner a frontend may name.
type errorBody struct {
	Error struct {
		Type, Message string
		OwnerURL      string `json:"owner_url"`
	}
}

// ownerOf reads owner_url from an error event's data.
func ownerOf(data []byte) string {
	var b errorBody
	json.Unmarshal(data, &b)
	return b.Error.OwnerURL
}

func readError(resp *http.Response) error {
	var body errorBody
	json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body)
	e := &Error{Status: resp.StatusCode, Type: body.Error.Type, Message: body.Error.Message, OwnerURL: body.Error.OwnerURL}
	if u := resp.Header.Get("Lifeline-Owner-URL"); u != "" {
		e.OwnerURL = u
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}

// ErrReadIdle: a stream sent nothing, not even a keep-alive comment, for
// Options.ReadIdle; the client resumes it elsewhere.
var ErrReadIdle = errors.New("lifeline: the stream sent nothing for too long (connection taken for cut)")

// idleBody is a response body closed once a read has waited longer than
// d for data (a silently cut connection), which ends the read with
// ErrReadIdle.
type idleBody struct {
	body io.ReadCloser
	d    time.Duration
	t    *time.Timer
	idle atomic.Bool
}

// watchIdle returns body under a read-idle bound of d (body itself when
// d < 0).
func watchIdle(body io.ReadCloser, d time.Duration) io.ReadCloser {
	if d < 0 {
		return body
	}
	b := &idleBody{body: body, d: d}
	b.t = time.AfterFunc(d, func() {
		b.idle.Store(true)
		body.Close()
	})
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if n > 0 {
		b.t.Reset(b.d)
	}
	if err != nil && b.idle.Load() {
		err = fmt.Errorf("%w: %v", ErrReadIdle, b.d)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.t.Stop()
	return b.body.Close()
}
