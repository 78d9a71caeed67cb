//! `deepspan import --ctf DIR`: an LTTng trace folder becomes the run's
//! kernel trace, and its `jaeger_ust` span events become spans.

use std::path::Path;

use anyhow::{bail, Context, Result};
use deepspan_ctf::{CtfTrace, SpanSync};
use deepspan_spans::ust::{spans_from_events, UstSpanEvent};
use deepspan_spans::Span;

use crate::progress;
use deepspan_run::{layout, Run};

/// Copies the trace into `run/kernel/ctf/` and returns the spans its
/// `jaeger_ust` events describe (times in the trace's clock, as the kernel
/// events of the run).
pub fn import(dir: &Path, run: &Path) -> Result<Vec<Span>> {
    let trace = CtfTrace::open(dir)
        .with_context(|| format!("cannot read the CTF trace {}", dir.display()))?;
    let files = Run::new(run);
    if files.trace_dat().exists() || files.ctf_dir().exists() {
        bail!(
            "{} already has a kernel trace ({} or {}/); import the CTF trace into a new run folder",
            run.display(),
            layout::TRACE_DAT,
            layout::CTF_DIR,
        );
    }
    let spans = span_events(&trace, dir)?;
    let target = files.ctf_dir();
    let staging = files
        .kernel_dir()
        .join(format!(".ctf-import-{}", std::process::id()));
    std::fs::create_dir_all(&staging)
        .with_context(|| format!("cannot create {}", staging.display()))?;
    let copied = copy_tree(dir, &staging).and_then(|files| {
        std::fs::rename(&staging, &target).with_context(|| {
            format!("cannot move {} to {}", staging.display(), target.display())
        })?;
        Ok(files)
    });
    let files = match copied {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let domains: Vec<String> = trace
        .traces()
        .iter()
        .map(|t| {
            format!(
                "{} ({} streams)",
                t.domain().unwrap_or("unknown domain"),
                t.stream_count()
            )
        })
        .collect();
    println!(
        "{}: CTF, {} → {} ({files} files)",
        dir.display(),
        domains.join(", "),
        target.display()
    );
    if !trace.traces().iter().any(|t| t.is_kernel()) {
        eprintln!(
            "deepspan: warning: {} has no kernel trace: `deepspan analyze` needs one (LTTng kernel domain)",
            dir.display()
        );
    }
    let pairs = spans_from_events(spans.events);
    if pairs.unpaired > 0 {
        eprintln!(
            "deepspan: warning: {} jaeger_ust start/end events have no partner (span open when tracing stopped, or the event was discarded); those spans are left out",
            pairs.unpaired
        );
    }
    if pairs.without_tid > 0 {
        eprintln!(
            "deepspan: warning: {} jaeger_ust spans have no thread (record the vtid context: `lttng add-context -u -t vtid`); they get no kernel path",
            pairs.without_tid
        );
    }
    Ok(pairs.spans)
}

struct SpanEvents {
    events: Vec<UstSpanEvent>,
}

fn span_events(trace: &CtfTrace, dir: &Path) -> Result<SpanEvents> {
    let mut events = Vec::new();
    if trace.traces().iter().all(|t| t.is_kernel()) {
        return Ok(SpanEvents { events });
    }
    let bar = progress::spinner("reading jaeger_ust span events");
    for (n, e) in trace.events().enumerate() {
        let e = e.with_context(|| format!("cannot decode {}", dir.display()))?;
        if n % 65_536 == 0 {
            bar.set_message(format!("{n} events"));
        }
        match e.span_sync() {
            Some(SpanSync::Start {
                trace_id,
                span_id,
                parent_span_id,
                op_name,
                start_time,
                vtid,
                vpid,
                ts,
            }) => events.push(UstSpanEvent::Start {
                trace_id,
                span_id,
                parent_span_id,
                op_name,
                start_time_us: start_time,
                tid: vtid.and_then(|t| u32::try_from(t).ok()),
                pid: vpid,
                ts,
            }),
            Some(SpanSync::End {
                trace_id,
                span_id,
                duration,
                vtid,
                ts,
                ..
            }) => events.push(UstSpanEvent::End {
                trace_id,
                span_id,
                duration_us: duration,
                tid: vtid.and_then(|t| u32::try_from(t).ok()),
                ts,
            }),
            None => {}
        }
    }
    bar.finish_and_clear();
    Ok(SpanEvents { events })
}

/// Copies regular files and folders below `from` into `to`, hard-linking
/// where the file system allows. Returns the number of files.
fn copy_tree(from: &Path, to: &Path) -> Result<u64> {
    let mut files = 0;
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot list {}", from.display()))?
    {
        let entry = entry.with_context(|| format!("cannot list {}", from.display()))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let kind =
            std::fs::metadata(&src).with_context(|| format!("cannot read {}", src.display()))?;
        if kind.is_dir() {
            std::fs::create_dir(&dst)
                .with_context(|| format!("cannot create {}", dst.display()))?;
            files += copy_tree(&src, &dst)?;
        } else if kind.is_file() {
            if std::fs::hard_link(&src, &dst).is_err() {
                std::fs::copy(&src, &dst).with_context(|| {
                    format!("cannot copy {} to {}", src.display(), dst.display())
                })?;
            }
            files += 1;
        }
    }
    Ok(files)
}
