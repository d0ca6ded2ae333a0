package ebpf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/tests/cgtest"
)

// helperLeaderExit: the main thread exits alone (SYS_EXIT, not
// exit_group) and the process lives on in its other threads until a byte
// on stdin ends it with code 3.
const helperLeaderExit = "leader-exit"

func init() {
	if os.Getenv("LIFELINE_EBPF_HELPER") == helperLeaderExit {
		runtime.LockOSThread() // main stays on the leader thread
	}
}

func TestMain(m *testing.M) {
	if os.Getenv("LIFELINE_EBPF_HELPER") == helperLeaderExit {
		go func() {
			io.ReadFull(os.Stdin, make([]byte, 1))
			os.Exit(3)
		}()
		syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
	}
	if os.Getenv("LIFELINE_EBPF_HELPER") == "alloc" {
		// Wait until the test has put us in a memory-limited cgroup, then
		// allocate and touch far more than the limit.
		io.ReadFull(os.Stdin, make([]byte, 1))
		var hold [][]byte
		for i := 0; i < 64; i++ {
			b := make([]byte, 16<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			hold = append(hold, b)
		}
		fmt.Println(len(hold))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func detectors(t *testing.T) map[string]Detector {
	t.Helper()
	out := map[string]Detector{}
	if os.Geteuid() == 0 {
		// As root on Linux eBPF must work: a failure here is a failure.
		d, err := NewEBPF()
		if err != nil {
			t.Fatalf("eBPF detector unavailable as root: %v", err)
		}
		out[NameEBPF] = d
	} else if _, err := NewEBPF(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("as non-root NewEBPF gave %v, want ErrNotSupported", err)
	}
	p, err := NewPidfd()
	if err != nil {
		t.Fatal(err)
	}
	out[NamePidfd] = p
	t.Cleanup(func() {
		for _, d := range out {
			d.Close()
		}
	})
	return out
}

func waitExit(t *testing.T, d Detector, pid int) Exit {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ex := <-d.Exits():
			if ex.PID == pid {
				return ex
			}
		case <-timeout:
			t.Fatalf("%s: no exit for pid %d", d.Name(), pid)
		}
	}
}

func TestKillAndExitCode(t *testing.T) {
	t.Parallel()
	for name, d := range detectors(t) {
		t.Run(name, func(t *testing.T) {
			// SIGKILL.
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if err := d.Watch(cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			cmd.Process.Signal(syscall.SIGKILL)
			ex := waitExit(t, d, cmd.Process.Pid)
			if ex.Signal != 9 || ex.OOM || ex.Detector != name {
				t.Fatalf("kill -9 reported as %+v", ex)
			}
			t.Logf("%s: kill → detected %v", name, ex.DetectedAt.Sub(killed))
			// The detector did not reap the child: its parent still can.
			if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("Wait after detection: %v", err)
			}

			// A normal exit with a code.
			cmd = exec.Command("sh", "-c", "read x; exit 7")
			stdin, _ := cmd.StdinPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			d.Watch(cmd.Process.Pid)
			stdin.Write([]byte("go\n"))
			ex = waitExit(t, d, cmd.Process.Pid)
			if ex.Code != 7 || ex.Signal != 0 {
				t.Fatalf("exit 7 reported as %+v", ex)
			}
			cmd.Wait()

			// An unwatched process is not reported.
			other := exec.Command("sleep", "60")
			other.Start()
			watched := exec.Command("sleep", "60")
			watched.Start()
			d.Watch(watched.Process.Pid)
			other.Process.Kill()
			other.Wait()
			watched.Process.Kill()
			if ex := waitExit(t, d, watched.Process.Pid); ex.PID != watched.Process.Pid {
				t.Fatalf("got %+v", ex)
			}
			watched.Wait()
		})
	}
}

// TestOOMKillClassified: a process killed by the OOM killer inside a
// memory-limited cgroup is reported as OOM, not as a plain signal 9.
func TestOOMKillClassified(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("not root: cannot create cgroups or load eBPF")
	}
	d, err := NewEBPF()
	if err != nil {
		t.Fatalf("eBPF detector unavailable as root: %v", err)
	}
	defer d.Close()
	cg := cgtest.Memory(t, 64<<20)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LIFELINE_EBPF_HELPER=alloc")
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(fmt.Sprint(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	d.Watch(cmd.Process.Pid)
	stdin.Write([]byte{1})
	ex := waitExit(t, d, cmd.Process.Pid)
	if !ex.OOM || ex.Signal != 9 {
		t.Fatalf("OOM kill reported as %+v", ex)
	}
	cmd.Wait()
}

// TestLeaderThreadExitIsNotTheProcessExit: a process whose main thread
// exited alone is still alive; its exit is reported when its last thread
// ends, with that exit's code.
func TestLeaderThreadExitIsNotTheProcessExit(t *testing.T) {
	t.Parallel()
	for name, d := range detectors(t) {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "LIFELINE_EBPF_HELPER="+helperLeaderExit)
			stdin, _ := cmd.StdinPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			pid := cmd.Process.Pid
			d.Watch(pid)
			deadline := time.Now().Add(10 * time.Second)
			for !leaderIsZombie(pid) {
				if time.Now().After(deadline) {
					t.Fatal("the helper's main thread did not exit")
				}
				time.Sleep(time.Millisecond)
			}
			// The leader's exit went through the probes already; an event
			// for it would be in the ring buffer by now.
			select {
			case ex := <-d.Exits():
				t.Fatalf("%+v reported while the process still runs", ex)
			case <-time.After(200 * time.Millisecond):
			}
			stdin.Write([]byte{1})
			if ex := waitExit(t, d, pid); ex.Code != 3 || ex.Signal != 0 {
				t.Fatalf("exit 3 after the leader thread reported as %+v", ex)
			}
			cmd.Wait()
		})
	}
}

// leaderIsZombie reports whether pid's main thread has exited while the
// process lives on.
func leaderIsZombie(pid int) bool {
	state, err := procfs.TaskState(pid, pid)
	return err == nil && state == 'Z'
}

// TestSignalsAreNotDeaths: signals delivered to the detector's threads
// while they wait (SIGURG, as the Go runtime sends to preempt; ppoll is
// never restarted and returns EINTR) report no exit of a process that
// is alive, and its death is still reported afterwards.
func TestSignalsAreNotDeaths(t *testing.T) {
	t.Parallel()
	for name, d := range detectors(t) {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer cmd.Process.Kill()
			pid := cmd.Process.Pid
			if err := d.Watch(pid); err != nil {
				t.Fatal(err)
			}
			signalled := 0
			for end := time.Now().Add(time.Second); time.Now().Before(end); {
				signalled += signalThreads(t, syscall.SIGURG)
				select {
				case ex := <-d.Exits():
					if ex.PID == pid {
						t.Fatalf("%s: pid %d reported dead (%+v) while alive, after %d signals to this process's threads", name, pid, ex, signalled)
					}
				case <-time.After(2 * time.Millisecond):
				}
			}
			cmd.Process.Kill()
			if ex := waitExit(t, d, pid); ex.Signal != 9 {
				t.Fatalf("%s: kill -9 after the signals reported as %+v", name, ex)
			}
			t.Logf("%s: %d signals to this process's threads, no false death", name, signalled)
		})
	}
}

// signalThreads sends sig to every thread of this process and returns
// how many it reached.
func signalThreads(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		var tid int
		if _, err := fmt.Sscan(task.Name(), &tid); err != nil {
			continue
		}
		if syscall.Tgkill(os.Getpid(), tid, sig) == nil {
			n++
		}
	}
	return n
}

// TestCloseWithUnreadExits: more watched processes die than Exits holds
// while nobody reads it (the agent stopped reading); Close still returns,
// and a second Close is harmless.
func TestCloseWithUnreadExits(t *testing.T) {
	t.Parallel()
	for name, d := range detectors(t) {
		t.Run(name, func(t *testing.T) {
			for i := 0; i < cap(d.Exits())+40; i++ {
				cmd := exec.Command("sh", "-c", "read x; exit 0")
				stdin, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				if err := d.Watch(cmd.Process.Pid); err != nil {
					t.Fatal(err)
				}
				stdin.Close()
				if err := cmd.Wait(); err != nil {
					t.Fatal(err)
				}
			}
			closed := make(chan error, 1)
			go func() { closed <- d.Close() }()
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: Close did not return within 10 s with %d exits unread", name, len(d.Exits()))
			}
			d.Close()
		})
	}
}
