// Package collective is the all-reduce of a tensor-parallel worker group:
// the n rank processes of one instance on one host share a segment (a
// file under /dev/shm the agent creates per group generation) and sum
// their partial activations in it, in a fixed rank order, so that every
// rank holds the same bit-exact result.
//
// A collective cannot hang: the segment carries the group generation
// (a rank started for another generation is refused at Open), an abort
// word (set by the agent when a rank dies, or by a rank that gives up:
// every rank waiting returns ErrAborted at once), and every wait is
// bounded (ErrTimeout). Waits spin briefly, then park on a futex of the
// arrivals word.
package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors, matched with errors.Is.
var (
	// ErrAborted: the group was aborted (a rank died or gave up).
	ErrAborted = errors.New("collective: the group was aborted")
	// ErrTimeout: the other ranks did not arrive within the bound.
	ErrTimeout = errors.New("collective: the other ranks did not arrive in time")
	// ErrStaleGeneration: the segment belongs to another group
	// generation than the rank was started for.
	ErrStaleGeneration = errors.New("collective: stale group generation")
	// ErrBadSegment: the file is not a collective segment of this shape.
	ErrBadSegment = errors.New("collective: not a segment of this group")
)

const (
	magic   = 0x4c4c5450434f4c4c // "LLTPCOLL"
	version = 1
	// MaxRanks bounds a group.
	MaxRanks = 8

	offMagic    = 0
	offVersion  = 8
	offTP       = 12
	offGen      = 16
	offMaxElems = 24
	offAbort    = 64  // its own cache line
	offArrivals = 128 // its own cache line
	offPresent  = 192 // MaxRanks × 8: the generation each rank attached with
	offData     = 256
)

// size is the segment's size for tp ranks of maxElems floats: two
// buffers (alternate steps) per rank.
func size(tp, maxElems int) int { return offData + 2*tp*align64(4*maxElems) }

func align64(n int) int { return (n + 63) &^ 63 }

// Create writes a fresh segment at path for tp ranks of group generation
// gen whose all-reduces hold at most maxElems floats (mode 0600; an
// existing file is replaced: a new generation's segment is a new file).
func Create(path string, tp int, gen uint64, maxElems int) error {
	if tp < 1 || tp > MaxRanks || maxElems < 1 || maxElems > 1<<26 {
		return fmt.Errorf("%w: tp %d (1..%d), %d floats", ErrBadSegment, tp, MaxRanks, maxElems)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("collective: %w", err)
	}
	defer f.Close()
	hdr := make([]byte, offData)
	binary.LittleEndian.PutUint64(hdr[offMagic:], magic)
	binary.LittleEndian.PutUint32(hdr[offVersion:], version)
	binary.LittleEndian.PutUint32(hdr[offTP:], uint32(tp))
	binary.LittleEndian.PutUint64(hdr[offGen:], gen)
	binary.LittleEndian.PutUint64(hdr[offMaxElems:], uint64(maxElems))
	if err := f.Truncate(int64(size(tp, maxElems))); err != nil {
		return fmt.Errorf("collective: %w", err)
	}
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return fmt.Errorf("collective: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("collective: %w", err)
	}
	return nil
}

// Group is one rank's view of a mapped segment. Its methods are called
// from one goroutine (the rank's step loop); Abort may be called from any.
type Group struct {
	Rank, TP int
	Gen      uint64
	// Timeout bounds every wait (default 5 s).
	Timeout time.Duration

	mem      []byte
	maxElems int
	step     uint64
}

// Open maps the segment at path as rank of a tp-rank group of generation
// gen. A segment of another generation is ErrStaleGeneration: the rank
// belongs to a group that no longer exists.
func Open(path string, rank, tp int, gen uint64) (*Group, error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("collective: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("collective: %w", err)
	}
	if st.Size() < offData {
		return nil, fmt.Errorf("%w: %s is %d bytes", ErrBadSegment, path, st.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("collective: mmap %s: %w", path, err)
	}
	g := &Group{Rank: rank, TP: tp, Gen: gen, Timeout: 5 * time.Second, mem: mem}
	if err := g.check(int(st.Size())); err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	atomic.StoreUint64(g.word64(offPresent+8*rank), gen)
	return g, nil
}

func (g *Group) check(n int) error {
	m := g.mem
	switch {
	case binary.LittleEndian.Uint64(m[offMagic:]) != magic || binary.LittleEndian.Uint32(m[offVersion:]) != version:
		return fmt.Errorf("%w: no collective header", ErrBadSegment)
	case int(binary.LittleEndian.Uint32(m[offTP:])) != g.TP:
		return fmt.Errorf("%w: the segment is for tp %d, the rank for tp %d", ErrBadSegment, binary.LittleEndian.Uint32(m[offTP:]), g.TP)
	case g.Rank < 0 || g.Rank >= g.TP:
		return fmt.Errorf("%w: rank %d of %d", ErrBadSegment, g.Rank, g.TP)
	case binary.LittleEndian.Uint64(m[offGen:]) != g.Gen:
		return fmt.Errorf("%w: the segment is generation %d, the rank was started for %d", ErrStaleGeneration, binary.LittleEndian.Uint64(m[offGen:]), g.Gen)
	}
	g.maxElems = int(binary.LittleEndian.Uint64(m[offMaxElems:]))
	if size(g.TP, g.maxElems) != n {
		return fmt.Errorf("%w: %d bytes for tp %d of %d floats", ErrBadSegment, n, g.TP, g.maxElems)
	}
	return nil
}

// Close unmaps the segment.
func (g *Group) Close() error {
	if g.mem == nil {
		return nil
	}
	err := unix.Munmap(g.mem)
	g.mem = nil
	return err
}

// MaxElems is the largest all-reduce the segment holds.
func (g *Group) MaxElems() int { return g.maxElems }

func (g *Group) word32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&g.mem[off])) }
func (g *Group) word64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&g.mem[off])) }

// buffer is rank r's buffer of step parity p.
func (g *Group) buffer(r int, p uint64) []float32 {
	stride := align64(4 * g.maxElems)
	off := offData + (int(p)*g.TP+r)*stride
	return unsafe.Slice((*float32)(unsafe.Pointer(&g.mem[off])), g.maxElems)
}

// Rendezvous waits until every rank attached with this generation (or
// the group is aborted, or Timeout passes).
func (g *Group) Rendezvous() error {
	deadline := time.Now().Add(g.Timeout)
	for {
		if atomic.LoadUint32(g.word32(offAbort)) != 0 {
			return ErrAborted
		}
		all := true
		for r := 0; r < g.TP; r++ {
			all = all && atomic.LoadUint64(g.word64(offPresent+8*r)) == g.Gen
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: rendezvous of %d ranks", ErrTimeout, g.TP)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// AllReduce replaces buf with the sum of every rank's buf, added in rank
// order 0, 1, …, n-1 (the same float32 operations on every rank: the
// results are bit-identical everywhere). Every rank calls it with the
// same length, in the same sequence.
func (g *Group) AllReduce(buf []float32) error {
	if len(buf) > g.maxElems {
		return fmt.Errorf("%w: all-reduce of %d floats, the segment holds %d", ErrBadSegment, len(buf), g.maxElems)
	}
	if g.TP == 1 {
		return nil
	}
	p := g.step & 1
	copy(g.buffer(g.Rank, p), buf)
	arrivals := g.word32(offArrivals)
	target := uint32((g.step + 1) * uint64(g.TP))
	g.step++
	// Publish: the buffer write happens before the add (atomic: a full
	// barrier on every architecture Go supports).
	atomic.AddUint32(arrivals, 1)
	futexWake(arrivals)
	if err := g.wait(arrivals, target); err != nil {
		return err
	}
	// A rank writes this parity's buffer again two steps on, after it
	// saw every rank arrive at the step between: they read this one
	// before arriving there.
	copy(buf, g.buffer(0, p)[:len(buf)])
	for r := 1; r < g.TP; r++ {
		src := g.buffer(r, p)[:len(buf)]
		for i := range buf {
			buf[i] += src[i]
		}
	}
	return nil
}

// Broadcast hands rank 0's msg to every rank: rank 0 passes its message
// (and gets it back), the others pass nil and get a copy of it. It is a
// collective step like AllReduce (every rank calls it, in the same
// sequence). idle, when true, waits for rank 0 without the Timeout bound
// (a follower waiting for the next step of an idle group), still
// returning at once on an abort.
func (g *Group) Broadcast(msg []byte, idle bool) ([]byte, error) {
	limit := 4*g.maxElems - 4
	if g.Rank == 0 && len(msg) > limit {
		return nil, fmt.Errorf("%w: a broadcast of %d bytes, the segment holds %d", ErrBadSegment, len(msg), limit)
	}
	if g.TP == 1 {
		return msg, nil
	}
	p := g.step & 1
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&g.buffer(0, p)[0])), 4*g.maxElems)
	if g.Rank == 0 {
		binary.LittleEndian.PutUint32(raw, uint32(len(msg)))
		copy(raw[4:], msg)
	}
	arrivals := g.word32(offArrivals)
	target := uint32((g.step + 1) * uint64(g.TP))
	g.step++
	atomic.AddUint32(arrivals, 1)
	futexWake(arrivals)
	timeout := g.Timeout
	if idle {
		timeout = 0
	}
	if err := g.waitFor(arrivals, target, timeout); err != nil {
		return nil, err
	}
	if g.Rank == 0 {
		return msg, nil
	}
	n := binary.LittleEndian.Uint32(raw)
	if int(n) > limit {
		return nil, fmt.Errorf("%w: a broadcast of %d bytes", ErrBadSegment, n)
	}
	return append([]byte(nil), raw[4:4+n]...), nil
}

// wait waits until *w has reached target (modulo 2³²), the group is
// aborted, or Timeout passes.
func (g *Group) wait(w *uint32, target uint32) error { return g.waitFor(w, target, g.Timeout) }

// waitFor is wait bounded by timeout (0: no bound but an abort).
func (g *Group) waitFor(w *uint32, target uint32, timeout time.Duration) error {
	abort := g.word32(offAbort)
	// The word is read before the abort word: an abort changes both, the
	// abort word first, so a word changed by an abort is never taken for
	// the ranks' arrival.
	for spin := 0; spin < 2000; spin++ {
		v := atomic.LoadUint32(w)
		if atomic.LoadUint32(abort) != 0 {
			return ErrAborted
		}
		if int32(v-target) >= 0 {
			return nil
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		v := atomic.LoadUint32(w)
		if atomic.LoadUint32(abort) != 0 {
			return ErrAborted
		}
		if int32(v-target) >= 0 {
			return nil
		}
		left := time.Until(deadline)
		if timeout == 0 {
			left = time.Hour
		} else if left <= 0 {
			return fmt.Errorf("%w: %d of %d ranks arrived after %v", ErrTimeout, int(g.TP)-int(target-v), g.TP, timeout)
		}
		// Park until the word changes (an arrival, or an abort's wake),
		// 10 ms at most: the abort word is looked at again.
		futexWait(w, v, min(left, 10*time.Millisecond))
	}
}

// WatchAbort returns a channel closed once the group is aborted, for a
// rank that must stop even while it has no collective to wait in (rank 0
// of an idle group); stop ends the watch and returns once it ended (call
// it before Close). The watch parks on a futex of the abort word, which
// an abort wakes: no polling while nothing happens.
func (g *Group) WatchAbort() (aborted <-chan struct{}, stop func()) {
	ch, done := make(chan struct{}), make(chan struct{})
	var quit atomic.Bool
	word := g.word32(offAbort)
	go func() {
		defer close(done)
		for !quit.Load() {
			if atomic.LoadUint32(word) != 0 {
				close(ch)
				return
			}
			// A bound on the park, in case a wake-up is ever lost.
			futexWait(word, 0, time.Second)
		}
	}()
	var once sync.Once
	return ch, func() {
		once.Do(func() { quit.Store(true) })
		// Wake the watch without changing the word: it sees quit. Again
		// until it ended, for a watch that was between its look at quit
		// and its park when the first wake-up came.
		for {
			futexWake(word)
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// Abort aborts the group: every rank waiting in a collective returns
// ErrAborted, and every later collective too.
func (g *Group) Abort() { abort(g.word32(offAbort), g.word32(offArrivals)) }

// AbortSegment aborts the group of the segment at path (what the agent
// does when one of its ranks died).
func AbortSegment(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("collective: %w", err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, offData, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("collective: mmap %s: %w", path, err)
	}
	defer unix.Munmap(mem)
	if binary.LittleEndian.Uint64(mem[offMagic:]) != magic {
		return fmt.Errorf("%w: %s", ErrBadSegment, path)
	}
	abort((*uint32)(unsafe.Pointer(&mem[offAbort])), (*uint32)(unsafe.Pointer(&mem[offArrivals])))
	return nil
}

func abort(word, arrivals *uint32) {
	atomic.StoreUint32(word, 1)
	// Change the arrivals word too, so that a rank parked on it wakes
	// at once (FUTEX_WAIT returns when the value is not the one it
	// expected); the abort word wins over any count it then sees.
	atomic.AddUint32(arrivals, 1<<31)
	futexWake(arrivals)
	futexWake(word)
}

const (
	futexWaitOp = 0 // FUTEX_WAIT, shared between processes
	futexWakeOp = 1 // FUTEX_WAKE
)

func futexWait(w *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(w *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(math.MaxInt32), 0, 0, 0)
}
