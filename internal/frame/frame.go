// Package frame delimits protobuf messages on a byte stream (unix socket,
// QUIC stream): a uvarint length, then the message. Readers bound the
// length so that a corrupt or hostile peer cannot make them allocate
// without limit.
package frame

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"
)

// MaxSize bounds one message.
const MaxSize = 16 << 20

// ErrTooLarge is returned for a frame longer than MaxSize.
var ErrTooLarge = errors.New("frame: message too large")

// Write writes one message.
func Write(w io.Writer, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	buf := binary.AppendUvarint(make([]byte, 0, len(b)+binary.MaxVarintLen64), uint64(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// Read reads one message into m.
func Read(r *bufio.Reader, m proto.Message) error {
	return ReadInto(r, m, nil)
}

// reuseMax bounds the scratch ReadInto keeps between reads: a stream of
// small messages reads into one buffer as large as the largest of them, a
// rare large one is allocated and let go.
const reuseMax = 1 << 10

// ReadInto is Read with a scratch buffer (nil: none) for the message's
// bytes, kept for the next read when it is small; m keeps none of them.
func ReadInto(r *bufio.Reader, m proto.Message, scratch *[]byte) error {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return err
	}
	if n > MaxSize {
		return fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	var b []byte
	if scratch != nil && n <= reuseMax {
		if cap(*scratch) < int(n) {
			*scratch = make([]byte, n) // the largest small message so far
		}
		b = (*scratch)[:n]
	} else {
		b = make([]byte, n)
	}
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return proto.Unmarshal(b, m)
}

// Buffered reports whether r's buffer holds a whole frame: a ReadInto now
// returns without reading from r's source, so a reader can take every
// frame already received in one go and block only for the first.
func Buffered(r *bufio.Reader) bool {
	n := r.Buffered()
	if n == 0 {
		return false
	}
	b, _ := r.Peek(min(n, binary.MaxVarintLen64))
	size, k := binary.Uvarint(b)
	return k > 0 && size <= uint64(n-k)
}
