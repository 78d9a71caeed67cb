// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// What the recorder's programs share: each record goes to a ring buffer
// without waking the reader (it polls; a wake-up per record costs
// microseconds in a VM), and a record the ring has no room for is counted
// in the ring's LOST_COUNTER, which bpf.rs reads at the end.
//
// The programs read kernel structures directly through the BTF-typed
// pointers their hooks hand them (the verifier makes those loads safe
// against a bad pointer), not with BPF_CORE_READ: its helper call per
// field was a third of the sched_switch programs' time. The structures
// are declared with preserve_access_index, so the field offsets still
// come from the running kernel's BTF.

// A per-CPU count of the records a ring had no room for, one per ring.
#define LOST_COUNTER(name)                                                     \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                       \
		__uint(max_entries, 1);                                        \
		__type(key, __u32);                                            \
		__type(value, __u64);                                          \
	} name SEC(".maps")

static __always_inline void output_or_count(void *ring, void *lost_counter, void *record,
					    __u64 size)
{
	if (bpf_ringbuf_output(ring, record, size, BPF_RB_NO_WAKEUP)) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(lost_counter, &zero);
		if (lost)
			(*lost)++;
	}
}
