// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// deepspan record: each time an idle CPU's idle task hands the CPU to a
// thread: when, which CPU, which thread.
//
// Why: the kernel model needs every switch to know who runs where. On the
// Linux 6.18 VM this was written on, ftrace's ring buffer (and perf's)
// loses most sched_switch events out of the idle task, while the same
// tracepoint reaches a BPF program every time: in one 1 s window of a
// thread sleeping 5 ms at a time, this program counted 242 switches out
// of idle against 238 into it, and an ftrace instance recording over the
// same window kept 10 to 49 of the 242. The model infers a lost switch-in
// from the thread's next event of its own. With the system-call events
// that comes within microseconds; without them (the lean preset) it may
// be the thread's next switch-out, and the thread's whole run reads as a
// wait for a CPU. This record makes the switch exact whatever the preset.
//
// Only switches out of the idle task (prev pid 0, which every CPU's idle
// task has): the others ftrace keeps, and they are most switches on a
// busy host. Kernel threads are kept: the model needs every CPU's
// occupant. A switch ftrace did keep is recorded twice, once here; the
// model takes whichever comes first and skips the other.
//
// The time is bpf_ktime_get_ns (CLOCK_MONOTONIC, the trace's clock). The
// reader polls the ring; no wake-up per record.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "ring.h"

struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

// One switch out of idle, as idle_switches.rs reads it (24 bytes, native
// byte order).
struct idle_switch {
	__u64 ts;
	__u32 cpu;
	__s32 tid;
	__s32 tgid;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	// At most one record per wake-up of an idle CPU: tens of thousands a
	// second. 1 MiB holds 32 000 records (24 bytes and the ring's 8-byte
	// header), 320 000 a second at the reader's slowest 100 ms.
	__uint(max_entries, 1 << 20);
} SWITCHES SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	if (prev->pid != 0)
		return 0;
	int tid = next->pid;
	if (tid == 0)
		return 0;
	struct idle_switch s = {};
	s.ts = bpf_ktime_get_ns();
	s.cpu = bpf_get_smp_processor_id();
	s.tid = tid;
	s.tgid = next->tgid;
	output_or_count(&SWITCHES, &s, sizeof(s));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
