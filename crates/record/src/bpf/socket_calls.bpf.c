// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// deepspan record: each time a user thread's socket receive returned data
// and each time its socket send sent data: when, and how many bytes.
//
// Why: a thread of a program without a tracing SDK still has its requests
// in the trace: a server reads a request from a socket, works, and writes
// its response. The end of that receive and the start of that send place
// a span on the thread. Those have come from the raw_syscalls:sys_enter
// and sys_exit events, which put every thread of the host on the
// system-call slow path and are most of a trace's events; a recording
// without them (the lean preset) keeps this evidence from this program
// instead, at one record per socket call rather than two events per
// system call of any kind.
//
// Which hooks: the BTF-typed tracepoints sock_recv_length and
// sock_send_length, which net/socket.c fires as a socket's protocol
// returns from its recvmsg or sendmsg (sock_recvmsg_nosec,
// sock_sendmsg_nosec), with the protocol's return value:
// - sock_recv_length with ret > 0: a `recv` record, bytes = ret. recvfrom,
//   recvmsg, recvmmsg and read()/readv() on a socket all reach it, at the
//   point sock_recvmsg returns from (its return follows within a few
//   instructions).
// - sock_send_length with ret > 0: a `send` record, bytes = ret. sendto,
//   sendmsg, sendmmsg and write()/writev() on a socket all reach it.
//
// Not the hooks first meant (fexit on sock_recvmsg for a receive's
// return, fentry on security_socket_sendmsg for a send's start and the
// bytes asked): on the Linux 6.18 VM this was written on, every program
// that attaches through a BPF trampoline (fentry, fexit, lsm) fails to
// load with EPERM and an empty verifier log (on sock_recvmsg,
// security_socket_sendmsg, tcp_sendmsg, do_nanosleep alike), and the
// kernel has no kprobes; tracepoints load. The cost of the tracepoints: a
// send's record is taken at its END, not its start, with the bytes it
// sent, not those asked for, and a send that failed (EAGAIN, EPIPE) has
// none. For a blocking send that is the same byte count; its time is the
// end of the copy into the socket (for TCP, once the data is queued, not
// acknowledged). A kernel without these tracepoints fails to load the
// program, and the recorder says so.
//
// Every socket family (TCP, UDP, Unix, ...). Kernel threads (PF_KTHREAD)
// are left out: their sends and receives (NFS, kernel sockets) are no
// span's.
//
// Which socket: its cookie (bpf_get_socket_cookie: a number the kernel
// gives each socket once, unique since boot), so that the receive of a
// request on one thread and the send of its answer on another are known
// to be the same connection's; and for TCP and UDP over IPv4 or IPv6 its
// local and remote ports, which a span names as server.port and
// client.port (or net.host.port and net.peer.port): a connection's
// requests are then told from the other connections' on the same threads.
// Other families have no ports: 0.
//
// The time is bpf_ktime_get_ns (CLOCK_MONOTONIC, the trace's clock). The
// reader polls the ring; no wake-up per record.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>

#include "ring.h"

struct sock_common {
	unsigned short skc_family;
	// Network byte order.
	__be16 skc_dport;
	// Host byte order.
	__u16 skc_num;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int flags;
} __attribute__((preserve_access_index));

// One socket call, as socket_calls.rs reads it (48 bytes, native byte
// order).
struct call {
	__u64 ts;
	__u32 cpu;
	__s32 tid;
	__s32 tgid;
	// 0: a receive returned data, 1: a send sent data.
	__u32 sent;
	__u64 bytes;
	__u64 cookie;
	// Host byte order; 0 for a family without ports.
	__u16 local_port;
	__u16 remote_port;
	__u32 pad;
};

#define AF_INET 2
#define AF_INET6 10

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	// A busy server makes a few hundred thousand socket calls a second.
	// 2 MiB holds 37 000 records (48 bytes and the ring's 8-byte header),
	// 3.7 million a second at the reader's 10 ms.
	__uint(max_entries, 1 << 21);
} CALLS SEC(".maps");
LOST_COUNTER(LOST);

// PF_KTHREAD: a kernel thread.
#define PF_KTHREAD 0x00200000

static __always_inline void output(struct sock *sk, __u32 sent, __u64 bytes)
{
	struct task_struct *task = bpf_get_current_task_btf();
	if (task->flags & PF_KTHREAD)
		return;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct call c = {};
	c.ts = bpf_ktime_get_ns();
	c.cpu = bpf_get_smp_processor_id();
	c.tid = (__s32)pid_tgid;
	c.tgid = (__s32)(pid_tgid >> 32);
	c.sent = sent;
	c.bytes = bytes;
	c.cookie = bpf_get_socket_cookie(sk);
	unsigned short family = sk->__sk_common.skc_family;
	if (family == AF_INET || family == AF_INET6) {
		c.local_port = sk->__sk_common.skc_num;
		c.remote_port = bpf_ntohs(sk->__sk_common.skc_dport);
	}
	output_or_count(&CALLS, &LOST, &c, sizeof(c));
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(sock_recv_length, struct sock *sk, int ret, int flags)
{
	if (ret > 0)
		output(sk, 0, (__u64)ret);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(sock_send_length, struct sock *sk, int ret, int flags)
{
	if (ret > 0)
		output(sk, 1, (__u64)ret);
	return 0;
}

// bpf_get_current_task_btf is for GPL-compatible programs only.
char LICENSE[] SEC("license") = "GPL";
