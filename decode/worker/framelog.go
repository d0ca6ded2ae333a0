package worker

import "github.com/lifeline-llm/lifeline/decode/wire"

// maxLogFrames bounds a detachable request's frame log: past it, the
// oldest frames are dropped (and counted), and an Attach that wants them
// is told so; the frontend then regenerates.
const maxLogFrames = 1 << 16

// frameLogLimit is the bound new sessions get: maxLogFrames, lowered by
// tests (no request of the test presets' contexts reaches it).
var frameLogLimit = maxLogFrames

// frameLog is a detachable request's frames, in order, the newest limit
// of them kept. Frame i (0 for the first frame the request produced) is
// kept while first() <= i < n. It is not safe for concurrent use.
type frameLog struct {
	buf   []*wire.Frame
	limit int
	n     int
	// droppedThrough is the sequence number of the newest token frame
	// dropped (0: none).
	droppedThrough int32
}

func newFrameLog(limit int) frameLog { return frameLog{limit: limit} }

// first is the index of the oldest frame kept.
func (l *frameLog) first() int { return l.n - len(l.buf) }

// at returns frame i; first() <= i < n.
func (l *frameLog) at(i int) *wire.Frame { return l.buf[i%l.limit] }

// append adds f, dropping the oldest frame when the log is full; it
// reports whether one was dropped.
func (l *frameLog) append(f *wire.Frame) (dropped bool) {
	if len(l.buf) < l.limit {
		l.buf = append(l.buf, f)
		l.n++
		return false
	}
	i := l.n % l.limit
	if seq := l.buf[i].SequenceNo; seq > 0 {
		l.droppedThrough = seq
	}
	l.buf[i] = f
	l.n++
	return true
}

// since returns the frames from index i (>= first()) to the newest.
func (l *frameLog) since(i int) []*wire.Frame {
	out := make([]*wire.Frame, 0, l.n-i)
	for ; i < l.n; i++ {
		out = append(out, l.at(i))
	}
	return out
}
