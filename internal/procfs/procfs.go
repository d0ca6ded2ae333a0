// Package procfs lists this machine's live processes from /proc: what
// `lifeline up` uses to find what a previous run left behind, and process
// tests to find workers and leftovers.
package procfs

import (
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
