package sse

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxLine bounds one line of a stream (its terminator not counted): a
// reader never buffers more than this for a peer that sends no newline.
const MaxLine = 1 << 20

// ErrMalformed is wrapped by every error about a stream's contents, as
// opposed to the reading of it.
var ErrMalformed = errors.New("sse: malformed stream")

// Event is one event of a stream: exactly one of Chunk and Error is set.
type Event struct {
	// ID is the event's id field: a token's sequence number, "" on the
	// end chunk and the error event.
	ID string
	// Type is the event's event field ("" for the default, message).
	Type string
	// Data is the event's data as sent (JSON), for callers that look past
	// the typed fields.
	Data  []byte
	Chunk *Chunk
	Error *Error
}

// Reader reads a stream's events. Lines end with "\n" or "\r\n"; comments
// (lines that start with ":") and fields other than id, event and data
// are skipped, as the SSE standard has it.
type Reader struct {
	br   *bufio.Reader
	max  int
	line int // lines read, for errors
	buf  []byte
	done bool
}

// NewReader returns a reader of the stream r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 64<<10), max: MaxLine}
}

// Next returns the next event. It returns io.EOF once the stream has ended
// with [DONE], io.ErrUnexpectedEOF if it ends before, an error wrapping
// ErrMalformed for contents that are not a stream of chunks, and the
// underlying reader's error otherwise.
func (r *Reader) Next() (Event, error) {
	if r.done {
		return Event{}, io.EOF
	}
	var ev Event
	var data []byte
	hasData, at := false, 0
	for {
		line, err := r.readLine()
		if err != nil {
			return Event{}, err
		}
		if len(line) == 0 { // the blank line that ends an event
			if !hasData {
				ev = Event{} // an event without data is not dispatched
				continue
			}
			return r.event(ev, data, at)
		}
		if line[0] == ':' {
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(name) {
		case "id":
			ev.ID = string(value)
		case "event":
			ev.Type = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			} else {
				at = r.line
			}
			data, hasData = append(data, value...), true
		}
	}
}

// event decodes an event's data, which began on line at.
func (r *Reader) event(ev Event, data []byte, at int) (Event, error) {
	if string(data) == Done {
		r.done = true
		return Event{}, io.EOF
	}
	ev.Data = data
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
		return Event{}, fmt.Errorf("%w: line %d: data is not a JSON object: %.64q", ErrMalformed, at, data)
	}
	var v struct {
		Chunk
		Error *Error `json:"error"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return Event{}, fmt.Errorf("%w: line %d: %v", ErrMalformed, at, err)
	}
	if v.Error != nil {
		ev.Error = v.Error
	} else {
		ev.Chunk = &v.Chunk
	}
	return ev, nil
}

// readLine returns the next line without its terminator, valid until the
// next call.
func (r *Reader) readLine() ([]byte, error) {
	r.buf = r.buf[:0]
	for {
		frag, err := r.br.ReadSlice('\n')
		r.buf = append(r.buf, frag...)
		if err == nil {
			r.line++
			line := bytes.TrimSuffix(r.buf[:len(r.buf)-1], []byte("\r"))
			if len(line) > r.max {
				return nil, r.tooLong()
			}
			return line, nil
		}
		if len(r.buf) > r.max+1 { // not even a "\r" before the "\n" to come
			return nil, r.tooLong()
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF) && len(r.buf) > r.max:
			return nil, r.tooLong()
		case errors.Is(err, io.EOF):
			return nil, io.ErrUnexpectedEOF // a stream ends with [DONE], never mid-line or mid-event
		default:
			return nil, fmt.Errorf("sse: read: %w", err)
		}
	}
}

func (r *Reader) tooLong() error {
	return fmt.Errorf("%w: line %d: longer than %d bytes", ErrMalformed, r.line+1, r.max)
}
