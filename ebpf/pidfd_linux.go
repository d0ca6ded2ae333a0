package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pidfdDetector polls a pidfd per watched process. For the agent's own
// children it reads the exit status without reaping (waitid WNOWAIT), so
// the code that started the child can still wait for it; for other
// processes it only knows that they died.
type pidfdDetector struct {
	exits chan Exit
	// quit is closed by Close: an exit nobody reads any more is dropped
	// rather than hold its poller (and Close) forever.
	quit chan struct{}

	mu      sync.Mutex
	watched map[int]chan struct{} // pid → stop
	closed  bool
	wg      sync.WaitGroup
}

// NewPidfd returns the pidfd fallback detector.
func NewPidfd() (Detector, error) {
	fd, err := unix.PidfdOpen(unix.Getpid(), 0)
	if err != nil {
		return nil, fmt.Errorf("%w: pidfd_open: %v", ErrNotSupported, err)
	}
	unix.Close(fd)
	return &pidfdDetector{exits: make(chan Exit, 256), quit: make(chan struct{}), watched: map[int]chan struct{}{}}, nil
}

func (p *pidfdDetector) Name() string       { return NamePidfd }
func (p *pidfdDetector) Exits() <-chan Exit { return p.exits }

func (p *pidfdDetector) Watch(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("ebpf: pidfd_open %d: %w", pid, err)
	}
	stop := make(chan struct{})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		unix.Close(fd)
		return errors.New("ebpf: detector closed")
	}
	if old, ok := p.watched[pid]; ok {
		close(old)
	}
	p.watched[pid] = stop
	p.wg.Add(1)
	p.mu.Unlock()
	go p.poll(pid, fd, stop)
	return nil
}

func (p *pidfdDetector) Unwatch(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if stop, ok := p.watched[pid]; ok {
		close(stop)
		delete(p.watched, pid)
	}
}

// pollInterval bounds how long an Unwatch or Close waits for a poller; a
// death is seen at once regardless.
const pollInterval = 100 * time.Millisecond

func (p *pidfdDetector) poll(pid, fd int, stop chan struct{}) {
	defer p.wg.Done()
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		select {
		case <-stop:
			return
		default:
		}
		n, err := unix.Poll(fds, int(pollInterval/time.Millisecond))
		switch {
		case errors.Is(err, unix.EINTR), err == nil && n <= 0:
			// A signal (the runtime's preemption, a SIGCHLD: ppoll is
			// never restarted) or the interval: the process lives.
			continue
		case err != nil:
			// ENOMEM and the like: still watched, so look again rather
			// than lose the death.
			time.Sleep(pollInterval)
			continue
		case fds[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) == 0:
			continue
		}
		at := time.Now()
		ex := Exit{PID: pid, Code: -1, Detector: NamePidfd, DetectedAt: at}
		var info unix.Siginfo
		if unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil) == nil {
			ex.Code, ex.Signal = childStatus(&info)
		}
		p.mu.Lock()
		mine := p.watched[pid] == stop
		if mine {
			delete(p.watched, pid)
		}
		p.mu.Unlock()
		if mine {
			select {
			case p.exits <- ex:
			case <-p.quit:
			}
		}
		return
	}
}

// childStatus reads si_code and si_status of a SIGCHLD siginfo.
func childStatus(info *unix.Siginfo) (code, signal int) {
	raw := (*[128]byte)(unsafe.Pointer(info))
	siCode := int32(binary.LittleEndian.Uint32(raw[8:]))
	status := int(int32(binary.LittleEndian.Uint32(raw[24:])))
	const cldExited = 1
	if siCode == cldExited {
		return status, 0
	}
	return -1, status
}

func (p *pidfdDetector) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	close(p.quit)
	p.closed = true
	for pid, stop := range p.watched {
		close(stop)
		delete(p.watched, pid)
	}
	p.mu.Unlock()
	p.wg.Wait()
	close(p.exits)
	return nil
}
