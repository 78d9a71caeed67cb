// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// deepspan record --tcp-keys: every TCP segment as it leaves a device
// (net:net_dev_queue) and as it arrives (net:netif_receive_skb), with the
// header fields that are the same at both ends (seq, ack_seq, flags: Trace
// Compass's TcpEventKey), for `deepspan sync` across hosts. The upstream
// tracepoints carry only the skb's address; the header is read through it.
//
// The time is read first, with bpf_ktime_get_ns (CLOCK_MONOTONIC, the
// trace's clock), and other namespaces' packets are left at once: on one
// kernel (network namespaces recorded as hosts) every recorder's program
// runs at every packet, in turn, and a time read after another program's
// work would make one direction of the traffic look slower than the other.
// Segments go to a ring buffer without waking the reader (it polls): a
// wake-up per packet costs microseconds in a VM, which would be added to
// the packet's own time in flight, unevenly.
//
// At net_dev_queue the network header offset is set and skb->data is the
// link-layer header; at netif_receive_skb the link-layer header has been
// pulled, so skb->data is the network header. IPv4 (with options) and IPv6
// without extension headers.
//
// Kernel types are declared with the fields used only; CO-RE relocates
// them against the running kernel's BTF at load.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "ring.h"

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	possible_net_t nd_net;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
	unsigned int len;
	__u16 network_header;
	unsigned char *head;
	unsigned char *data;
} __attribute__((preserve_access_index));

// One segment, as tcpkeys.rs reads it (48 bytes, native byte order).
struct segment {
	__u64 ts;
	__u64 netns;
	__u32 cpu;
	__s32 tid;
	__u32 seq;
	__u32 ack_seq;
	__u32 len;
	__u16 sport;
	__u16 dport;
	__u8 flags;
	__u8 sent;
	__u8 pad[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} SEGMENTS SEC(".maps");
LOST_COUNTER(LOST);

// The network namespaces (inodes) to keep; all zero keeps every one.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} NETNS SEC(".maps");


// The tracepoints' record: the common header, then the skb's address.
struct skb_event {
	__u64 common;
	void *skbaddr;
};

static __always_inline int kept(__u64 netns)
{
	int any = 0;
	for (__u32 i = 0; i < 4; i++) {
		__u32 k = i;
		__u64 *v = bpf_map_lookup_elem(&NETNS, &k);
		if (!v || *v == 0)
			continue;
		any = 1;
		if (*v == netns)
			return 1;
	}
	return !any;
}

static __always_inline __u32 be32(const __u8 *b)
{
	return ((__u32)b[0] << 24) | ((__u32)b[1] << 16) | ((__u32)b[2] << 8) | b[3];
}

static __always_inline int record(struct skb_event *ctx, int sent)
{
	__u64 ts = bpf_ktime_get_ns();
	struct sk_buff *skb = ctx->skbaddr;
	__u64 netns = BPF_CORE_READ(skb, dev, nd_net.net, ns.inum);
	if (!kept(netns))
		return 0;
	unsigned char *ip = sent ? BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, network_header)
				 : BPF_CORE_READ(skb, data);
	__u8 first = 0, proto = 0;
	unsigned char *th;
	if (bpf_probe_read_kernel(&first, 1, ip))
		return 0;
	if ((first >> 4) == 4) {
		bpf_probe_read_kernel(&proto, 1, ip + 9);
		th = ip + (first & 15) * 4;
	} else if ((first >> 4) == 6) {
		bpf_probe_read_kernel(&proto, 1, ip + 6);
		th = ip + 40;
	} else {
		return 0;
	}
	__u8 tcp[14];
	if (proto != 6 || bpf_probe_read_kernel(tcp, sizeof(tcp), th))
		return 0;
	struct segment s = {};
	s.ts = ts;
	s.netns = netns;
	s.cpu = bpf_get_smp_processor_id();
	s.tid = (__s32)bpf_get_current_pid_tgid();
	s.sport = ((__u16)tcp[0] << 8) | tcp[1];
	s.dport = ((__u16)tcp[2] << 8) | tcp[3];
	s.seq = be32(tcp + 4);
	s.ack_seq = be32(tcp + 8);
	s.flags = tcp[13];
	s.len = BPF_CORE_READ(skb, len);
	s.sent = sent;
	output_or_count(&SEGMENTS, &LOST, &s, sizeof(s));
	return 0;
}

SEC("tracepoint/net/net_dev_queue")
int net_dev_queue(struct skb_event *ctx)
{
	return record(ctx, 1);
}

SEC("tracepoint/net/netif_receive_skb")
int netif_receive_skb(struct skb_event *ctx)
{
	return record(ctx, 0);
}

// bpf_probe_read_kernel is for GPL-compatible programs only.
char LICENSE[] SEC("license") = "GPL";
