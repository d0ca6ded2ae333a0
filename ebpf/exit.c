//go:build ignore

// Process exit and OOM-victim probes for the node agent. Exits are filtered
// in the kernel to the processes the agent watches, reported once, when
// the last thread of the process exits; OOM victims are rare and all go
// to user space, which matches them to watched processes.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char __license[] SEC("license") = "Dual MIT/GPL";

// Only the fields we read, relocated by CO-RE against the running kernel.
typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	int exit_code;
	struct signal_struct *signal;
} __attribute__((preserve_access_index));

enum event_kind {
	EVENT_EXIT = 0,
	EVENT_OOM_VICTIM = 1,
};

struct event {
	__u64 ktime_ns;
	__u32 pid;
	__u32 exit_code;
	__u32 kind;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} events SEC(".maps");

// watched holds the thread-group ids of supervised workers.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} watched SEC(".maps");

// Force the event type into BTF so bpf2go generates it.
const struct event *unused_event __attribute__((unused));

SEC("tracepoint/sched/sched_process_exit")
int on_process_exit(void *ctx) {
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (!bpf_map_lookup_elem(&watched, &tgid))
		return 0;
	// The process is dead when its last thread exits (signal->live was
	// decremented before this tracepoint), not when its leader does: a
	// leader killed by the OOM killer's SIGKILL can exit while the thread
	// that ran the OOM killer has yet to mark it as the victim. Two
	// threads exiting together may both see zero; the one that removes
	// the watch reports.
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	if (bpf_map_delete_elem(&watched, &tgid) != 0)
		return 0;
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->ktime_ns = bpf_ktime_get_ns();
	e->pid = tgid;
	e->exit_code = BPF_CORE_READ(task, exit_code);
	e->kind = EVENT_EXIT;
	e->_pad = 0;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

// Layout of the oom/mark_victim tracepoint record up to the pid.
struct mark_victim_args {
	__u64 common;
	int pid;
};

SEC("tracepoint/oom/mark_victim")
int on_mark_victim(struct mark_victim_args *ctx) {
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->ktime_ns = bpf_ktime_get_ns();
	e->pid = ctx->pid;
	e->exit_code = 0;
	e->kind = EVENT_OOM_VICTIM;
	e->_pad = 0;
	bpf_ringbuf_submit(e, 0);
	return 0;
}
