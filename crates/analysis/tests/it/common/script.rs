//! [`Script`]: a hand-made kernel event trace (events on CPUs) and the
//! model the state builder makes of it, for the state model, request,
//! diagnosis and placement tests.

use std::collections::HashMap;

use deepspan_analysis::{BlockPhase, KernelModel, StateBuilder};
use deepspan_model::{
    softirq, BlockRq, Comm, Event, EventKind, Packet, SchedSwitch, Socket, Tid, Wakeup,
};

/// The name of thread `t` in a script without names: `t<t>`.
pub fn comm(t: Tid) -> Comm {
    Comm::from_bytes(format!("t{t}").as_bytes())
}

/// A tiny event script: kernel events on CPUs. Events carry no tid (-1,
/// no context fields) unless added with [`Script::ev_by`].
#[derive(Default)]
pub struct Script {
    pub events: Vec<Event>,
    /// Thread names by tid, for a script made by [`Script::named`].
    pub names: HashMap<Tid, &'static str>,
    /// The name of a thread not in `names`; `None`: thread `t` is `t<t>`.
    pub unnamed: Option<&'static str>,
    /// What the recorder's eBPF programs captured, as a lean recording
    /// has it, in time order.
    captured: Vec<Captured>,
}

/// One record of the recorder's captures.
enum Captured {
    /// `tid` went to sleep in call `nr` with `arg0` and `read_chars`.
    Sleep(u64, Tid, i32, u64, Option<u64>),
    /// `tid` received (or sent) `bytes` on `socket`.
    SocketCall(u64, Tid, bool, u64, Option<Socket>),
}

impl Captured {
    fn ts(&self) -> u64 {
        match *self {
            Captured::Sleep(ts, ..) | Captured::SocketCall(ts, ..) => ts,
        }
    }

    fn give(&self, b: &mut StateBuilder) {
        match *self {
            Captured::Sleep(ts, tid, nr, arg0, read_chars) => {
                b.blocked_syscall(ts, tid, nr, [arg0, 0, 0], read_chars)
            }
            Captured::SocketCall(ts, tid, sent, bytes, socket) => {
                b.socket_call(ts, tid, sent, bytes, socket)
            }
        }
    }
}

impl Script {
    pub fn new() -> Script {
        Script::default()
    }
    /// A script whose threads have the given names (each thread's name is
    /// its process's); any other thread is "swapper".
    pub fn named(names: &[(Tid, &'static str)]) -> Script {
        Script {
            names: names.iter().copied().collect(),
            unnamed: Some("swapper"),
            ..Script::default()
        }
    }
    pub fn comm(&self, t: Tid) -> Comm {
        match (self.names.get(&t), self.unnamed) {
            (Some(name), _) => Comm::from_bytes(name.as_bytes()),
            (None, Some(name)) => Comm::from_bytes(name.as_bytes()),
            (None, None) => comm(t),
        }
    }
    /// An event without a tid.
    pub fn ev(&mut self, ts: u64, cpu: u32, kind: EventKind) -> &mut Self {
        self.ev_by(ts, cpu, -1, kind)
    }
    /// An event recorded with `tid` as its context.
    pub fn ev_by(&mut self, ts: u64, cpu: u32, tid: Tid, kind: EventKind) -> &mut Self {
        self.events.push(Event { ts, cpu, tid, kind });
        self
    }
    pub fn switch(
        &mut self,
        ts: u64,
        cpu: u32,
        prev: Tid,
        prev_state: i64,
        next: Tid,
    ) -> &mut Self {
        let kind = EventKind::SchedSwitch(SchedSwitch {
            prev_tid: prev,
            prev_comm: self.comm(prev),
            prev_prio: 120,
            prev_state,
            next_tid: next,
            next_comm: self.comm(next),
            next_prio: 120,
        });
        self.ev(ts, cpu, kind)
    }
    /// `sched_waking` (`waking`) or `sched_wakeup` of `tid`, targeting `cpu`.
    pub fn wake(&mut self, ts: u64, cpu: u32, tid: Tid, waking: bool) -> &mut Self {
        let w = Wakeup {
            tid,
            comm: self.comm(tid),
            prio: 120,
            target_cpu: cpu as i32,
        };
        self.ev(
            ts,
            cpu,
            if waking {
                EventKind::SchedWaking(w)
            } else {
                EventKind::SchedWakeup(w)
            },
        )
    }
    pub fn waking(&mut self, ts: u64, cpu: u32, tid: Tid) -> &mut Self {
        self.wake(ts, cpu, tid, true)
    }
    pub fn enter(&mut self, ts: u64, cpu: u32, id: i64, arg0: u64) -> &mut Self {
        self.ev(
            ts,
            cpu,
            EventKind::SysEnter {
                id,
                name: None,
                args: [arg0, 0, 0, 0, 0, 0],
            },
        )
    }
    pub fn exit(&mut self, ts: u64, cpu: u32, id: i64, ret: i64) -> &mut Self {
        self.ev(
            ts,
            cpu,
            EventKind::SysExit {
                id,
                name: None,
                ret,
            },
        )
    }
    /// A system call of the thread current on `cpu` (first argument 5).
    pub fn call(&mut self, start: u64, end: u64, cpu: u32, id: i64, ret: i64) -> &mut Self {
        self.enter(start, cpu, id, 5).exit(end, cpu, id, ret)
    }
    /// A timer expiring at `ts` on `cpu` that wakes `wakes`.
    pub fn timer(&mut self, ts: u64, cpu: u32, wakes: Tid) -> &mut Self {
        self.ev(
            ts,
            cpu,
            EventKind::HrtimerExpireEntry {
                hrtimer: 1,
                function: 2,
                now: ts as i64,
            },
        )
        .waking(ts, cpu, wakes)
        .ev(ts, cpu, EventKind::HrtimerExpireExit { hrtimer: 1 })
    }
    /// A softirq `vec` at `ts` on `cpu` that wakes `wakes`.
    pub fn softirq(&mut self, ts: u64, cpu: u32, vec: u32, wakes: Tid) -> &mut Self {
        self.ev(ts, cpu, EventKind::SoftirqEntry { vec })
            .waking(ts, cpu, wakes)
            .ev(ts, cpu, EventKind::SoftirqExit { vec })
    }
    /// The recorder's capture of `tid` going to sleep in call `nr` at `ts`
    /// with `read_chars` bytes read so far (a lean recording; given to the
    /// model before the events of the same time).
    pub fn sleep(
        &mut self,
        ts: u64,
        tid: Tid,
        nr: i32,
        arg0: u64,
        read_chars: Option<u64>,
    ) -> &mut Self {
        self.captured
            .push(Captured::Sleep(ts, tid, nr, arg0, read_chars));
        self
    }
    /// The recorder's capture of `tid` receiving (or, `sent`, sending)
    /// `bytes` on `socket` at `ts` (a lean recording; given to the model
    /// before the events of the same time).
    pub fn socket_call(
        &mut self,
        ts: u64,
        tid: Tid,
        sent: bool,
        bytes: u64,
        socket: Option<Socket>,
    ) -> &mut Self {
        self.captured
            .push(Captured::SocketCall(ts, tid, sent, bytes, socket));
        self
    }
    /// A block request event (a read of 8 sectors of device 253:0) of `tid`.
    pub fn block(
        &mut self,
        ts: u64,
        cpu: u32,
        tid: Tid,
        phase: BlockPhase,
        sector: u64,
    ) -> &mut Self {
        let rq = BlockRq {
            dev: 253 << 20, // major 253, minor 0
            sector,
            nr_sector: 8,
            rwbs: *b"R\0\0\0\0\0\0\0",
            error: 0,
        };
        let kind = match phase {
            BlockPhase::Insert => EventKind::BlockRqInsert(rq),
            BlockPhase::Issue => EventKind::BlockRqIssue(rq),
            BlockPhase::Complete => EventKind::BlockRqComplete(rq),
        };
        self.ev_by(ts, cpu, tid, kind)
    }
    /// The disk's interrupt on `cpu` from `ts` to `ts + 1` (irq 24,
    /// `virtio2-req.0`): it completes the block requests at `sectors` and
    /// wakes `wakes`, if any.
    pub fn disk_interrupt(
        &mut self,
        ts: u64,
        cpu: u32,
        sectors: &[u64],
        wakes: Option<Tid>,
    ) -> &mut Self {
        self.ev_by(
            ts,
            cpu,
            0,
            EventKind::IrqHandlerEntry {
                irq: 24,
                name: "virtio2-req.0".into(),
            },
        );
        for &sector in sectors {
            self.block(ts, cpu, 0, BlockPhase::Complete, sector);
        }
        if let Some(t) = wakes {
            self.waking(ts, cpu, t);
        }
        self.ev_by(
            ts + 1,
            cpu,
            0,
            EventKind::IrqHandlerExit { irq: 24, ret: 1 },
        )
    }
    /// `sender` (running on `cpu`) sends a packet over `lo`, delivered in a
    /// NET_RX softirq in its context that wakes `wakes`.
    pub fn loopback(&mut self, ts: u64, cpu: u32, sender: Tid, wakes: Tid) -> &mut Self {
        let packet = || Packet {
            skbaddr: 0xff00,
            len: 100,
            dev: "lo".into(),
        };
        self.ev_by(ts, cpu, sender, EventKind::NetDevQueue(packet()))
            .ev_by(
                ts,
                cpu,
                sender,
                EventKind::SoftirqEntry {
                    vec: softirq::NET_RX,
                },
            )
            .ev_by(ts, cpu, sender, EventKind::NetifReceiveSkb(packet()))
            .waking(ts, cpu, wakes)
            .ev_by(
                ts,
                cpu,
                sender,
                EventKind::SoftirqExit {
                    vec: softirq::NET_RX,
                },
            )
    }
    /// The model of the events as they were added.
    pub fn model(&self) -> KernelModel {
        let mut b = StateBuilder::new();
        let mut captured: Vec<&Captured> = self.captured.iter().collect();
        captured.sort_by_key(|c| c.ts());
        let mut captured = captured.into_iter().peekable();
        for e in &self.events {
            while let Some(c) = captured.next_if(|c| c.ts() <= e.ts) {
                c.give(&mut b);
            }
            b.push(e);
        }
        for c in captured {
            c.give(&mut b);
        }
        b.finish()
    }
    /// The model of the events sorted by time (stable: events of one
    /// timestamp keep their order).
    pub fn model_in_time_order(&mut self) -> KernelModel {
        self.events.sort_by_key(|e| e.ts);
        self.model()
    }
    /// The model with events lost on `cpu` at `ts` (marked before the first
    /// event at or after `ts`).
    pub fn model_with_lost(&self, cpu: u32, ts: u64) -> KernelModel {
        let mut b = StateBuilder::new();
        let mut marked = false;
        for e in &self.events {
            if e.ts >= ts && !marked {
                b.lost(cpu, ts);
                marked = true;
            }
            b.push(e);
        }
        b.finish()
    }
}
