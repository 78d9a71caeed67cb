//! `deepspan dcpt`: in-band critical paths (`deepspan-dcpt-path` headers).

use std::io::{Read, Write};

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use deepspan_model::human;
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
    /// Per hop, in call order: service (indented under the hop that called
    /// it, so sequential calls are siblings), operation, self time, total
    /// time, the time from its caller to it (network, queues) and its kernel
    /// cause if any.
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
            serde_json::to_writer_pretty(&mut out, &to_json(&path))?;
            writeln!(out)?;
        }
        Format::Table => write_table(&mut out, &path)?,
    }
    Ok(())
}

/// The path for programs: each hop as `dcpt::Hop` serialises (with its
/// `depth`, and `call_us` when the caller wrote it) plus `wire_us`, the time
/// into it from its caller (`null` when unknown).
fn to_json(path: &CriticalPath) -> serde_json::Value {
    let hops: Vec<_> = path
        .hops
        .iter()
        .zip(path.wire_times())
        .map(|(hop, wire_us)| {
            let mut value = serde_json::to_value(hop).expect("a hop serialises");
            value["wire_us"] = json!(wire_us);
            value
        })
        .collect();
    json!({"hops": hops, "dropped": path.dropped})
}

/// Levels shown by indentation; deeper hops say their depth instead, so a
/// pasted chain of thousands of hops cannot print gigabytes of spaces.
const MAX_INDENTED_DEPTH: usize = 16;

/// Two spaces per level under the outermost service, then the name.
fn indented_service(hop: &dcpt::Hop) -> String {
    let indent = 2 * hop.depth.min(MAX_INDENTED_DEPTH);
    if hop.depth > MAX_INDENTED_DEPTH {
        format!("{:indent$}(depth {}) {}", "", hop.depth, hop.service)
    } else {
        format!("{:indent$}{}", "", hop.service)
    }
}

fn write_table(out: &mut impl Write, path: &CriticalPath) -> Result<()> {
    let services: Vec<String> = path.hops.iter().map(indented_service).collect();
    let service_width = column_width(services.iter().map(String::as_str), "service");
    let operation_width = column_width(path.hops.iter().map(|h| h.operation.as_str()), "operation");
    writeln!(
        out,
        "{:>4}  {:<service_width$}  {:<operation_width$}  {:>12}  {:>12}  {:>12}  kernel cause",
        "hop", "service", "operation", "self", "total", "from caller"
    )?;
    let wire_times = path.wire_times();
    for (index, ((hop, service), wire_us)) in
        path.hops.iter().zip(&services).zip(wire_times).enumerate()
    {
        let wire = wire_us
            .map(|us| human::duration(us.saturating_mul(1_000)))
            .unwrap_or_default();
        let cause = hop
            .cause
            .as_ref()
            .map(|c| {
                format!(
                    "{} {}",
                    c.name,
                    human::duration(c.time_us.saturating_mul(1_000))
                )
            })
            .unwrap_or_default();
        let line = format!(
            "{index:>4}  {:<service_width$}  {:<operation_width$}  {:>12}  {:>12}  {wire:>12}  {cause}",
            service,
            hop.operation,
            human::duration(hop.self_us.saturating_mul(1_000)),
            human::duration(hop.total_us.saturating_mul(1_000)),
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    match path.dropped {
        0 => {}
        1 => writeln!(
            out,
            "(+1 hop dropped from the end to fit the header; its time is in the totals of the hops above it)"
        )?,
        dropped => writeln!(
            out,
            "(+{dropped} hops dropped from the end to fit the header; their time is in the totals of the hops above them)"
        )?,
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

    /// front calls inventory then pricing; pricing calls tax; one hop dropped.
    const TREE: &str = "2;front:GET%20/:2500:48000;9500@inventory:GET%20/stock:9300:9400;\
        1^36000@pricing:POST%20/price:20100:35500:cpu-wait:31000;15400@tax:GET:15000:15000;+1";

    #[test]
    fn the_table_shows_the_call_tree_and_says_what_was_dropped() {
        let path = dcpt::decode(TREE).unwrap();
        let mut text = Vec::new();
        write_table(&mut text, &path).unwrap();
        let text = String::from_utf8(text).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert!(lines.iter().all(|line| !line.ends_with(' ')), "{text}");
        assert!(lines[0].contains("from caller"), "{text}");
        // The outermost hop has no caller on the path: no wire time.
        assert!(
            lines[1].contains("   0  front ")
                && lines[1].contains("GET /")
                && lines[1].ends_with("48.0 ms"),
            "{text}"
        );
        // Sequential calls are siblings, one level in; the wire time is into each.
        assert!(
            lines[2].contains("   1    inventory ") && lines[2].ends_with("100.0 µs"),
            "{text}"
        );
        assert!(
            lines[3].contains("   2    pricing ")
                && lines[3].contains("500.0 µs  cpu-wait 31.0 ms"),
            "{text}"
        );
        assert!(
            lines[4].contains("   3      tax ") && lines[4].ends_with("400.0 µs"),
            "{text}"
        );
        assert!(lines[5].starts_with("(+1 hop dropped"), "{text}");
    }

    #[test]
    fn a_deep_chain_is_indented_only_so_far() {
        let chain = format!("1;{}", vec!["a:b:0:0"; 5000].join(";"));
        let path = dcpt::decode(&chain).unwrap();
        let mut text = Vec::new();
        write_table(&mut text, &path).unwrap();
        let text = String::from_utf8(text).unwrap();
        let last = text.lines().last().unwrap();
        assert!(last.contains("(depth 4999) a"), "{last}");
        assert!(text.len() < 5000 * 200, "{} bytes", text.len());
    }

    #[test]
    fn the_json_has_depths_call_times_and_wire_times_into_each_hop() {
        let json = to_json(&dcpt::decode(TREE).unwrap());
        let hops = json["hops"].as_array().unwrap();
        let depths: Vec<_> = hops.iter().map(|h| h["depth"].as_u64().unwrap()).collect();
        assert_eq!(depths, [0, 1, 1, 2]);
        assert!(hops[0].get("call_us").is_none());
        assert_eq!(hops[2]["call_us"], 36000);
        let wire: Vec<_> = hops.iter().map(|h| h["wire_us"].as_u64()).collect();
        assert_eq!(wire, [None, Some(100), Some(500), Some(400)]);
        assert!(hops[0]["wire_us"].is_null());
        assert_eq!(hops[2]["cause"]["name"], "cpu-wait");
        assert_eq!(json["dropped"], 1);
        // Version 1: a chain, the wire time from the caller's times.
        let json = to_json(&dcpt::decode("1;a:x:10:100;b:y:50:70").unwrap());
        assert_eq!(json["hops"][1]["depth"], 1);
        assert_eq!(json["hops"][1]["wire_us"], 20);
    }
}
