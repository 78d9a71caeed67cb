//! Parses every event format of the running kernel (when tracefs is
//! mounted at /sys/kernel/tracing) and checks the typed mapping of the
//! events deepspan decodes.

use std::path::Path;

use deepspan_ftrace::{parse_format, Schema};

#[test]
#[ignore = "system: tracefs (the running kernel's event formats)"]
fn parses_the_running_kernels_formats() {
    let root = Path::new("/sys/kernel/tracing/events");
    if !root.is_dir() {
        eprintln!(
            "{} is absent (tracefs not mounted): skipping",
            root.display()
        );
        return;
    }
    let mut formats = Vec::new();
    let mut failures = Vec::new();
    for system in std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
    {
        for event in std::fs::read_dir(system.path()).unwrap().flatten() {
            let path = event.path().join("format");
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            match parse_format(&text) {
                Ok(mut f) => {
                    assert!(
                        f.fields.iter().any(|x| x.name == "common_type"),
                        "{}",
                        path.display()
                    );
                    for x in &f.fields {
                        assert!(
                            !x.type_name.is_empty() && !x.name.is_empty(),
                            "{}: {x:?}",
                            path.display()
                        );
                    }
                    f.system = system.file_name().to_string_lossy().into_owned();
                    formats.push(f);
                }
                Err(e) => failures.push(format!("{}: {e}", path.display())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} formats failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(formats.len() > 100, "only {} formats", formats.len());
    let schema = Schema::new(
        formats,
        cfg!(target_endian = "big"),
        std::mem::size_of::<usize>() as u32,
    );
    let expect = [
        ("sched", "sched_switch", "SchedSwitch"),
        ("sched", "sched_waking", "SchedWaking"),
        ("sched", "sched_wakeup", "SchedWakeup"),
        ("sched", "sched_wakeup_new", "SchedWakeupNew"),
        ("sched", "sched_process_fork", "SchedProcessFork"),
        ("sched", "sched_process_exec", "SchedProcessExec"),
        ("sched", "sched_process_exit", "SchedProcessExit"),
        ("sched", "sched_process_free", "SchedProcessFree"),
        ("sched", "sched_migrate_task", "SchedMigrateTask"),
        ("irq", "irq_handler_entry", "IrqHandlerEntry"),
        ("irq", "irq_handler_exit", "IrqHandlerExit"),
        ("irq", "softirq_raise", "SoftirqRaise"),
        ("irq", "softirq_entry", "SoftirqEntry"),
        ("irq", "softirq_exit", "SoftirqExit"),
        ("timer", "hrtimer_expire_entry", "HrtimerExpireEntry"),
        ("timer", "hrtimer_expire_exit", "HrtimerExpireExit"),
        ("irq_vectors", "reschedule_entry", "IpiEntry"),
        ("irq_vectors", "call_function_single_exit", "IpiExit"),
        ("ipi", "ipi_entry", "IpiEntry"),
        ("ipi", "ipi_exit", "IpiExit"),
        ("raw_syscalls", "sys_enter", "SysEnter"),
        ("raw_syscalls", "sys_exit", "SysExit"),
        ("block", "block_rq_insert", "BlockRqInsert"),
        ("block", "block_rq_issue", "BlockRqIssue"),
        ("block", "block_rq_complete", "BlockRqComplete"),
        ("net", "net_dev_queue", "NetDevQueue"),
        ("net", "netif_receive_skb", "NetifReceiveSkb"),
        ("cgroup", "cgroup_attach_task", "CgroupAttachTask"),
    ];
    let mut checked = 0;
    for (system, name, variant) in expect {
        if let Some(f) = schema.by_name(system, name) {
            assert_eq!(schema.typed_variant(f.id), Some(variant), "{system}:{name}");
            checked += 1;
        }
    }
    assert!(
        checked >= 10,
        "only {checked} typed events found on this kernel"
    );
    // Events outside the typed set stay generic.
    if let Some(f) = schema.by_name("irq_vectors", "vector_config") {
        assert_eq!(schema.typed_variant(f.id), None);
    }
    if let Some(f) = schema.by_name("sched", "sched_stat_runtime") {
        assert_eq!(schema.typed_variant(f.id), None);
    }
}
