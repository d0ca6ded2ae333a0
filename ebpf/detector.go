package ebpf

import (
	"errors"
	"fmt"
	"time"
)

// ErrNotSupported matches every error that means "this detector cannot run
// here" (no BPF permission, no tracefs, old kernel); callers fall back.
var ErrNotSupported = errors.New("ebpf: not supported")

// Detector names.
const (
	NameEBPF  = "ebpf"
	NamePidfd = "pidfd"
)

// Exit is one watched process's death.
type Exit struct {
	PID int
	// Code is the exit status of a normal exit, -1 after a signal or when
	// the detector cannot know (pidfd on a process that is not our child).
	Code int
	// Signal is the killing signal, 0 for a normal exit.
	Signal int
	// OOM is set when the kernel's OOM killer chose the process.
	OOM bool
	// Detector is NameEBPF or NamePidfd.
	Detector string
	// DetectedAt is when the detector saw the death (eBPF: the kernel's
	// timestamp at the exit tracepoint).
	DetectedAt time.Time
}

func (e Exit) String() string {
	switch {
	case e.OOM:
		return fmt.Sprintf("pid %d OOM-killed (signal %d)", e.PID, e.Signal)
	case e.Signal != 0:
		return fmt.Sprintf("pid %d killed by signal %d", e.PID, e.Signal)
	case e.Code >= 0:
		return fmt.Sprintf("pid %d exited with code %d", e.PID, e.Code)
	}
	return fmt.Sprintf("pid %d exited", e.PID)
}

// decodeExitCode splits a kernel task->exit_code (wait status layout).
func decodeExitCode(status uint32) (code, signal int) {
	if sig := int(status & 0x7f); sig != 0 {
		return -1, sig
	}
	return int(status>>8) & 0xff, 0
}

// Detector reports the deaths of the processes it watches.
type Detector interface {
	Name() string
	Watch(pid int) error
	Unwatch(pid int)
	// Exits delivers one Exit per watched process that dies. It is closed
	// by Close.
	Exits() <-chan Exit
	Close() error
}

// NewDetector returns the eBPF detector, or the pidfd detector and the
// reason eBPF could not be used.
func NewDetector() (d Detector, fallback error) {
	d, err := NewEBPF()
	if err == nil {
		return d, nil
	}
	p, perr := NewPidfd()
	if perr != nil {
		return nil, errors.Join(err, perr)
	}
	return p, err
}
