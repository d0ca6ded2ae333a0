// Package procfs lists this machine's live processes from /proc: what
// `lifeline up` uses to find what a previous run left behind, and process
// tests to find workers and leftovers.
package procfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Process is a live process that is not a zombie.
type Process struct {
	PID int
	// Cmdline is the command line with its arguments separated by NUL.
	Cmdline string
}

// Args is the command line as words.
func (p Process) Args() []string { return strings.Split(strings.TrimSuffix(p.Cmdline, "\x00"), "\x00") }

// List returns the live processes that are not zombies.
func List() []Process {
	var out []Process
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err == nil && len(cmdline) > 0 && !strings.Contains(string(stat), ") Z ") {
			out = append(out, Process{pid, string(cmdline)})
		}
	}
	return out
}

// Mentioning returns the live processes whose command line contains s.
func Mentioning(s string) []Process {
	var out []Process
	for _, p := range List() {
		if strings.Contains(p.Cmdline, s) {
			out = append(out, p)
		}
	}
	return out
}

// TaskState is the state letter (R, S, D, T, t, Z…) of thread tid of
// process pid, from /proc/pid/task/tid/stat (the field after the command
// name, which may itself hold ") ").
func TaskState(pid, tid int) (byte, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(tid), "stat"))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndex(string(b), ") ")
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("procfs: malformed stat of task %d of %d", tid, pid)
	}
	return b[i+2], nil
}

// Tasks lists the thread ids of process pid.
func Tasks(pid int) ([]int, error) {
	entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}

// Parent is the process id of pid's parent, from /proc/pid/stat (the
// second field after the command name).
func Parent(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndex(string(b), ") ")
	if i < 0 {
		return 0, fmt.Errorf("procfs: malformed stat of %d", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("procfs: malformed stat of %d", pid)
	}
	return strconv.Atoi(f[1])
}
