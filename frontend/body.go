package frontend

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// Request bodies are read under a byte bound and a deadline, so that a
// client can hold neither memory nor a connection with one: a body over
// the bound is a 413, found by its Content-Length before anything is
// read, else as the bound is crossed; a body that has not arrived by the
// deadline (a drip) is a 408. Either way the connection is closed after
// the answer (the rest of the body is not read).

// Error codes of the body's refusals.
const (
	CodeRequestTooLarge        = "request_too_large"
	CodeRequestTimeout         = "request_timeout"
	CodeUnsupportedContentType = "unsupported_media_type"
)

// BodyError is a request body refused before it was parsed.
type BodyError struct {
	Status int    // 413, 408 or 415
	Code   string // CodeRequestTooLarge, CodeRequestTimeout
	Msg    string
}

func (e *BodyError) Error() string { return e.Msg }

// checkContentType refuses a body that is not declared JSON (415). A form
// or text/plain body is what a web page on another origin can send
// without a CORS preflight; declared JSON it cannot.
func checkContentType(req *http.Request) error {
	ct := req.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err == nil && mt == "application/json" && (params["charset"] == "" || strings.EqualFold(params["charset"], "utf-8")) {
		return nil
	}
	if ct == "" {
		ct = "none"
	}
	return &BodyError{Status: http.StatusUnsupportedMediaType, Code: CodeUnsupportedContentType,
		Msg: fmt.Sprintf("Content-Type %q: send the body as JSON with Content-Type: application/json", ct)}
}

// readBody reads req's body under the limits.
func (s *Server) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	if err := checkContentType(req); err != nil {
		return nil, err
	}
	lim := s.limits
	rc := http.NewResponseController(w)
	// The deadline stays when the body is refused: the server may read
	// what is left of it (to reuse the connection), and must not wait on
	// a drip for that either.
	timed := !lim.Off && rc.SetReadDeadline(time.Now().Add(lim.BodyTimeout)) == nil
	if req.ContentLength > lim.MaxBodyBytes {
		return nil, tooLarge(lim.MaxBodyBytes)
	}
	data, err := readAll(http.MaxBytesReader(w, req.Body, lim.MaxBodyBytes), req.ContentLength)
	if timed && err == nil {
		// Off again at once: a streamed response's connection keeps
		// reading (the client's close), and a deadline left behind would
		// end the stream.
		rc.SetReadDeadline(time.Time{})
	}
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case err == nil:
		return data, nil
	case errors.As(err, &mbe):
		return nil, tooLarge(mbe.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return nil, &BodyError{Status: http.StatusRequestTimeout, Code: CodeRequestTimeout,
			Msg: fmt.Sprintf("the body did not arrive within %v", lim.BodyTimeout)}
	}
	return nil, fmt.Errorf("reading the body: %w", err)
}

// readAll reads r whole: into one buffer of the body's declared size, or
// (chunked) in pieces joined at the end. io.ReadAll grows a large buffer
// by a quarter at a time and bytes.Buffer doubles it; either leaves a
// multiple of a refused body behind, and 50 refused at once are hundreds
// of MB. Here a refused body costs what was read of it.
func readAll(r io.Reader, size int64) ([]byte, error) {
	if size >= 0 {
		b := make([]byte, 0, size+1) // +1: the read that finds EOF
		for {
			n, err := r.Read(b[len(b):cap(b)])
			b = b[:len(b)+n]
			if err == io.EOF {
				return b, nil
			}
			if err != nil {
				return nil, err
			}
			if len(b) == cap(b) {
				b = append(b, 0)[:len(b)] // more than declared: MaxBytesReader decides
			}
		}
	}
	var pieces [][]byte
	for {
		p := make([]byte, 32<<10)
		n, err := io.ReadFull(r, p)
		pieces = append(pieces, p[:n])
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return bytes.Join(pieces, nil), nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func tooLarge(limit int64) *BodyError {
	return &BodyError{Status: http.StatusRequestEntityTooLarge, Code: CodeRequestTooLarge,
		Msg: fmt.Sprintf("the body is larger than %d bytes", limit)}
}

// writeBodyError answers a refused body. An HTTP/1 connection is closed
// after it: the server would otherwise read the unread rest (a drip, for
// as long as it drips) to find the next request. HTTP/2 and HTTP/3 reset
// the stream alone.
func (s *Server) writeBodyError(w http.ResponseWriter, req *http.Request, e *BodyError) {
	s.metrics.refused.WithLabelValues(e.Code).Inc()
	if req.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	writeErrorBody(w, e.Status, openai.ErrInvalidRequest, e.Code, "", e.Msg)
}

// admit reads, parses and checks a completion request: everything that
// can refuse it before it is run.
func (s *Server) admit(w http.ResponseWriter, req *http.Request, chat bool) (CompletionRequest, error) {
	data, err := s.readBody(w, req)
	if err != nil {
		return CompletionRequest{}, err
	}
	body, err := decodeCompletion(data, req, chat)
	if err != nil {
		return body, err
	}
	return body, s.checkPromptSize(&body, chat)
}

// refuse answers a request admit refused.
func (s *Server) refuse(w http.ResponseWriter, req *http.Request, err error) {
	var be *BodyError
	if errors.As(err, &be) {
		s.writeBodyError(w, req, be)
		return
	}
	var pe *ParamError
	if errors.As(err, &pe) && pe.Code == CodeContextLengthExceeded {
		s.metrics.refused.WithLabelValues(pe.Code).Inc()
	}
	writeBadRequest(w, err)
}
