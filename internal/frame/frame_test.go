package frame

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// trickle writes what it is given a few bytes at a time, as a network
// stream delivers it.
type trickle struct{ w io.Writer }

func (t trickle) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i += 7 {
		if _, err := t.w.Write(p[i:min(i+7, len(p))]); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// TestReadThroughASmallBuffer: messages shorter and much longer than the
// reader's buffer (a worker stream's is 512 bytes) come back whole and in
// order, however the bytes arrive.
func TestReadThroughASmallBuffer(t *testing.T) {
	sizes := []int{0, 10, 511, 512, 513, 5000, 70000}
	pr, pw := io.Pipe()
	go func() {
		for _, n := range sizes {
			if err := Write(trickle{pw}, wrapperspb.Bytes(bytes.Repeat([]byte{byte(n)}, n))); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.Close()
	}()
	r := bufio.NewReaderSize(pr, 512)
	for _, n := range sizes {
		var m wrapperspb.BytesValue
		if err := Read(r, &m); err != nil {
			t.Fatalf("message of %d bytes: %v", n, err)
		}
		if !bytes.Equal(m.Value, bytes.Repeat([]byte{byte(n)}, n)) {
			t.Fatalf("message of %d bytes came back as %d bytes", n, len(m.Value))
		}
	}
	if err := Read(r, &wrapperspb.BytesValue{}); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last message: %v, want EOF", err)
	}
}

// TestReadRefusesWhatIsNotAFrame: a length over MaxSize is refused before
// anything is allocated for it, a message cut short is an error, not a
// shorter message.
func TestReadRefusesWhatIsNotAFrame(t *testing.T) {
	huge := binary.AppendUvarint(nil, MaxSize+1)
	if err := Read(bufio.NewReader(bytes.NewReader(huge)), &wrapperspb.BytesValue{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a %d-byte length: %v, want ErrTooLarge", MaxSize+1, err)
	}
	b, _ := proto.Marshal(wrapperspb.Bytes(make([]byte, 100)))
	cut := append(binary.AppendUvarint(nil, uint64(len(b))), b[:50]...)
	if err := Read(bufio.NewReader(bytes.NewReader(cut)), &wrapperspb.BytesValue{}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a message cut short: %v, want io.ErrUnexpectedEOF", err)
	}
}

// TestReadIntoKeepsNothingOfTheScratch: messages read through one scratch
// buffer keep their own bytes: reading the next one (small, then larger
// than the scratch) changes none of the earlier ones, and the scratch
// stays at its bound.
func TestReadIntoKeepsNothingOfTheScratch(t *testing.T) {
	var in bytes.Buffer
	sizes := []int{5, 300, 2000, 7}
	for _, n := range sizes {
		if err := Write(&in, wrapperspb.Bytes(bytes.Repeat([]byte{byte(n)}, n))); err != nil {
			t.Fatal(err)
		}
	}
	r := bufio.NewReaderSize(&in, 512)
	var scratch []byte
	var got []*wrapperspb.BytesValue
	for range sizes {
		m := &wrapperspb.BytesValue{}
		if err := ReadInto(r, m, &scratch); err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	for i, n := range sizes {
		if !bytes.Equal(got[i].Value, bytes.Repeat([]byte{byte(n)}, n)) {
			t.Errorf("message %d (%d bytes) changed after the reads that followed it", i, n)
		}
	}
	// As large as the largest message under the bound (the 300-byte one:
	// the 2000-byte one was allocated and let go), and no larger.
	if want := proto.Size(wrapperspb.Bytes(make([]byte, 300))); cap(scratch) != want {
		t.Errorf("scratch of %d bytes, want %d", cap(scratch), want)
	}
}

// TestBufferedSaysWhenAReadWouldNotWait: Buffered is true exactly while
// the reader's buffer holds a whole frame, never reading from the source
// to find out (a relay asks it between frames and must not block).
func TestBufferedSaysWhenAReadWouldNotWait(t *testing.T) {
	var wire bytes.Buffer
	for _, s := range []string{"one", "two", string(bytes.Repeat([]byte("x"), 200))} {
		if err := Write(&wire, wrapperspb.String(s)); err != nil {
			t.Fatal(err)
		}
	}
	all := wire.Bytes()
	first := 2 + len("one") // a 1-byte length, a tag and a length, the text
	pr, pw := io.Pipe()
	r := bufio.NewReaderSize(pr, 64)
	if Buffered(r) {
		t.Fatal("Buffered with nothing received")
	}
	// The first frame and half of the second arrive: one read is there.
	go func() { pw.Write(all[:first+1+3]) }()
	var m wrapperspb.StringValue
	if err := Read(r, &m); err != nil || m.Value != "one" {
		t.Fatalf("first frame: %q %v", m.Value, err)
	}
	if Buffered(r) {
		t.Fatalf("Buffered with %d bytes of the second frame", r.Buffered())
	}
	// The rest: the second frame whole, the third (longer than the
	// buffer) never whole in it.
	go func() { pw.Write(all[first+1+3:]); pw.Close() }()
	if err := Read(r, &m); err != nil || m.Value != "two" {
		t.Fatalf("second frame: %q %v", m.Value, err)
	}
	if r.Buffered() > 0 && Buffered(r) {
		t.Fatalf("Buffered with %d bytes of a %d-byte frame", r.Buffered(), len(all)-first-6)
	}
	if err := Read(r, &m); err != nil || len(m.Value) != 200 {
		t.Fatalf("third frame: %d bytes %v", len(m.Value), err)
	}
	// Whole frames received together are all there to read.
	r = bufio.NewReader(bytes.NewReader(all))
	if _, err := r.Peek(1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if !Buffered(r) {
			t.Fatalf("frame %d of 3 received together: not buffered (%d bytes)", i+1, r.Buffered())
		}
		if err := Read(r, &m); err != nil {
			t.Fatal(err)
		}
	}
	if Buffered(r) {
		t.Fatal("Buffered after the last frame")
	}
}
