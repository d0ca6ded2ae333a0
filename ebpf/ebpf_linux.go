package ebpf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

const tracefs = "/sys/kernel/tracing"

// EnsureTracefs mounts tracefs when it is missing (it is not mounted at boot
// on these machines); tracepoint attachment needs it.
func EnsureTracefs() error {
	if _, err := os.Stat(tracefs + "/events"); err == nil {
		return nil
	}
	if err := unix.Mount("tracefs", tracefs, "tracefs", 0, ""); err != nil {
		return fmt.Errorf("%w: mount tracefs at %s: %v", ErrNotSupported, tracefs, err)
	}
	return nil
}

type ebpfDetector struct {
	objs   exitObjects
	links  []link.Link
	reader *ringbuf.Reader
	exits  chan Exit
	// quit is closed by Close: an exit nobody reads any more is dropped
	// rather than hold the reader (and Close) forever.
	quit      chan struct{}
	closeOnce sync.Once

	// wall = wallBase + (ktime - monoBase)
	wallBase time.Time
	monoBase int64

	mu  sync.Mutex
	oom map[int]time.Time // tgid → when the OOM killer marked it
	// orphanOOM is when the OOM killer last marked a task whose thread
	// group could not be read any more: under CPU starvation the victim
	// can exit before its mark is read. The next SIGKILL exit soon after
	// is then taken as that victim's.
	orphanOOM time.Time
	wg        sync.WaitGroup
}

// NewEBPF loads and attaches the exit and OOM probes.
func NewEBPF() (Detector, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: not root", ErrNotSupported)
	}
	if err := EnsureTracefs(); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: memlock: %v", ErrNotSupported, err)
	}
	d := &ebpfDetector{exits: make(chan Exit, 256), quit: make(chan struct{}), oom: map[int]time.Time{}}
	if err := loadExitObjects(&d.objs, nil); err != nil {
		return nil, fmt.Errorf("%w: load programs: %v", ErrNotSupported, err)
	}
	for _, tp := range []struct {
		group, name string
		prog        *ebpf.Program
	}{
		{"sched", "sched_process_exit", d.objs.OnProcessExit},
		{"oom", "mark_victim", d.objs.OnMarkVictim},
	} {
		l, err := link.Tracepoint(tp.group, tp.name, tp.prog, nil)
		if err != nil {
			d.closeObjects()
			return nil, fmt.Errorf("%w: attach %s/%s: %v", ErrNotSupported, tp.group, tp.name, err)
		}
		d.links = append(d.links, l)
	}
	r, err := ringbuf.NewReader(d.objs.Events)
	if err != nil {
		d.closeObjects()
		return nil, fmt.Errorf("%w: ring buffer: %v", ErrNotSupported, err)
	}
	d.reader = r
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	d.wallBase, d.monoBase = time.Now(), ts.Nano()
	d.wg.Add(1)
	go d.read()
	return d, nil
}

func (d *ebpfDetector) Name() string { return NameEBPF }

func (d *ebpfDetector) Watch(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("ebpf: watch pid %d", pid)
	}
	if err := d.objs.Watched.Put(uint32(pid), uint8(1)); err != nil {
		return fmt.Errorf("ebpf: watch pid %d: %w", pid, err)
	}
	return nil
}

func (d *ebpfDetector) Unwatch(pid int) { d.objs.Watched.Delete(uint32(pid)) }

func (d *ebpfDetector) Exits() <-chan Exit { return d.exits }

func (d *ebpfDetector) read() {
	defer d.wg.Done()
	defer close(d.exits)
	for {
		rec, err := d.reader.Read()
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			// A record the reader cannot take stays where it is: look
			// again a little later rather than spin on it.
			time.Sleep(time.Millisecond)
			continue
		}
		if len(rec.RawSample) < 24 {
			continue
		}
		raw := rec.RawSample
		ev := exitEvent{
			KtimeNs:  binary.LittleEndian.Uint64(raw[0:]),
			Pid:      binary.LittleEndian.Uint32(raw[8:]),
			ExitCode: binary.LittleEndian.Uint32(raw[12:]),
			Kind:     binary.LittleEndian.Uint32(raw[16:]),
		}
		at := d.wallBase.Add(time.Duration(int64(ev.KtimeNs) - d.monoBase))
		switch ev.Kind {
		case 1: // OOM victim: remember its thread group while it still exists
			tgid, ok := tgidOf(int(ev.Pid))
			d.mu.Lock()
			if ok {
				d.oom[tgid] = at
			} else {
				d.orphanOOM = at
			}
			d.mu.Unlock()
		case 0:
			code, sig := decodeExitCode(ev.ExitCode)
			d.mu.Lock()
			_, oom := d.oom[int(ev.Pid)]
			delete(d.oom, int(ev.Pid))
			if !oom && sig == 9 && !d.orphanOOM.IsZero() && at.Sub(d.orphanOOM) < orphanOOMWindow {
				oom, d.orphanOOM = true, time.Time{}
			}
			for pid, t := range d.oom {
				if at.Sub(t) > time.Minute {
					delete(d.oom, pid)
				}
			}
			d.mu.Unlock()
			d.objs.Watched.Delete(ev.Pid)
			select {
			case d.exits <- Exit{PID: int(ev.Pid), Code: code, Signal: sig, OOM: oom, Detector: NameEBPF, DetectedAt: at}:
			case <-d.quit:
				return
			}
		}
	}
}

// orphanOOMWindow is how soon after an unresolved OOM mark a SIGKILL exit
// is taken as the victim's: the OOM killer's SIGKILL ends it within
// moments.
const orphanOOMWindow = time.Second

// tgidOf reads a task's thread-group id; a victim is still alive when it
// is marked, unless the mark is read late. ok is false when the task is
// gone.
func tgidOf(pid int) (tgid int, ok bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return pid, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), "Tgid:"); found {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n, true
			}
		}
	}
	return pid, false
}

func (d *ebpfDetector) closeObjects() {
	for _, l := range d.links {
		l.Close()
	}
	d.objs.Close()
}

func (d *ebpfDetector) Close() error {
	var err error
	d.closeOnce.Do(func() {
		close(d.quit)
		err = d.reader.Close()
		d.wg.Wait()
		d.closeObjects()
	})
	return err
}
