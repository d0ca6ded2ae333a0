package localcluster

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/internal/procfs"
)

// reapLeftovers stops what a previous `lifeline up` on dir left running
// when it was killed without stopping its children (agents, workers, a
// frontend: lifeline subcommands whose command line names a path under
// dir), and
// removes the arenas its agents were configured with. The caller holds the
// data directory's lock, so no live `up` owns them.
func reapLeftovers(dir string, out io.Writer) {
	var pids []int
	for _, p := range procfs.Mentioning(dir + string(filepath.Separator)) {
		// Only what up starts: agents, their workers, the frontends, etcd members.
		// Only this user's: another's process may name the path too.
		if args := p.Args(); p.PID != os.Getpid() && ownedByMe(p.PID) && len(args) > 1 && slices.Contains([]string{"agent", "worker", "frontend", "etcd"}, args[1]) {
			pids = append(pids, p.PID)
		}
	}
	if len(pids) > 0 {
		start := time.Now()
		fmt.Fprintf(out, "up: stopping %d processes a previous lifeline up left running on %s: %v\n", len(pids), dir, pids)
		defer func() { fmt.Fprintf(out, "up: stopped them in %v\n", time.Since(start).Round(time.Millisecond)) }()
		for _, pid := range pids {
			// A stopped one gets its SIGTERM once continued.
			syscall.Kill(pid, syscall.SIGTERM)
			syscall.Kill(pid, syscall.SIGCONT)
		}
		deadline := time.Now().Add(10 * time.Second)
		for _, pid := range pids {
			for syscall.Kill(pid, 0) == nil && !zombie(pid) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	configs, _ := filepath.Glob(filepath.Join(dir, "node-*", "agent.json"))
	for _, c := range configs {
		var o agent.Options
		if b, err := os.ReadFile(c); err == nil && json.Unmarshal(b, &o) == nil && strings.HasPrefix(o.ArenaPath, "/dev/shm/lifeline-up-") {
			os.Remove(o.ArenaPath)
		}
	}
}

// ownedByMe reports whether process pid runs as this process's uid.
func ownedByMe(pid int) bool {
	var st syscall.Stat_t
	return syscall.Stat(fmt.Sprintf("/proc/%d", pid), &st) == nil && int(st.Uid) == os.Geteuid()
}

// zombie reports whether pid has exited and waits for its parent.
func zombie(pid int) bool {
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return strings.Contains(string(stat), ") Z ")
}
