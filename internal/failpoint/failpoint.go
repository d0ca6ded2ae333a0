// Package failpoint marks the commit points where a crash is interesting —
// before a KV block is sealed, between seal and publish, around a generation
// bump — so that tests and the drill runner can stop or kill a real process
// exactly there.
//
// Failpoints are armed from the environment:
//
//	LIFELINE_FAILPOINTS="kv.before-seal=pause;kv.before-publish=kill"
//
// Actions: "pause" writes "failpoint NAME hit" to stderr and blocks forever
// (the test then kills the process); "kill" writes the same line and sends
// SIGKILL to the process itself; "error" makes Hit return ErrInjected;
// "allocMB:N" allocates and touches N MiB (N ≤ 4096) and holds it, the
// controlled allocation an OOM drill runs inside a memory-limited cgroup;
// "sleep:DURATION" (at most a minute) delays the caller, to let a newer
// attempt overtake an older one.
package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvVar is the environment variable that arms failpoints.
const EnvVar = "LIFELINE_FAILPOINTS"

// ErrInjected is returned by Hit for a failpoint armed with "error".
var ErrInjected = errors.New("failpoint: injected error")

var (
	once   sync.Once
	armed  map[string]string
	parseE error
)

func load() {
	armed = map[string]string{}
	for _, item := range strings.Split(os.Getenv(EnvVar), ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, action, ok := strings.Cut(item, "=")
		switch {
		case !ok || name == "":
			parseE = fmt.Errorf("failpoint: %s: %q is not NAME=ACTION", EnvVar, item)
		case action != "pause" && action != "kill" && action != "error" && allocMB(action) <= 0 && sleepFor(action) <= 0:
			parseE = fmt.Errorf("failpoint: %s: unknown action %q for %s", EnvVar, action, name)
		default:
			armed[name] = action
		}
	}
}

func sleepFor(action string) time.Duration {
	v, ok := strings.CutPrefix(action, "sleep:")
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > time.Minute {
		return 0
	}
	return d
}

// held keeps an "allocMB" allocation alive.
var held [][]byte

func allocMB(action string) int {
	v, ok := strings.CutPrefix(action, "allocMB:")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 || n > 4096 {
		return 0
	}
	return n
}

// Check reports a malformed LIFELINE_FAILPOINTS, so that a drill with a typo
// fails loudly instead of silently testing nothing.
func Check() error {
	once.Do(load)
	return parseE
}

// Hit runs the failpoint called name if it is armed.
func Hit(name string) error {
	once.Do(load)
	action, ok := armed[name]
	if !ok {
		return nil
	}
	fmt.Fprintf(os.Stderr, "failpoint %s hit\n", name)
	switch action {
	case "pause":
		select {}
	case "kill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if d := sleepFor(action); d > 0 {
		time.Sleep(d)
		return nil
	}
	if mb := allocMB(action); mb > 0 {
		held = make([][]byte, 0, mb)
		for i := 0; i < mb; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			held = append(held, b)
		}
		return nil
	}
	return fmt.Errorf("%w at %s", ErrInjected, name)
}
