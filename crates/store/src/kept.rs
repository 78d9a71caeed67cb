//! A table kept in memory as it is written, for a caller in the same
//! process that reads it back at once: the agent exports each snapshot
//! right after analysing it. Its rows read as the file's do, as the same
//! typed rows ([`crate::rows::TableRow`], through
//! [`KeptTable::for_each_row`]), without decoding the file again.
//!
//! A writer keeps a copy of each row group's column buffers before it
//! encodes them, and only of the columns it was asked to keep (those of
//! the reader's row type): a reader of the system calls needs 7 of 12.
//! The file is written all the same.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use deepspan_analysis::Containers;

use crate::json::RequestEntry;
use crate::rows::Cell;
use crate::table::{Buffer, Column, Values};

/// Which columns of the tables to keep: those of the reader's row types
/// (`TableRow::COLUMNS`).
#[derive(Clone, Copy, Debug)]
pub struct KeepColumns {
    pub critical_path: &'static [Column],
    pub syscalls: &'static [Column],
}

/// An analysis's results kept in memory as they were written, for a
/// caller that exports them at once: `requests.json`'s requests and the
/// kept columns of the `critical_path` and `syscalls` tables.
#[derive(Clone, Debug)]
pub struct KeptAnalysis {
    /// Slowest first, as in `requests.json`.
    pub requests: Vec<RequestEntry>,
    pub critical_path: KeptTable,
    pub syscalls: KeptTable,
    /// As the `containers` table holds them.
    pub containers: Containers,
}

/// The rows of one table file, kept in memory as they were written (only
/// the columns the writer was asked to keep).
#[derive(Clone, Debug)]
pub struct KeptTable {
    /// The file written alongside: errors name it.
    pub(crate) path: PathBuf,
    /// The kept columns, in the file's order.
    pub(crate) schema: Vec<Column>,
    pub(crate) groups: Vec<KeptGroup>,
}

/// One row group: a column per kept column of the schema.
#[derive(Clone, Debug)]
pub(crate) struct KeptGroup {
    pub(crate) rows: usize,
    pub(crate) columns: Vec<KeptColumn>,
}

/// One column of a row group.
#[derive(Clone, Debug)]
pub(crate) struct KeptColumn {
    values: KeptValues,
    /// Definition levels of a nullable column (0: null), one per row;
    /// empty for a required column.
    defs: Vec<i16>,
}

#[derive(Clone, Debug)]
enum KeptValues {
    I32(Vec<i32>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    /// As the writer holds text: per non-null value the index of one of
    /// the group's distinct values.
    Str {
        ids: Vec<u32>,
        distinct: Vec<Bytes>,
    },
}

impl KeptTable {
    /// An empty table keeping `keep`'s columns of a file of `schema`.
    /// A name of `keep` that `schema` lacks is not kept (a reader of it
    /// is told when it reads).
    pub(crate) fn new(path: &Path, schema: &[Column], keep: &[Column]) -> KeptTable {
        KeptTable {
            path: path.to_path_buf(),
            schema: schema
                .iter()
                .filter(|c| keep.iter().any(|k| k.name == c.name))
                .copied()
                .collect(),
            groups: Vec::new(),
        }
    }

    /// The file the table was written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rows in the table.
    pub fn rows(&self) -> usize {
        self.groups.iter().map(|g| g.rows).sum()
    }

    /// Copies the kept columns of a row group about to be written
    /// (`buffers`: every column of the file, in its order).
    pub(crate) fn add_group(&mut self, buffers: &[&mut Buffer], rows: usize) {
        let columns = buffers
            .iter()
            .filter(|b| self.schema.iter().any(|c| c.name == b.column.name))
            .map(|b| KeptColumn::copy_of(b))
            .collect();
        self.groups.push(KeptGroup { rows, columns });
    }
}

impl KeptColumn {
    fn copy_of(buffer: &Buffer) -> KeptColumn {
        let values = match &buffer.values {
            Values::I32(v) => KeptValues::I32(v.clone()),
            Values::I64(v) => KeptValues::I64(v.clone()),
            Values::F64(v) => KeptValues::F64(v.clone()),
            Values::Bool(v) => KeptValues::Bool(v.clone()),
            Values::Str(v) => {
                let (ids, distinct) = v.parts();
                KeptValues::Str {
                    ids: ids.to_vec(),
                    distinct: distinct.to_vec(),
                }
            }
        };
        let defs = if buffer.column.nullable {
            buffer.defs.clone()
        } else {
            Vec::new()
        };
        KeptColumn { values, defs }
    }

    /// The cell of `row`; `next_value` is the index of the column's next
    /// non-null value (nulls hold none), advanced past it.
    pub(crate) fn cell(&self, row: usize, next_value: &mut usize) -> Cell<'_> {
        if !self.defs.is_empty() && self.defs.get(row).is_none_or(|&d| d == 0) {
            return Cell::Null;
        }
        let i = *next_value;
        *next_value += 1;
        let cell = match &self.values {
            KeptValues::I32(v) => v.get(i).map(|&v| Cell::I32(v)),
            KeptValues::I64(v) => v.get(i).map(|&v| Cell::I64(v)),
            KeptValues::F64(v) => v.get(i).map(|&v| Cell::F64(v)),
            KeptValues::Bool(v) => v.get(i).map(|&v| Cell::Bool(v)),
            KeptValues::Str { ids, distinct } => ids
                .get(i)
                .and_then(|&id| distinct.get(id as usize))
                .map(|b| Cell::Bytes(b)),
        };
        cell.unwrap_or(Cell::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::{columns, ColumnarTable, Optional, OptionalText, Required, Text};
    use crate::rows::{read_table, table, TableRow};
    use crate::table::ROW_GROUP;

    table! {
        /// A table of each kind of column a writer keeps.
        pub struct SampleRow, schema SAMPLE_COLUMNS {
            id: i32,
            at: Option<i64>,
            flag: bool,
            label: String,
            note: Option<String>,
        }
    }

    columns! {
        struct SampleColumns {
            id: Required<i32>,
            at: Optional<i64>,
            flag: Required<bool>,
            label: Text,
            note: OptionalText,
        }
    }

    crate::table_view! {
        /// Some columns, in another order than the file's.
        pub struct SampleNotes of SAMPLE_COLUMNS {
            note: Option<String>,
            id: i32,
        }
    }

    /// Writes rows over three row groups, with nulls and repeated text,
    /// keeping `keep`.
    fn write(path: &Path, keep: &[Column]) -> KeptTable {
        let mut t = ColumnarTable::<SampleColumns>::create(path, SAMPLE_COLUMNS).unwrap();
        t.keep(keep);
        let labels: Vec<Bytes> = (0..7).map(|i| Bytes::from(format!("label {i}"))).collect();
        for i in 0..2 * ROW_GROUP + 11 {
            let c = &mut t.columns;
            c.id.push(i as i32);
            c.at.push((i % 3 != 0).then_some(-(i as i64) * 1000));
            c.flag.push(i % 2 == 0);
            c.label.push(&labels[i % labels.len()]);
            c.note
                .push((i % 5 == 0).then_some(&labels[(i / 5) % labels.len()]));
            t.end_row().unwrap();
        }
        let (rows, kept) = t.finish_kept().unwrap();
        assert_eq!(rows, 2 * ROW_GROUP as u64 + 11);
        kept.expect("asked to keep")
    }

    fn rows_of<R: TableRow>(kept: &KeptTable) -> Vec<R> {
        let mut rows = Vec::new();
        kept.for_each_row(|r: R| rows.push(r)).unwrap();
        rows
    }

    #[test]
    fn kept_rows_are_the_rows_read_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let kept = write(&path, SAMPLE_COLUMNS);
        assert_eq!(kept.path(), path);
        assert_eq!(kept.rows(), 2 * ROW_GROUP + 11);
        let from_file: Vec<SampleRow> = read_table(&path, |_| true).unwrap();
        assert_eq!(rows_of::<SampleRow>(&kept), from_file);
        let notes: Vec<SampleNotes> = read_table(&path, |_| true).unwrap();
        assert_eq!(rows_of::<SampleNotes>(&kept), notes);
        assert!(notes.iter().any(|n| n.note.is_some()) && notes.iter().any(|n| n.note.is_none()));
    }

    #[test]
    fn only_the_columns_asked_for_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let kept = write(&path, <SampleNotes as TableRow>::COLUMNS);
        let notes: Vec<SampleNotes> = read_table(&path, |_| true).unwrap();
        assert_eq!(rows_of::<SampleNotes>(&kept), notes);
        // The file has every column all the same.
        assert_eq!(
            read_table(&path, |_: &SampleRow| true).unwrap().len(),
            notes.len()
        );
        let e = kept
            .for_each_row(|_: SampleRow| {})
            .unwrap_err()
            .to_string();
        // `at` is nullable, so missing reads as null; `flag` is required.
        assert!(e.contains("no column \"flag\" kept"), "{e}");
        assert!(e.contains("t.parquet"), "{e}");
    }
}
