// Package ebpf detects the death of supervised worker processes within
// microseconds: eBPF programs on sched/sched_process_exit (filtered in the
// kernel to watched thread-group leaders, exit code and signal decoded from
// task->exit_code) and oom/mark_victim (to tell an OOM kill from a kill -9),
// delivered through a ring buffer. When eBPF is unavailable, a pidfd
// detector watches the agent's own children instead; both implement
// Detector, and NewDetector says which one it chose.
package ebpf
