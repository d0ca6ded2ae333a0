package localcluster

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ArenaSlotBytes is the size of one arena slot under `lifeline up`: one
// 16-position KV block of the largest preset.
const ArenaSlotBytes = 131072

// Arena bounds: every node gets at least MinArenaSlots (a few prompts);
// sized from memory, at most AutoArenaSlots (1 GiB: every page is
// allocated at the agent's start); asked for (--arena-mb), at most
// MaxArenaSlots (8 GiB).
const (
	MinArenaSlots  = 256
	AutoArenaSlots = 8192
	MaxArenaSlots  = 65536
)

// ArenaShare is the part of the memory `lifeline up` may use that goes to
// the nodes' KV arenas together (1/ArenaShare); the rest is for the
// workers' weights and private KV, the frontends and etcd.
const ArenaShare = 8

// ArenaSize is how many slots each of nodes gets: a 1/ArenaShare of what
// this machine may use (the least of the memory available, the cgroup's
// limit left and /dev/shm's free space), split between the nodes, within
// [MinArenaSlots, AutoArenaSlots]; why says where the figure came from.
func ArenaSize(nodes int) (slots int, why string) {
	avail, from := memoryAvailable()
	if avail <= 0 {
		return MinArenaSlots, "the memory available is not known"
	}
	per := avail / ArenaShare / uint64(max(nodes, 1))
	slots = int(min(max(per/ArenaSlotBytes, MinArenaSlots), AutoArenaSlots))
	return slots, fmt.Sprintf("a 1/%d of %s available (%s) over %d node(s)", ArenaShare, mib(avail), from, nodes)
}

// memoryAvailable is the least of MemAvailable, the memory cgroup's
// limit minus its use, and /dev/shm's free space (the arenas live there).
func memoryAvailable() (uint64, string) {
	var best uint64
	from := ""
	take := func(v uint64, what string) {
		if v > 0 && (best == 0 || v < best) {
			best, from = v, what
		}
	}
	take(meminfo("MemAvailable"), "MemAvailable")
	if max, cur := cgroupValue("memory.max"), cgroupValue("memory.current"); max > cur {
		take(max-cur, "the memory cgroup's limit")
	}
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil {
		take(st.Bavail*uint64(st.Bsize), "/dev/shm free")
	}
	return best, from
}

func meminfo(key string) uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != key {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// cgroupValue reads a number from this process's cgroup v2 directory (0
// when absent or "max").
func cgroupValue(file string) uint64 {
	raw, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	_, path, ok := strings.Cut(strings.TrimSpace(string(raw)), "::")
	if !ok {
		return 0
	}
	b, err := os.ReadFile("/sys/fs/cgroup" + path + "/" + file)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// PromptsHeld is how many prompts of positions each an arena of slots
// holds at once (16 positions per slot).
func PromptsHeld(slots, positions int) int { return slots * 16 / max(positions, 1) }

func mib(b uint64) string { return fmt.Sprintf("%d MiB", b>>20) }
