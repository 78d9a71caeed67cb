//! Progress display: a bar with rate and ETA on a terminal, nothing when
//! stderr is piped or redirected (so scripts and CI logs stay clean).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

fn target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr_with_hz(8)
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar over `total` bytes, e.g. trace data being decoded.
pub fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// A bar over a count of items, e.g. requests being analysed (the length
/// may be set later with `set_length`).
pub fn count_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// A spinner for work of unknown length, e.g. a recording until Ctrl-C.
pub fn spinner(what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, target());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("valid template"),
    );
    bar.set_message(what.to_string());
    bar
}
