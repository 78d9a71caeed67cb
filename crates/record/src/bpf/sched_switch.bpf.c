// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// deepspan record: what the recorder takes at each context switch, in one
// program on the BTF-typed sched_switch tracepoint (which hands over the
// tasks themselves; the tracefs event carries none of the fields below):
// - THROTTLE: a thread leaving its CPU because its CPU cgroup ran out of
//   quota (throttle.rs);
// - BLOCKED: a user thread going to sleep inside a system call, which call,
//   its first three arguments and its bytes read so far
//   (blocked_syscalls.rs);
// - IDLE: an idle CPU's idle task handing the CPU to a thread
//   (idle_switches.rs).
// One program for the three, not three programs: a program's dispatch is
// about 50 ns of each run, paid on every switch of the host. The loader
// sets WITH_* for the parts it asks for; a part it leaves out is removed
// by the verifier as dead code, so a kernel that cannot run one part
// (before 6.18, no throttle mark) still runs the others (bpf.rs loads
// each part alone to find which one fails).
//
// Each part writes its own ring, read by its own thread into its own file.
// Times are bpf_ktime_get_ns (CLOCK_MONOTONIC, the trace's clock).
//
// THROTTLE. The scheduler has no tracepoint for throttling: in a trace a
// throttled thread is simply preempted, and only a quiet CPU tells its
// wait from contention (when other work keeps the CPU busy, throttling
// reads as contention). Since Linux 6.18 throttling is per task: when its
// cgroup runs out of quota, each of its tasks is dequeued on its way back
// to user space (the task work throttle_cfs_rq_work), marked `throttled`,
// and rescheduled; it stays marked until the quota is refilled and it is
// enqueued again. So a task that switches out still runnable and marked
// `throttled` leaves its CPU because of the quota. Its run queue must be
// in a throttled hierarchy at that moment too (`throttle_count`): a task
// taken off its CPU for the quota always has one, and the mark alone has
// been seen on a task in no quota-limited cgroup. Kernels before 6.18 have
// no such field: the part then fails to load, and the recorder says so.
//
// BLOCKED. What a blocked thread waits in (a read on which fd, a futex on
// which address, a sleep) has come from raw_syscalls:sys_enter/sys_exit,
// which put every thread of the host on the system-call slow path and are
// most of a trace's events. A call that never blocks needs no waiting-in
// answer: only a thread that leaves its CPU to sleep waits in something.
// So this part reads the call from the sleeping thread's saved user
// registers, as /proc/PID/syscall does: once per sleep, not twice per
// call. Which switch-outs: not preempted and prev_state not TASK_RUNNING
// (the thread sleeps; a preempted thread waits for a CPU, not in its
// call), not TASK_DEAD (an exiting thread's last switch-out), not a kernel
// thread (it has no user registers), and not a 32-bit (ia32) call, whose
// numbers and argument registers differ (TS_COMPAT). orig_ax holds the
// system call number from the call's entry to its return to user space,
// and -1 elsewhere: the entry of an exception or interrupt sets it to -1,
// so a thread sleeping in a page fault is left out too.
// The bytes read so far are the kernel's own per-thread count, `rchar` of
// task_io_accounting (/proc/PID/task/TID/io): vfs_read, vfs_readv,
// sendfile and copy_file_range add what they return. A read that hits the
// page cache never sleeps, so no switch-out sees it; the count at the
// thread's next sleep does, and two sleeps bracket the bytes read between
// them (a request's page-cache miss ratio without the system-call events).
// A kernel without CONFIG_TASK_XACCT has no such field: the record then
// says so (NO_READ_CHARS).
// x86_64 only: orig_ax and the argument registers di, si, dx are its
// names. Other architectures keep the number elsewhere (arm64:
// pt_regs.syscallno, its first argument in orig_x0 since x0 takes the
// return value); there the part is left out at compile time, and the
// recorder says so.
//
// IDLE. The kernel model needs every switch to know who runs where. On the
// Linux 6.18 VM this was written on, ftrace's ring buffer (and perf's)
// loses most sched_switch events out of the idle task, while the same
// tracepoint reaches a BPF program every time: in one 1 s window of a
// thread sleeping 5 ms at a time, this part counted 242 switches out of
// idle against 238 into it, and an ftrace instance recording over the
// same window kept 10 to 49 of the 242. The model infers a lost switch-in
// from the thread's next event of its own. With the system-call events
// that comes within microseconds; without them (the lean preset) it may
// be the thread's next switch-out, and the thread's whole run reads as a
// wait for a CPU. This record makes the switch exact whatever the preset.
// Only switches out of the idle task (prev pid 0, which every CPU's idle
// task has): the others ftrace keeps, and they are most switches on a
// busy host. Kernel threads are kept: the model needs every CPU's
// occupant. A switch ftrace did keep is recorded twice, once here; the
// model takes whichever comes first and skips the other.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "ring.h"

// Which parts run: set by the loader (bpf.rs), 0 or 1.
const volatile __u8 WITH_THROTTLE = 0;
const volatile __u8 WITH_BLOCKED = 0;
const volatile __u8 WITH_IDLE = 0;

struct pt_regs {
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

struct thread_info {
	__u32 status;
} __attribute__((preserve_access_index));

struct task_io_accounting {
	__u64 rchar;
} __attribute__((preserve_access_index));

struct cfs_rq {
	int throttle_count;
} __attribute__((preserve_access_index));

struct sched_entity {
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));

struct task_struct {
	struct thread_info thread_info;
	unsigned int flags;
	int pid;
	int tgid;
	_Bool throttled;
	struct sched_entity se;
	struct task_io_accounting ioac;
} __attribute__((preserve_access_index));

// THROTTLE's record, as throttle.rs reads it (16 bytes, native byte
// order).
struct held {
	__u64 ts;
	__u32 cpu;
	__s32 tid;
};

// BLOCKED's record, as blocked_syscalls.rs reads it (56 bytes, native byte
// order). The number is an int as the kernel's own syscall_get_nr makes
// it: the sys_enter event's id is the same value.
struct blocked {
	__u64 ts;
	__u32 cpu;
	__s32 tid;
	__s32 tgid;
	__s32 nr;
	__u64 args[3];
	// The thread's rchar, or NO_READ_CHARS.
	__u64 read_chars;
};

#define NO_READ_CHARS (~0ULL)

// IDLE's record, as idle_switches.rs reads it (24 bytes, native byte
// order).
struct idle_switch {
	__u64 ts;
	__u32 cpu;
	__s32 tid;
	__s32 tgid;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} HELD SEC(".maps");
LOST_COUNTER(HELD_LOST);

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	// Every sleep of every thread in a call: far more than the throttled
	// switch-outs. 2 MiB holds 32 000 records (56 bytes and the ring's
	// 8-byte header), 3.2 million a second at the reader's 10 ms.
	__uint(max_entries, 1 << 21);
} BLOCKED SEC(".maps");
LOST_COUNTER(BLOCKED_LOST);

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	// At most one record per wake-up of an idle CPU: tens of thousands a
	// second. 1 MiB holds 32 000 records (24 bytes and the ring's 8-byte
	// header), 320 000 a second at the reader's slowest 100 ms.
	__uint(max_entries, 1 << 20);
} SWITCHES SEC(".maps");
LOST_COUNTER(SWITCHES_LOST);

// TASK_RUNNING: the task leaves its CPU without sleeping.
#define TASK_RUNNING 0
// TASK_DEAD: the task's last switch-out, on its way out.
#define TASK_DEAD 0x80
// PF_KTHREAD: a kernel thread.
#define PF_KTHREAD 0x00200000
// TS_COMPAT: the task is in a 32-bit system call.
#define TS_COMPAT 0x0002

static __always_inline void idle_switch(struct task_struct *next)
{
	int tid = next->pid;
	if (tid == 0)
		return;
	struct idle_switch s = {};
	s.ts = bpf_ktime_get_ns();
	s.cpu = bpf_get_smp_processor_id();
	s.tid = tid;
	s.tgid = next->tgid;
	output_or_count(&SWITCHES, &SWITCHES_LOST, &s, sizeof(s));
}

static __always_inline void throttled(struct task_struct *prev)
{
	if (!prev->throttled)
		return;
	struct cfs_rq *cfs_rq = prev->se.cfs_rq;
	if (!cfs_rq || cfs_rq->throttle_count <= 0)
		return;
	struct held h = {};
	h.ts = bpf_ktime_get_ns();
	h.cpu = bpf_get_smp_processor_id();
	h.tid = prev->pid;
	output_or_count(&HELD, &HELD_LOST, &h, sizeof(h));
}

#ifdef __TARGET_ARCH_x86
static __always_inline void sleep_in_call(struct task_struct *prev)
{
	if (prev->flags & PF_KTHREAD)
		return;
	if (prev->thread_info.status & TS_COMPAT)
		return;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)prev);
	if (!regs)
		return;
	int nr = (int)regs->orig_ax;
	if (nr < 0)
		return;
	struct blocked b = {};
	b.ts = bpf_ktime_get_ns();
	b.cpu = bpf_get_smp_processor_id();
	b.tid = prev->pid;
	b.tgid = prev->tgid;
	b.nr = nr;
	b.args[0] = regs->di;
	b.args[1] = regs->si;
	b.args[2] = regs->dx;
	if (bpf_core_field_exists(prev->ioac))
		b.read_chars = prev->ioac.rchar;
	else
		b.read_chars = NO_READ_CHARS;
	output_or_count(&BLOCKED, &BLOCKED_LOST, &b, sizeof(b));
}
#endif

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	// The idle task is never throttled and never in a call.
	if (prev->pid == 0) {
		if (WITH_IDLE)
			idle_switch(next);
		return 0;
	}
	if (prev_state == TASK_RUNNING) {
		if (WITH_THROTTLE)
			throttled(prev);
		return 0;
	}
#ifdef __TARGET_ARCH_x86
	if (WITH_BLOCKED && !preempt && !(prev_state & TASK_DEAD))
		sleep_in_call(prev);
#endif
	return 0;
}

// bpf_task_pt_regs is for GPL-compatible programs only.
char LICENSE[] SEC("license") = "GPL";
