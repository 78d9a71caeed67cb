//! Which kernel events to record: presets, and `system:name` lists resolved
//! against what the running kernel offers.

use std::collections::BTreeSet;
use std::fmt;

use crate::tracefs::Tracefs;
use crate::Error;

/// One tracepoint, e.g. `sched:sched_switch`.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct EventId {
    pub system: String,
    pub name: String,
}

impl EventId {
    pub fn new(system: &str, name: &str) -> EventId {
        EventId {
            system: system.to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.system, self.name)
    }
}

/// What the critical-path analysis consumes (see docs/analysis.md, "Kernel
/// state model"), but for the system-call events (see [`SYSCALLS`]).
/// Events a kernel lacks (IPIs of other architectures) are skipped.
///
/// As the `lean` preset (the default of `record` and the agent): the system-call events put
/// every thread of the host on the system-call slow path and are most of
/// a trace's events. What a blocked thread waits in comes from the
/// recorder's switch-out capture instead (`kernel/blocked_syscalls.tsv`,
/// see `blocked_syscalls.rs`), and the socket receives and sends that
/// place spans without an SDK from its socket capture (`socket_calls.rs`).
/// The bytes a thread read, for page-cache miss ratios, come from the
/// kernel's count of them at each of its sleeps (same capture). What it
/// cannot give: calls that never sleep (the system-call table of those),
/// and each call's return value.
const LEAN: &[&str] = &[
    "sched:sched_switch",
    "sched:sched_waking",
    "sched:sched_wakeup",
    "sched:sched_wakeup_new",
    "sched:sched_process_fork",
    "sched:sched_process_exec",
    "sched:sched_process_exit",
    "sched:sched_process_free",
    "sched:sched_migrate_task",
    "irq:irq_handler_entry",
    "irq:irq_handler_exit",
    "irq:softirq_raise",
    "irq:softirq_entry",
    "irq:softirq_exit",
    "timer:hrtimer_expire_entry",
    "timer:hrtimer_expire_exit",
    "irq_vectors:reschedule_entry",
    "irq_vectors:reschedule_exit",
    "irq_vectors:call_function_entry",
    "irq_vectors:call_function_exit",
    "irq_vectors:call_function_single_entry",
    "irq_vectors:call_function_single_exit",
    "ipi:ipi_entry",
    "ipi:ipi_exit",
    "block:block_rq_insert",
    "block:block_rq_issue",
    "block:block_rq_complete",
    "net:net_dev_queue",
    "net:netif_receive_skb",
    // A process moved into a container's cgroup: rare, and what names the
    // container of a process no /proc scan saw there.
    "cgroup:cgroup_attach_task",
];

/// The system-call events: with [`LEAN`], the `analysis` preset. Skipped
/// on a kernel without CONFIG_FTRACE_SYSCALLS.
const SYSCALLS: &[&str] = &["raw_syscalls:sys_enter", "raw_syscalls:sys_exit"];

/// Scheduling only: enough for thread states, cheapest to record.
const MINIMAL: &[&str] = &[
    "sched:sched_switch",
    "sched:sched_waking",
    "sched:sched_wakeup",
    "sched:sched_wakeup_new",
    "sched:sched_process_fork",
    "sched:sched_process_exec",
    "sched:sched_process_exit",
    "sched:sched_process_free",
    "sched:sched_migrate_task",
];

/// Preset names accepted by [`resolve_events`].
pub const PRESETS: &[&str] = &["analysis", "lean", "minimal"];

fn preset(name: &str) -> Option<Vec<&'static str>> {
    match name {
        "analysis" => Some([LEAN, SYSCALLS].concat()),
        "lean" => Some(LEAN.to_vec()),
        "minimal" => Some(MINIMAL.to_vec()),
        _ => None,
    }
}

/// Resolves an event specification against the running kernel's
/// `available_events`.
///
/// `spec` is a comma-separated list whose items are a preset (`analysis`,
/// `lean`, `minimal`), `system:name`, `system:*` (a whole system), a pattern with `*`
/// (`irq:softirq_*`), or a bare event name (`sched_switch`) looked up in every
/// system. Preset members the kernel lacks are skipped; any other item that
/// matches nothing is an error listing the closest available names.
/// The result is sorted and free of duplicates.
pub fn resolve_events(spec: &str, tracefs: &Tracefs) -> Result<Vec<EventId>, Error> {
    let text = tracefs.read("available_events")?;
    let available = parse_available_events(&String::from_utf8_lossy(&text));
    resolve_against(spec, &available)
}

pub(crate) fn parse_available_events(text: &str) -> Vec<EventId> {
    text.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .map(|(system, name)| EventId::new(system, name))
        .collect()
}

pub(crate) fn resolve_against(spec: &str, available: &[EventId]) -> Result<Vec<EventId>, Error> {
    let set: BTreeSet<&EventId> = available.iter().collect();
    let mut chosen = BTreeSet::new();
    let items: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if items.is_empty() {
        return Err(Error::InvalidEvents(format!(
            "no events given; use a preset ({}) or a list like sched:sched_switch,irq:*",
            PRESETS.join(", ")
        )));
    }
    for item in items {
        if let Some(members) = preset(item) {
            for member in members {
                let (system, name) = member.split_once(':').expect("presets are system:name");
                let id = EventId::new(system, name);
                if set.contains(&id) {
                    chosen.insert(id);
                }
            }
            continue;
        }
        let (system_pat, name_pat) = match item.split_once(':') {
            Some((s, n)) if !s.is_empty() && !n.is_empty() => (s, n),
            Some(_) => {
                return Err(Error::InvalidEvents(format!(
                    "'{item}' is not of the form system:name"
                )))
            }
            None => ("*", item),
        };
        let before = chosen.len();
        let mut matched = false;
        for id in available {
            if glob_match(system_pat, &id.system) && glob_match(name_pat, &id.name) {
                matched = true;
                chosen.insert(id.clone());
            }
        }
        if !matched && chosen.len() == before {
            return Err(Error::UnknownEvent {
                name: item.to_string(),
                suggestions: close_matches(item, available),
            });
        }
    }
    if chosen.is_empty() {
        return Err(Error::InvalidEvents(format!(
            "'{spec}' selects no event this kernel has"
        )));
    }
    Ok(chosen.into_iter().collect())
}

/// `*` matches any run of characters; everything else is literal.
fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Up to five available events closest to `wanted` by edit distance,
/// comparing with `system:name` or the bare name as `wanted` is written.
fn close_matches(wanted: &str, available: &[EventId]) -> Vec<String> {
    let with_system = wanted.contains(':');
    let max = (wanted.len() / 3).max(2);
    let mut scored: Vec<(usize, String)> = available
        .iter()
        .filter_map(|id| {
            let full = id.to_string();
            let candidate = if with_system {
                full.as_str()
            } else {
                id.name.as_str()
            };
            let d = edit_distance(wanted, candidate);
            (d <= max).then_some((d, full))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(5).map(|(_, name)| name).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> Vec<EventId> {
        parse_available_events(
            "sched:sched_switch\nsched:sched_wakeup\nsched:sched_waking\nirq:softirq_entry\nirq:softirq_exit\n\
             irq:irq_handler_entry\nirq_vectors:reschedule_entry\nraw_syscalls:sys_enter\n",
        )
    }

    fn names(v: &[EventId]) -> Vec<String> {
        v.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn lists_systems_patterns_and_bare_names() {
        let got =
            resolve_against("sched:sched_switch, irq:softirq_*,sys_enter", &kernel()).unwrap();
        assert_eq!(
            names(&got),
            [
                "irq:softirq_entry",
                "irq:softirq_exit",
                "raw_syscalls:sys_enter",
                "sched:sched_switch"
            ]
        );
        let got = resolve_against("irq:*", &kernel()).unwrap();
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn presets_skip_what_the_kernel_lacks() {
        let got = resolve_against("analysis", &kernel()).unwrap();
        assert!(names(&got).contains(&"irq_vectors:reschedule_entry".to_string()));
        assert!(!names(&got).iter().any(|n| n.starts_with("ipi:")));
        let lean = resolve_against("lean", &kernel()).unwrap();
        let syscall_events: Vec<String> = names(&got)
            .into_iter()
            .filter(|n| !names(&lean).contains(n))
            .collect();
        assert_eq!(syscall_events, ["raw_syscalls:sys_enter"]);
        let minimal = resolve_against("minimal", &kernel()).unwrap();
        assert_eq!(
            names(&minimal),
            [
                "sched:sched_switch",
                "sched:sched_wakeup",
                "sched:sched_waking"
            ]
        );
    }

    #[test]
    fn unknown_names_suggest_close_matches() {
        let err = resolve_against("sched:sched_swich", &kernel()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("unknown kernel event 'sched:sched_swich'"),
            "{text}"
        );
        assert!(text.contains("did you mean sched:sched_switch"), "{text}");
        let err = resolve_against("sched_wakep", &kernel()).unwrap_err();
        assert!(err.to_string().contains("sched:sched_wakeup"), "{err}");
        let err = resolve_against("zzzzzzzz", &kernel()).unwrap_err();
        assert!(err.to_string().contains("available_events"), "{err}");
    }

    #[test]
    fn empty_and_malformed_specs_are_refused() {
        assert!(matches!(
            resolve_against(" , ", &kernel()),
            Err(Error::InvalidEvents(_))
        ));
        assert!(matches!(
            resolve_against("sched:", &kernel()),
            Err(Error::InvalidEvents(_))
        ));
    }

    #[test]
    fn glob() {
        assert!(glob_match("*", "x"));
        assert!(glob_match("soft*_e*", "softirq_entry"));
        assert!(!glob_match("soft*_x", "softirq_entry"));
        assert!(glob_match("a*b*c", "aXbYbZc"));
    }
}
