//! Manual check: `record OUT [standard|flight] [SECONDS] [-- command...]`.
use std::time::Duration;

use deepspan_record::{record, Mode, RecordOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (head, command) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], args[i + 1..].to_vec()),
        None => (&args[..], Vec::new()),
    };
    let Some(out) = head.first() else {
        eprintln!("usage: record OUT [standard|flight] [SECONDS] [-- command...]");
        std::process::exit(2);
    };
    let mut opts = RecordOptions::new(out);
    if head.get(1).map(String::as_str) == Some("flight") {
        opts.mode = Mode::Flight;
    }
    opts.duration = head
        .get(2)
        .and_then(|s| s.parse::<f64>().ok())
        .map(Duration::from_secs_f64);
    opts.command = command.into_iter().map(Into::into).collect();
    match record(&opts, &mut |p| eprintln!("{p:?}")) {
        Ok(summary) => {
            eprintln!("{:#?}", summary.manifest);
            std::process::exit(summary.exit_code.unwrap_or(0));
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
