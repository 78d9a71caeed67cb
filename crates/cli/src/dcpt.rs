//! `deepspan dcpt`: in-band critical paths (`deepspan-dcpt-path` headers).

use std::io::{Read, Write};

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use deepspan_spans::dcpt::{self, CriticalPath};
use serde_json::json;

#[derive(Args)]
pub struct DcptArgs {
    #[command(subcommand)]
    command: DcptCommand,
}

#[derive(Subcommand)]
enum DcptCommand {
    /// Print the critical path carried by a `deepspan-dcpt-path` header.
    ///
    /// Per hop: service, operation, self time, total time, the time between
    /// it and the next hop (network, queues) and its kernel cause if any.
    Decode(DecodeArgs),
}

#[derive(Args)]
struct DecodeArgs {
    /// The header's value, or the whole `deepspan-dcpt-path: …` line as
    /// `curl -v` shows it; `-` reads it from standard input.
    header: String,
    /// `table` for people, `json` for programs.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

pub fn run(args: DcptArgs) -> Result<()> {
    match args.command {
        DcptCommand::Decode(args) => decode(args),
    }
}

/// The value alone: without the header name a user may paste with it, nor
/// the surrounding white space (and the `< ` that `curl -v` prefixes).
fn header_value(input: &str) -> &str {
    let trimmed = input.trim();
    let trimmed = trimmed.strip_prefix("< ").unwrap_or(trimmed);
    match trimmed.split_once(':') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case(dcpt::REPLY_HEADER) => value.trim(),
        _ => trimmed,
    }
}

fn decode(args: DecodeArgs) -> Result<()> {
    let input = if args.header == "-" {
        let mut text = String::new();
        std::io::stdin()
            .take(1 << 20)
            .read_to_string(&mut text)
            .context("reading the header from standard input")?;
        text
    } else {
        args.header
    };
    let path = dcpt::decode(header_value(&input))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.format {
        Format::Json => {
            let hops: Vec<_> = path
                .hops
                .iter()
                .enumerate()
                .map(|(i, hop)| {
                    let mut value = serde_json::to_value(hop).expect("a hop serialises");
                    value["wire_us"] = json!(path.wire_us(i));
                    value
                })
                .collect();
            serde_json::to_writer_pretty(
                &mut out,
                &json!({"hops": hops, "dropped": path.dropped}),
            )?;
            writeln!(out)?;
        }
        Format::Table => write_table(&mut out, &path)?,
    }
    Ok(())
}

fn human_us(us: u64) -> String {
    let f = us as f64;
    match us {
        0..=999 => format!("{us} µs"),
        1_000..=999_999 => format!("{:.3} ms", f / 1e3),
        _ => format!("{:.3} s", f / 1e6),
    }
}

fn write_table(out: &mut impl Write, path: &CriticalPath) -> Result<()> {
    let service_width = column_width(path.hops.iter().map(|h| h.service.as_str()), "service");
    let operation_width = column_width(path.hops.iter().map(|h| h.operation.as_str()), "operation");
    writeln!(
        out,
        "{:>4}  {:<service_width$}  {:<operation_width$}  {:>12}  {:>12}  {:>12}  kernel cause",
        "hop", "service", "operation", "self", "total", "to next"
    )?;
    for (index, hop) in path.hops.iter().enumerate() {
        let wire = path.wire_us(index).map(human_us).unwrap_or_default();
        let cause = hop
            .cause
            .as_ref()
            .map(|c| format!("{} {}", c.name, human_us(c.time_us)))
            .unwrap_or_default();
        let line = format!(
            "{index:>4}  {:<service_width$}  {:<operation_width$}  {:>12}  {:>12}  {wire:>12}  {cause}",
            hop.service,
            hop.operation,
            human_us(hop.self_us),
            human_us(hop.total_us),
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    if path.dropped > 0 {
        writeln!(
            out,
            "(+{} deeper hops dropped to fit the header; their time is in the last hop's total)",
            path.dropped
        )?;
    }
    Ok(())
}

fn column_width<'a>(values: impl Iterator<Item = &'a str>, title: &str) -> usize {
    values
        .map(|v| v.chars().count())
        .max()
        .unwrap_or(0)
        .max(title.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_found_in_what_a_user_pastes() {
        assert_eq!(header_value(" 1;a:b:1:2\n"), "1;a:b:1:2");
        assert_eq!(header_value("Deepspan-Dcpt-Path: 1;a:b:1:2"), "1;a:b:1:2");
        assert_eq!(
            header_value("< deepspan-dcpt-path: 1;a:b:1:2\r\n"),
            "1;a:b:1:2"
        );
    }

    #[test]
    fn the_table_has_one_row_per_hop_and_says_what_was_dropped() {
        let path = dcpt::decode(
            "1;front:GET%20/:1000:48000;cart:POST%20/items:46000:46500:cpu-wait:31000;+3",
        )
        .unwrap();
        let mut text = Vec::new();
        write_table(&mut text, &path).unwrap();
        let text = String::from_utf8(text).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines.iter().all(|line| !line.ends_with(' ')), "{text}");
        assert!(
            lines[1].contains("front") && lines[1].contains("GET /") && lines[1].contains("500 µs")
        );
        assert!(lines[2].contains("46.000 ms") && lines[2].contains("cpu-wait 31.000 ms"));
        assert!(lines[3].contains("+3 deeper hops"));
    }
}
