//! Who woke a thread: the rules that give a BLOCKED interval its
//! [`BlockReason`] when its wake-up comes, in one place and in their
//! order ([`StateBuilder::waker_of`]), with the facts they read: an
//! interrupt frame's reason, the system call a thread sleeps in.
//!
//! The wake-up handler (`builder`) only applies the answer: the reason,
//! the graph edge from a waking thread or sender, the network ends.

use deepspan_model::{softirq, Tid};

use crate::syscalls::syscall_name;

use super::builder::Frame;
use super::network::fresh_segment;
use super::{BlockReason, Interrupt, StateBuilder};

/// What ended a sleep: a thread (the wait's reason is then `Thread`,
/// with a wake-up edge from it), or a context that is no thread: an
/// interrupt, a device, a packet (whose sender, when known, also gets an
/// edge).
#[derive(Clone, Copy)]
pub(super) enum Waker {
    Thread(Tid),
    Context(BlockReason),
}

impl StateBuilder {
    /// Who (or what) ended the sleep of thread record `target`, woken at
    /// `ts` by an event on `cpu` whose context was thread `ev_tid`.
    /// `None` when that is the target itself (rule 8): the wake-up is
    /// then spurious, counted, and changes nothing.
    ///
    /// The first rule that applies answers. They go from the surest sign
    /// of what ran the wake-up to the weakest: the event's own thread when
    /// it is another host's, then the CPU's interrupt context, then what
    /// the thread on the CPU received since its switch-in, and only then
    /// that thread itself.
    ///
    /// 1. `ev_tid` is another host's thread (see [`StateBuilder::hosts`]):
    ///    a packet from it, `PacketFrom(ev_tid)`, counted in
    ///    `wakeups_from_other_hosts`. First because the kernel the hosts
    ///    share delivered the packet in that thread's context, and this
    ///    CPU's record, this host's view, has none of that thread's run:
    ///    its frames and current thread did not run the wake-up.
    /// 2. In an interrupt frame, a lone NET_RX softirq (nothing nested in
    ///    it) that received a local packet (loopback, or a virtual
    ///    pair's) whose sender is known and is not the target:
    ///    `PacketFrom(sender)`. Before 3 because it is 3's NETWORK with the
    ///    sender named, which gives the wait an edge from it; the target's
    ///    own packet is left to rule 3.
    /// 3. In an interrupt frame: the innermost frame's reason (timer,
    ///    block device, network, IPI, user input, another irq or softirq:
    ///    [`StateBuilder::frame_reason`]). Interrupt code runs on top of
    ///    the current thread without being it, so a frame outranks every
    ///    rule about that thread.
    /// 4. In thread context, a block request completed on the CPU since
    ///    its last switch: BLOCK_DEVICE. The thread completed I/O (a
    ///    threaded handler, polling) and the wake-up is that completion,
    ///    not the thread's own doing.
    /// 5. In thread context, a packet received since the last switch:
    ///    NETWORK, for the same reason. After 4 only because one must come
    ///    first: both say an I/O completion.
    /// 6. In thread context, a recorded TCP segment received on the CPU
    ///    since the last switch and within
    ///    [`SEGMENT_WAKE_NS`](crate::SEGMENT_WAKE_NS), and a target asleep
    ///    in a call that may wait for one
    ///    ([`StateBuilder::may_wait_for_network`]): NETWORK. The softirq
    ///    that received it ran here with its events missing (ksoftirqd, a
    ///    pid filter). After 4 and 5, which already say I/O from the
    ///    trace's own events; before 7, because the segment is evidence
    ///    where 7 can only guess (and 7's one firm answer, a timer for a
    ///    sleep, is for calls 6 leaves alone).
    /// 7. The thread on the CPU (its current one, else `ev_tid`) is a
    ///    recorder thread (see [`StateBuilder::recorder_threads`]): an
    ///    interrupt its pid filter hid,
    ///    [`StateBuilder::hidden_interrupt_reason`] (TIMER for a target
    ///    in `nanosleep`, else unexplained), counted in
    ///    `wakeups_under_recorder`. Before 8 and 9 because the recorder
    ///    never wakes the threads it traces: naming it would be wrong.
    /// 8. That thread is the target: `None`, counted in
    ///    `spurious_wakeups`. A thread cannot end its own sleep: it runs
    ///    its own wake-up only before it has switched out (the kernel
    ///    then keeps it running), or the CPU's record missed its
    ///    switch-out. After 1-7, which each name something other than
    ///    the thread; before 9, which would link the thread to itself.
    /// 9. That thread: `Thread(tid)`, one thread waking another.
    /// 10. No thread (the idle task, nothing known of the CPU):
    ///     unexplained.
    pub(super) fn waker_of(
        &mut self,
        ts: u64,
        cpu: u32,
        ev_tid: Tid,
        target: usize,
    ) -> Option<Waker> {
        let target_tid = self.threads[target].hist.tid;
        // 1. Another host's thread.
        if self.is_on_other_host(cpu, ev_tid) {
            self.stats.wakeups_from_other_hosts += 1;
            return Some(Waker::Context(BlockReason::PacketFrom(ev_tid)));
        }
        let Some(c) = self.cpus.get(cpu as usize) else {
            // 10. Nothing known of the CPU.
            return Some(Waker::Context(BlockReason::Unexplained));
        };
        if let Some(frame) = c.stack.last() {
            // 2. A local packet's sender.
            if let Some(sender) = self.loopback_sender(cpu).filter(|&s| s != target_tid) {
                return Some(Waker::Context(BlockReason::PacketFrom(sender)));
            }
            // 3. The innermost frame.
            return Some(Waker::Context(self.frame_reason(frame)));
        }
        // 4. A block completion in thread context.
        if c.thread_block {
            return Some(Waker::Context(BlockReason::BlockDevice));
        }
        // 5. A packet in thread context.
        if c.thread_packet {
            return Some(Waker::Context(BlockReason::Network));
        }
        // 6. A fresh segment, for a target that may wait for one.
        if fresh_segment(c, ts).is_some() && self.may_wait_for_network(target) {
            return Some(Waker::Context(BlockReason::Network));
        }
        let thread = c
            .current
            .or((ev_tid >= 0).then_some(ev_tid))
            .filter(|&tid| tid > 0);
        match thread {
            // 7. A recorder thread: an interrupt it hid.
            Some(tid) if self.recorder_tids.contains(&tid) => {
                self.stats.wakeups_under_recorder += 1;
                Some(Waker::Context(self.hidden_interrupt_reason(target)))
            }
            // 8. The target itself.
            Some(tid) if tid == target_tid => {
                self.stats.spurious_wakeups += 1;
                None
            }
            // 9. The thread on the CPU.
            Some(tid) => Some(Waker::Thread(tid)),
            // 10. The idle task, or no thread known.
            None => Some(Waker::Context(BlockReason::Unexplained)),
        }
    }

    /// The name of the system call thread record `t` is in, when the
    /// trace (or the recorder's sleep capture) names or numbers it.
    fn open_call_name(&self, t: usize) -> Option<&str> {
        let call = self.threads[t].open_syscall.as_ref()?;
        match call.name {
            0 => syscall_name(self.arch, call.id),
            n => self.syscall_names.names.get(n as usize).map(|n| &**n),
        }
    }

    /// Whether thread `t` may be waiting for a packet: blocked in a system
    /// call that waits on sockets or file descriptors (or in one the trace
    /// does not show). A sleep, a futex or a child's exit is not ended by
    /// a segment that arrived on the CPU meanwhile.
    fn may_wait_for_network(&self, t: usize) -> bool {
        match self.open_call_name(t) {
            None => true,
            Some(name) => matches!(
                name,
                "read"
                    | "readv"
                    | "recvfrom"
                    | "recvmsg"
                    | "recvmmsg"
                    | "write"
                    | "writev"
                    | "sendto"
                    | "sendmsg"
                    | "sendmmsg"
                    | "accept"
                    | "accept4"
                    | "connect"
                    | "poll"
                    | "ppoll"
                    | "select"
                    | "pselect6"
                    | "epoll_wait"
                    | "epoll_pwait"
                    | "epoll_pwait2"
                    | "io_uring_enter"
                    | "splice"
                    | "sendfile"
                    | "sendfile64"
            ),
        }
    }

    /// Why an interrupt whose events the trace lacks woke thread `t`: see
    /// [`StateBuilder::recorder_threads`].
    fn hidden_interrupt_reason(&self, t: usize) -> BlockReason {
        match self.open_call_name(t) {
            Some("nanosleep" | "clock_nanosleep" | "clock_nanosleep_time64") => BlockReason::Timer,
            _ => BlockReason::Unexplained,
        }
    }

    /// Why a wake-up in interrupt frame `f` happened: what the interrupt
    /// is for, or, for a handler that says nothing by its kind, what it
    /// completed (a block request, a packet).
    fn frame_reason(&self, f: &Frame) -> BlockReason {
        let by_flags = || {
            if f.block {
                Some(BlockReason::BlockDevice)
            } else if f.packet {
                Some(BlockReason::Network)
            } else {
                None
            }
        };
        match f.kind {
            Interrupt::Hrtimer => BlockReason::Timer,
            Interrupt::Ipi if f.timer_ipi => BlockReason::Timer,
            Interrupt::Ipi => BlockReason::Ipi,
            Interrupt::Softirq(v) => match v {
                softirq::TIMER | softirq::HRTIMER => BlockReason::Timer,
                softirq::BLOCK | softirq::IRQ_POLL => BlockReason::BlockDevice,
                softirq::NET_RX | softirq::NET_TX => BlockReason::Network,
                softirq::SCHED => BlockReason::Interrupted,
                _ => by_flags().unwrap_or(BlockReason::Softirq(v)),
            },
            Interrupt::Irq(irq) => by_flags().unwrap_or_else(|| {
                if irq == 0 {
                    BlockReason::Interrupted
                } else if self.irq_names.get(&irq).is_some_and(|n| is_input_device(n)) {
                    BlockReason::UserInput
                } else {
                    BlockReason::Irq(irq)
                }
            }),
        }
    }
}

/// Whether an interrupt line's name is an input device's (keyboard,
/// mouse, tty, evdev …): a wake-up by it is a person's input.
fn is_input_device(name: &str) -> bool {
    const INPUT: [&str; 10] = [
        "i8042", "keyboard", "kbd", "mouse", "evdev", "input", "hid", "tty", "serial", "touch",
    ];
    let lower = name.to_ascii_lowercase();
    INPUT.iter().any(|k| lower.contains(k))
}

#[cfg(test)]
mod tests {
    //! One test per rule of [`StateBuilder::waker_of`], on small event
    //! streams: thread 1 blocks on CPU 0 in a system call, and what ran on
    //! CPU 1 when a `sched_waking` of it came there gives its wait a
    //! reason. Where an earlier rule must win, the stream also has what a
    //! later rule would answer to.

    use deepspan_model::{BlockRq, Comm, Event, EventKind, Name, Packet, SchedSwitch, Tid, Wakeup};

    use super::super::{
        host_tid, KernelModel, ModelStats, PacketDirection, ThreadState, SEGMENT_WAKE_NS,
    };
    use super::*;
    use crate::syscalls::Arch;

    /// Blocks on CPU 0 at 20, woken on CPU 1 at [`WAKE_AT`] or later.
    const SLEEPER: Tid = 1;
    /// Runs on CPU 1 from 10.
    const WAKER: Tid = 2;
    /// A recorder thread, when one runs on CPU 1 instead.
    const RECORDER: Tid = 99;
    const WAKE_AT: u64 = 30;

    /// Events fed to a builder in the order they are added.
    struct Stream {
        builder: StateBuilder,
    }

    impl Stream {
        /// Thread 1 runs on CPU 0 from 10 and enters system call `call`
        /// at 15; `on_cpu1` runs on CPU 1 from 10 (0: the idle task).
        fn running_in(builder: StateBuilder, call: &str, on_cpu1: Tid) -> Stream {
            let mut s = Stream { builder };
            let enter = EventKind::SysEnter {
                id: -1,
                name: Some(Name::new(call)),
                args: [0; 6],
            };
            s.switch(10, 0, 0, 0, SLEEPER)
                .switch(10, 1, 0, 0, on_cpu1)
                .ev(15, 0, SLEEPER, enter);
            s
        }

        /// As [`Stream::running_in`], and thread 1 blocks in the call at 20.
        fn sleeping_in(builder: StateBuilder, call: &str, on_cpu1: Tid) -> Stream {
            let mut s = Stream::running_in(builder, call, on_cpu1);
            s.switch(20, 0, SLEEPER, 1, 0);
            s
        }

        fn ev(&mut self, ts: u64, cpu: u32, tid: Tid, kind: EventKind) -> &mut Self {
            self.builder.push(&Event { ts, cpu, tid, kind });
            self
        }

        fn switch(&mut self, ts: u64, cpu: u32, prev: Tid, state: i64, next: Tid) -> &mut Self {
            let switch = SchedSwitch {
                prev_tid: prev,
                prev_comm: comm(prev),
                prev_prio: 120,
                prev_state: state,
                next_tid: next,
                next_comm: comm(next),
                next_prio: 120,
            };
            self.ev(ts, cpu, -1, EventKind::SchedSwitch(switch))
        }

        /// A `sched_waking` of `target` on `cpu`, in the context of `tid`.
        fn waking(&mut self, ts: u64, cpu: u32, tid: Tid, target: Tid) -> &mut Self {
            let wakeup = Wakeup {
                tid: target,
                comm: comm(target),
                prio: 120,
                target_cpu: cpu as i32,
            };
            self.ev(ts, cpu, tid, EventKind::SchedWaking(wakeup))
        }

        /// A TCP segment received on `cpu` outside any frame.
        fn segment(&mut self, ts: u64, cpu: u32, tid: Tid) -> &mut Self {
            self.builder
                .segment(ts, cpu, tid, 0x5e6, PacketDirection::Received);
            self
        }

        fn finish(self) -> KernelModel {
            self.builder.finish()
        }
    }

    fn comm(tid: Tid) -> Comm {
        Comm::from_bytes(format!("t{tid}").as_bytes())
    }

    fn packet(dev: &str) -> Packet {
        Packet {
            skbaddr: 0xff00,
            len: 100,
            dev: Name::new(dev),
        }
    }

    fn block_completion() -> EventKind {
        EventKind::BlockRqComplete(BlockRq {
            dev: 253 << 20,
            sector: 0,
            nr_sector: 8,
            rwbs: *b"R\0\0\0\0\0\0\0",
            error: 0,
        })
    }

    fn hrtimer_entry(now: u64) -> EventKind {
        EventKind::HrtimerExpireEntry {
            hrtimer: 1,
            function: 2,
            now: now as i64,
        }
    }

    /// The reason of thread 1's wait (blocked from 20 until its wake-up).
    fn wait_reason(m: &KernelModel) -> BlockReason {
        match m.thread(SLEEPER).unwrap().state_at(25).unwrap().state {
            ThreadState::Blocked(reason) => reason,
            state => panic!("thread 1 is not blocked at 25 but {state:?}"),
        }
    }

    /// The counters `waker_of` keeps: (other hosts, under the recorder,
    /// spurious).
    fn waker_counts(stats: &ModelStats) -> (u64, u64, u64) {
        (
            stats.wakeups_from_other_hosts,
            stats.wakeups_under_recorder,
            stats.spurious_wakeups,
        )
    }

    #[test]
    fn rule_1_another_hosts_thread_is_a_packet_from_it_even_in_a_frame() {
        // CPUs 0 and 1 are host 0's; thread 7 of host 1 runs the wake-up
        // while host 0's record has a timer frame open (rule 3's answer).
        let other = host_tid(1, 7);
        let mut s = Stream::sleeping_in(StateBuilder::new().hosts(vec![0, 0]), "read", WAKER);
        s.ev(25, 1, WAKER, hrtimer_entry(25))
            .waking(WAKE_AT, 1, other, SLEEPER)
            .ev(31, 1, WAKER, EventKind::HrtimerExpireExit { hrtimer: 1 });
        let m = s.finish();
        assert_eq!(wait_reason(&m), BlockReason::PacketFrom(other));
        assert_eq!(waker_counts(m.stats()), (1, 0, 0));
    }

    /// Thread 1 woken at 30 in a NET_RX softirq on CPU 1 that received a
    /// loopback packet, queued by thread 2 on CPU 1 at 25 or, when
    /// `own_packet`, by thread 1 before it blocked.
    fn loopback_wake(own_packet: bool) -> KernelModel {
        let mut s = Stream::running_in(StateBuilder::new(), "recvfrom", WAKER);
        let queue = || EventKind::NetDevQueue(packet("lo"));
        if own_packet {
            s.ev(18, 0, SLEEPER, queue());
        }
        s.switch(20, 0, SLEEPER, 1, 0);
        if !own_packet {
            s.ev(25, 1, WAKER, queue());
        }
        let net_rx = softirq::NET_RX;
        s.ev(26, 1, WAKER, EventKind::SoftirqEntry { vec: net_rx })
            .ev(27, 1, WAKER, EventKind::NetifReceiveSkb(packet("lo")))
            .waking(WAKE_AT, 1, WAKER, SLEEPER)
            .ev(31, 1, WAKER, EventKind::SoftirqExit { vec: net_rx });
        s.finish()
    }

    #[test]
    fn rule_2_a_loopback_packet_in_a_net_rx_softirq_names_its_sender() {
        let m = loopback_wake(false);
        assert_eq!(wait_reason(&m), BlockReason::PacketFrom(WAKER));
        assert_eq!(waker_counts(m.stats()), (0, 0, 0));
    }

    #[test]
    fn rule_2_leaves_the_targets_own_packet_to_rule_3() {
        // Thread 1 queued the packet itself before it blocked: NETWORK,
        // no edge from the thread to itself.
        let m = loopback_wake(true);
        assert_eq!(wait_reason(&m), BlockReason::Network);
    }

    #[test]
    fn rule_3_the_innermost_frame_outranks_the_thread_and_its_marks() {
        // Thread 2 completed a block request (rule 4's mark), then an irq
        // with a timer nested in it runs the wake-up.
        let mut s = Stream::sleeping_in(StateBuilder::new(), "read", WAKER);
        let irq = EventKind::IrqHandlerEntry {
            irq: 9,
            name: Name::new("acpi"),
        };
        s.ev(24, 1, WAKER, block_completion())
            .ev(25, 1, WAKER, irq)
            .ev(26, 1, WAKER, hrtimer_entry(26))
            .waking(WAKE_AT, 1, WAKER, SLEEPER)
            .ev(31, 1, WAKER, EventKind::HrtimerExpireExit { hrtimer: 1 })
            .ev(32, 1, WAKER, EventKind::IrqHandlerExit { irq: 9, ret: 1 });
        let m = s.finish();
        assert_eq!(wait_reason(&m), BlockReason::Timer);
    }

    #[test]
    fn rule_4_a_block_completion_in_thread_context_outranks_packets_and_segments() {
        // Thread 2 also received a packet (rule 5) and a recorded segment
        // came on its CPU (rule 6) for a reader.
        let mut s = Stream::sleeping_in(StateBuilder::new(), "read", WAKER);
        s.segment(24, 1, WAKER)
            .ev(25, 1, WAKER, EventKind::NetifReceiveSkb(packet("eth0")))
            .ev(26, 1, WAKER, block_completion())
            .waking(WAKE_AT, 1, WAKER, SLEEPER);
        assert_eq!(wait_reason(&s.finish()), BlockReason::BlockDevice);
    }

    #[test]
    fn rule_5_a_packet_received_in_thread_context_is_network_not_the_thread() {
        let mut s = Stream::sleeping_in(StateBuilder::new(), "futex", WAKER);
        s.ev(25, 1, WAKER, EventKind::NetifReceiveSkb(packet("eth0")))
            .waking(WAKE_AT, 1, WAKER, SLEEPER);
        assert_eq!(wait_reason(&s.finish()), BlockReason::Network);
    }

    /// Thread 1, asleep in `call`, woken `after` a segment received on
    /// CPU 1, where `on_cpu1` runs (a recorder thread of a builder that
    /// knows it).
    fn segment_wake(call: &str, after: u64, on_cpu1: Tid) -> KernelModel {
        let builder = StateBuilder::new().recorder_threads(&[RECORDER], Arch::X86_64);
        let mut s = Stream::sleeping_in(builder, call, on_cpu1);
        s.segment(25, 1, on_cpu1)
            .waking(25 + after, 1, on_cpu1, SLEEPER);
        s.finish()
    }

    #[test]
    fn rule_6_a_fresh_segment_wakes_a_reader_even_under_the_recorder() {
        let m = segment_wake("recvfrom", SEGMENT_WAKE_NS, RECORDER);
        assert_eq!(wait_reason(&m), BlockReason::Network);
        assert_eq!(waker_counts(m.stats()), (0, 0, 0));
        let m = segment_wake("epoll_wait", 5, WAKER);
        assert_eq!(wait_reason(&m), BlockReason::Network);
    }

    #[test]
    fn rule_6_needs_a_fresh_segment_and_a_call_that_waits_for_one() {
        let stale = segment_wake("recvfrom", SEGMENT_WAKE_NS + 1, WAKER);
        assert_eq!(wait_reason(&stale), BlockReason::Thread(WAKER));
        let futex = segment_wake("futex", 5, WAKER);
        assert_eq!(wait_reason(&futex), BlockReason::Thread(WAKER));
    }

    #[test]
    fn rule_7_a_recorder_threads_wake_up_is_a_hidden_interrupt() {
        // Its one firm answer is a timer, for a sleep (which rule 6 leaves
        // alone even with a fresh segment).
        let m = segment_wake("nanosleep", 5, RECORDER);
        assert_eq!(wait_reason(&m), BlockReason::Timer);
        assert_eq!(waker_counts(m.stats()), (0, 1, 0));
        let mut s = Stream::sleeping_in(
            StateBuilder::new().recorder_threads(&[RECORDER], Arch::X86_64),
            "futex",
            RECORDER,
        );
        s.waking(WAKE_AT, 1, RECORDER, SLEEPER);
        let m = s.finish();
        assert_eq!(wait_reason(&m), BlockReason::Unexplained);
        assert_eq!(waker_counts(m.stats()), (0, 1, 0));
    }

    #[test]
    fn rule_8_a_thread_running_its_own_wake_up_is_a_spurious_wake_up() {
        // Thread 1 runs on CPU 1, then blocks on CPU 0: CPU 1's switch-out
        // is missing, so the model still has it current there when a
        // wake-up of it comes on CPU 1.
        let mut s = Stream {
            builder: StateBuilder::new(),
        };
        s.switch(10, 1, 0, 0, SLEEPER)
            .switch(20, 0, SLEEPER, 1, 0)
            .waking(WAKE_AT, 1, SLEEPER, SLEEPER)
            .switch(40, 0, 0, 0, 3);
        let m = s.finish();
        assert_eq!(waker_counts(m.stats()), (0, 0, 1));
        let states: Vec<_> = m.thread(SLEEPER).unwrap().states().to_vec();
        let last = states.last().unwrap();
        assert_eq!(
            (last.start, last.end, last.state),
            (20, 40, ThreadState::Blocked(BlockReason::Unexplained)),
            "the wake-up changed nothing: {states:?}"
        );
    }

    #[test]
    fn rule_9_the_thread_on_the_cpu_woke_it() {
        let mut s = Stream::sleeping_in(StateBuilder::new(), "futex", WAKER);
        s.waking(WAKE_AT, 1, WAKER, SLEEPER);
        let m = s.finish();
        assert_eq!(wait_reason(&m), BlockReason::Thread(WAKER));
        assert_eq!(waker_counts(m.stats()), (0, 0, 0));
    }

    #[test]
    fn rule_10_the_idle_task_is_no_waker() {
        let mut s = Stream::sleeping_in(StateBuilder::new(), "futex", 0);
        s.waking(WAKE_AT, 1, 0, SLEEPER);
        assert_eq!(wait_reason(&s.finish()), BlockReason::Unexplained);
    }
}
