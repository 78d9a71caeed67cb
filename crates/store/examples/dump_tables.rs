//! Prints every row of every table of `RUN/analysis/` (or of the folder
//! given), one line per row, tables in name order: for comparing two
//! analyses of the same run (`diff`), e.g. before and after a change that
//! must not change results.
//!
//! `cargo run --release -p deepspan-store --example dump_tables -- RUN/analysis`

use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: dump_tables ANALYSIS_DIR")?;
    let mut names: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    names.sort();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for path in names {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let mut rows = 0u64;
        deepspan_store::table::read_rows(&path, |cells| {
            rows += 1;
            let _ = write!(out, "{name}");
            for (_, c) in cells {
                let _ = write!(out, "\t{c:?}");
            }
            let _ = writeln!(out);
            false
        })?;
        eprintln!("{name}: {rows} rows");
    }
    Ok(())
}
