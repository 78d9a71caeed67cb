//! Reader of Trace Compass XML kernel stubs (`<trace>` of `<event
//! timestamp name>` with `<field name value type>` children, LTTng field
//! names) into model events, plus the thread facts that are not events
//! (statedump entries, fork pids).

use std::collections::HashMap;
use std::sync::Arc;

use deepspan_analysis::{PacketDirection, StateBuilder, ThreadInfo};
use deepspan_model::{
    BlockRq, Comm, Event, EventKind, Fields, Name, Packet, SchedSwitch, Value, Wakeup,
};

/// One item of a stub trace.
pub enum Item {
    Event(Event),
    Info(u64, ThreadInfo),
    /// `packet_sent` / `packet_received` of the distributed stubs: (ts,
    /// cpu, message id, direction).
    Packet(u64, u32, u64, PacketDirection),
}

/// Reads a stub file. Events carry no tid (stubs have no context fields):
/// `Event::tid` is -1.
pub fn read(path: &std::path::Path) -> Vec<Item> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    let mut items = Vec::new();
    for ev in doc
        .root_element()
        .children()
        .filter(|n| n.has_tag_name("event"))
    {
        let ts: u64 = ev
            .attribute("timestamp")
            .and_then(|t| t.parse().ok())
            .expect("timestamp");
        let name = ev.attribute("name").expect("name");
        let mut fields: HashMap<&str, &str> = HashMap::new();
        let mut generic: Fields = Vec::new();
        for f in ev.children().filter(|n| n.has_tag_name("field")) {
            let (Some(n), Some(v)) = (f.attribute("name"), f.attribute("value")) else {
                continue;
            };
            fields.insert(n, v);
            let value = match f.attribute("type") {
                Some("int" | "long") => v
                    .parse()
                    .map(Value::Int)
                    .unwrap_or_else(|_| Value::Str(v.to_string())),
                _ => Value::Str(v.to_string()),
            };
            generic.push((Arc::from(n), value));
        }
        let int = |n: &str| {
            fields
                .get(n)
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0)
        };
        let comm = |n: &str| Comm::from_bytes(fields.get(n).copied().unwrap_or("").as_bytes());
        let text = |n: &str| -> Arc<str> { Arc::from(fields.get(n).copied().unwrap_or("")) };
        let wakeup = || Wakeup {
            tid: int("tid") as i32,
            comm: comm("comm"),
            prio: int("prio") as i32,
            target_cpu: int("target_cpu") as i32,
        };
        let block = || BlockRq {
            dev: int("dev") as u32,
            sector: int("sector") as u64,
            nr_sector: int("nr_sector") as u32,
            rwbs: [0; 8],
            error: 0,
        };
        let kind = match name {
            "sched_switch" => EventKind::SchedSwitch(SchedSwitch {
                prev_tid: int("prev_tid") as i32,
                prev_comm: comm("prev_comm"),
                prev_prio: int("prev_prio") as i32,
                prev_state: int("prev_state"),
                next_tid: int("next_tid") as i32,
                next_comm: comm("next_comm"),
                next_prio: int("next_prio") as i32,
            }),
            "sched_waking" => EventKind::SchedWaking(wakeup()),
            "sched_wakeup" => EventKind::SchedWakeup(wakeup()),
            "sched_wakeup_new" => EventKind::SchedWakeupNew(wakeup()),
            "sched_process_fork" => {
                items.push(Item::Info(
                    ts,
                    ThreadInfo {
                        tid: int("child_tid") as i32,
                        pid: fields
                            .contains_key("child_pid")
                            .then(|| int("child_pid") as i32),
                        ppid: fields
                            .contains_key("parent_pid")
                            .then(|| int("parent_pid") as i32),
                        ..ThreadInfo::default()
                    },
                ));
                EventKind::SchedProcessFork {
                    parent_tid: int("parent_tid") as i32,
                    parent_comm: comm("parent_comm"),
                    child_tid: int("child_tid") as i32,
                    child_comm: comm("child_comm"),
                }
            }
            "sched_process_exit" => EventKind::SchedProcessExit {
                tid: int("tid") as i32,
                comm: comm("comm"),
                prio: int("prio") as i32,
            },
            "sched_process_free" => EventKind::SchedProcessFree {
                tid: int("tid") as i32,
                comm: comm("comm"),
                prio: int("prio") as i32,
            },
            "sched_process_exec" => EventKind::SchedProcessExec {
                tid: int("tid") as i32,
                old_tid: int("old_tid") as i32,
                filename: text("filename"),
            },
            "sched_migrate_task" => EventKind::SchedMigrateTask {
                tid: int("tid") as i32,
                comm: comm("comm"),
                prio: int("prio") as i32,
                orig_cpu: int("orig_cpu") as i32,
                dest_cpu: int("dest_cpu") as i32,
            },
            "irq_handler_entry" => EventKind::IrqHandlerEntry {
                irq: int("irq") as i32,
                name: Name::new(&text("name")),
            },
            "irq_handler_exit" => EventKind::IrqHandlerExit {
                irq: int("irq") as i32,
                ret: int("ret") as i32,
            },
            "softirq_entry" => EventKind::SoftirqEntry {
                vec: int("vec") as u32,
            },
            "softirq_exit" => EventKind::SoftirqExit {
                vec: int("vec") as u32,
            },
            "softirq_raise" => EventKind::SoftirqRaise {
                vec: int("vec") as u32,
            },
            "hrtimer_expire_entry" => EventKind::HrtimerExpireEntry {
                hrtimer: int("hrtimer") as u64,
                function: int("function") as u64,
                now: int("now"),
            },
            "hrtimer_expire_exit" => EventKind::HrtimerExpireExit {
                hrtimer: int("hrtimer") as u64,
            },
            "block_rq_complete" => EventKind::BlockRqComplete(block()),
            "netif_receive_skb" => EventKind::NetifReceiveSkb(Packet {
                skbaddr: int("skbaddr") as u64,
                len: int("len") as u32,
                dev: Name::new(&text("name")),
            }),
            // The old LTTng syscall naming: `exit_syscall` is every exit,
            // `sys_<name>` an entry (so `sys_exit` is the entry of exit(2)).
            "exit_syscall" => EventKind::SysExit {
                id: -1,
                name: None,
                ret: int("ret"),
            },
            n if n.starts_with("syscall_exit_") => EventKind::SysExit {
                id: -1,
                name: Some(Name::new(&n["syscall_exit_".len()..])),
                ret: int("ret"),
            },
            n if n.starts_with("syscall_entry_") || n.starts_with("sys_") => {
                let bare = n
                    .strip_prefix("syscall_entry_")
                    .or_else(|| n.strip_prefix("sys_"))
                    .unwrap_or(n);
                EventKind::SysEnter {
                    id: -1,
                    name: Some(Name::new(bare)),
                    args: [0; 6],
                }
            }
            "packet_sent" | "packet_received" => {
                let direction = if name == "packet_sent" {
                    PacketDirection::Sent
                } else {
                    PacketDirection::Received
                };
                items.push(Item::Packet(
                    ts,
                    int("cpu") as u32,
                    int("msgid") as u64,
                    direction,
                ));
                continue;
            }
            "lttng_statedump_process_state" => {
                if let Some(info) = ThreadInfo::from_lttng_statedump(&generic) {
                    items.push(Item::Info(ts, info));
                }
                EventKind::Other {
                    name: Name::new(name),
                }
            }
            other => EventKind::Other {
                name: Name::new(other),
            },
        };
        items.push(Item::Event(Event {
            ts,
            cpu: int("cpu") as u32,
            tid: -1,
            kind,
        }));
    }
    items
}

/// Feeds a stub into a builder.
pub fn feed(builder: &mut StateBuilder, items: &[Item]) {
    for item in items {
        match item {
            Item::Event(e) => builder.push(e),
            Item::Info(ts, info) => builder.thread_info(*ts, info),
            Item::Packet(ts, cpu, key, direction) => builder.packet(*ts, *cpu, *key, *direction),
        }
    }
}
