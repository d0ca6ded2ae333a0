package client

import (
	"fmt"
	"io"
	"net/http"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// choices is where a stream of several choices is, across reconnections:
// each choice's last sequence number delivered, the id of the last event
// read (every choice's position: what a resume sends as Last-Event-ID),
// and what the finished choices reported.
type choices struct {
	last []int
	id   string
	res  Result
}

func newChoices(n int) *choices {
	return &choices{last: make([]int, n), res: Result{FinishReasons: make([]string, n)}}
}

// read reads one connection's events, delivering each choice's tokens
// after its last one exactly once; the result once the stream ended, or
// why it broke.
func (m *choices) read(body io.Reader, each func(Token)) (Result, error) {
	rd := sse.NewReader(body)
	for {
		ev, err := rd.Next()
		switch {
		case err == io.EOF: // [DONE]
			m.res.FinishReason = m.res.FinishReasons[0]
			return m.res, nil
		case err != nil:
			return Result{}, err
		case ev.Error != nil:
			return Result{}, &Error{Status: http.StatusOK, Type: ev.Error.Type, Message: ev.Error.Message, OwnerURL: ownerOf(ev.Data)}
		}
		c := ev.Chunk
		if c.Usage != nil {
			continue
		}
		i := c.Choices[0].Index
		if i < 0 || i >= len(m.last) {
			return Result{}, fmt.Errorf("lifeline: choice %d of a stream of %d", i, len(m.last))
		}
		if err := m.take(c, i, each); err != nil {
			return Result{}, err
		}
		if ev.ID != "" {
			m.id = ev.ID
		}
	}
}

// take delivers choice i's chunk c unless it was delivered before.
func (m *choices) take(c *sse.Chunk, i int, each func(Token)) error {
	if f := c.Finish(); f != "" {
		if m.res.FinishReasons[i] == "" {
			m.res.FinishReasons[i] = f
			m.res.Migrations += c.Lifeline.Migrations
			m.res.KVReusedPositions += c.Lifeline.KVReusedPositions
			if c.Lifeline.LastMigration != nil {
				m.res.LastMigration = c.Lifeline.LastMigration
			}
		}
		return nil
	}
	seq := c.Lifeline.SequenceNo
	switch {
	case seq <= m.last[i]:
		return nil // a duplicate after a resume
	case seq != m.last[i]+1:
		return fmt.Errorf("lifeline: choice %d: sequence gap: %d after %d", i, seq, m.last[i])
	}
	m.last[i] = seq
	each(Token{SequenceNo: seq, TokenID: c.Lifeline.TokenID, Text: c.Content(), Instance: c.Lifeline.InstanceID, Index: i})
	return nil
}
