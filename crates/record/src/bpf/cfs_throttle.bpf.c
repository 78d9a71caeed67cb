// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// deepspan record: each time a thread leaves its CPU because its CPU
// cgroup ran out of quota (CFS bandwidth throttling). The scheduler has no
// tracepoint for throttling: in a trace a throttled thread is simply
// preempted, and only a quiet CPU tells its wait from contention (when
// other work keeps the CPU busy, throttling reads as contention).
//
// Since Linux 6.18 throttling is per task: when its cgroup runs out of
// quota, each of its tasks is dequeued on its way back to user space (the
// task work throttle_cfs_rq_work), marked `throttled`, and rescheduled; it
// stays marked until the quota is refilled and it is enqueued again. So a
// task that switches out still runnable and marked `throttled` leaves its
// CPU because of the quota. Its run queue must be in a throttled hierarchy
// at that moment too (`throttle_count`): a task taken off its CPU for the
// quota always has one, and the mark alone has been seen on a task in no
// quota-limited cgroup. The hook is the BTF-typed sched_switch
// tracepoint, which reads the task itself (the tracefs event carries no
// such field). Kernels before 6.18 have no such field: the program then
// fails to load, and the recorder says so.
//
// The time is bpf_ktime_get_ns (CLOCK_MONOTONIC, the trace's clock). The
// reader polls the ring; no wake-up per record.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "ring.h"

struct cfs_rq {
	int throttle_count;
} __attribute__((preserve_access_index));

struct sched_entity {
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	_Bool throttled;
	struct sched_entity se;
} __attribute__((preserve_access_index));

// One switch-out, as throttle.rs reads it (16 bytes, native byte order).
struct held {
	__u64 ts;
	__u32 cpu;
	__s32 tid;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} HELD SEC(".maps");

// TASK_RUNNING: the task leaves its CPU without sleeping.
#define TASK_RUNNING 0

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	if (prev_state != TASK_RUNNING || !prev->throttled)
		return 0;
	struct cfs_rq *cfs_rq = prev->se.cfs_rq;
	if (!cfs_rq || cfs_rq->throttle_count <= 0)
		return 0;
	struct held h = {};
	h.ts = bpf_ktime_get_ns();
	h.cpu = bpf_get_smp_processor_id();
	h.tid = prev->pid;
	output_or_count(&HELD, &h, sizeof(h));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
