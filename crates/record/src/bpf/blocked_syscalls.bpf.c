// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// deepspan record: each time a user thread goes to sleep inside a system
// call, which call it is, its first three arguments, and how many bytes
// the thread's read-like calls have returned so far.
//
// Why: to say what a blocked thread waits in (a read on which fd, a futex
// on which address, a sleep), the recorder has traced
// raw_syscalls:sys_enter/sys_exit with ftrace. Those two events put every
// thread of the host on the system-call slow path and are most of a
// trace's events. A call that never blocks needs no waiting-in answer:
// only a thread that leaves its CPU to sleep waits in something. So this
// program hooks the switch-out instead (the BTF-typed sched_switch
// tracepoint, which hands over the task itself) and reads the call from
// the sleeping thread's saved user registers, as /proc/PID/syscall does:
// once per sleep, not twice per call.
//
// Which switch-outs: not preempted and prev_state not TASK_RUNNING (the
// thread sleeps; a preempted thread waits for a CPU, not in its call), not
// TASK_DEAD (an exiting thread's last switch-out), not a kernel thread (it
// has no user registers), and not a 32-bit (ia32) call, whose numbers and
// argument registers differ (TS_COMPAT). orig_ax holds the system call
// number from the call's entry to its return to user space, and -1
// elsewhere: the entry of an exception or interrupt sets it to -1, so a
// thread sleeping in a page fault is left out too.
//
// The bytes read so far are the kernel's own per-thread count, `rchar` of
// task_io_accounting (/proc/PID/task/TID/io): vfs_read, vfs_readv,
// sendfile and copy_file_range add what they return. A read that hits the
// page cache never sleeps, so no switch-out sees it; the count at the
// thread's next sleep does, and two sleeps bracket the bytes read between
// them (a request's page-cache miss ratio without the system-call events).
// A kernel without CONFIG_TASK_XACCT has no such field: the record then
// says so (NO_READ_CHARS).
//
// x86_64 only: orig_ax and the argument registers di, si, dx are its
// names. Other architectures keep the number elsewhere (arm64:
// pt_regs.syscallno, its first argument in orig_x0 since x0 takes the
// return value); build.rs compiles this program for x86_64 alone, and the
// recorder says so elsewhere.
//
// The time is bpf_ktime_get_ns (CLOCK_MONOTONIC, the trace's clock). The
// reader polls the ring; no wake-up per record.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "ring.h"

#ifndef __TARGET_ARCH_x86
#error "blocked_syscalls.bpf.c reads x86_64 registers: build.rs compiles it for x86_64 only"
#endif

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

struct task_struct {
	struct thread_info thread_info;
	struct task_io_accounting ioac;
	unsigned int flags;
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

// One sleep in a system call, as blocked_syscalls.rs reads it (56 bytes,
// native byte order). The number is an int as the kernel's own
// syscall_get_nr makes it: the sys_enter event's id is the same value.
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

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	// Every sleep of every thread in a call: far more than the throttled
	// switch-outs. 2 MiB holds 32 000 records (56 bytes and the ring's
	// 8-byte header), 3.2 million a second at the reader's 10 ms.
	__uint(max_entries, 1 << 21);
} BLOCKED SEC(".maps");

// TASK_RUNNING: the task leaves its CPU without sleeping.
#define TASK_RUNNING 0
// TASK_DEAD: the task's last switch-out, on its way out.
#define TASK_DEAD 0x80
// PF_KTHREAD: a kernel thread.
#define PF_KTHREAD 0x00200000
// TS_COMPAT: the task is in a 32-bit system call.
#define TS_COMPAT 0x0002

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	if (preempt || prev_state == TASK_RUNNING || (prev_state & TASK_DEAD))
		return 0;
	if (prev->flags & PF_KTHREAD)
		return 0;
	if (prev->thread_info.status & TS_COMPAT)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)prev);
	if (!regs)
		return 0;
	int nr = (int)regs->orig_ax;
	if (nr < 0)
		return 0;
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
	output_or_count(&BLOCKED, &b, sizeof(b));
	return 0;
}

// bpf_task_pt_regs is for GPL-compatible programs only.
char LICENSE[] SEC("license") = "GPL";
