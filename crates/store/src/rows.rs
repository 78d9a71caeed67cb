//! The analysis tables read back as typed rows.
//!
//! Each table is declared once, in `tables.rs`, with [`table!`]: a struct
//! whose fields are its columns. The declaration gives the writers the
//! table's schema (the `*_COLUMNS` list that every file is created with)
//! and gives readers the same struct, one value per row. A column added,
//! renamed or retyped changes both sides, and a reader that used it no
//! longer compiles.
//!
//! Reading a file checks it against the struct once: a required column the
//! file lacks is an error naming the file and the column. A nullable column
//! the file lacks reads as null: that is how an older layout of a table
//! reads (a `diagnoses` table of layout 1 has no `root_*` columns). Columns
//! the struct does not know are not decoded.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::file::reader::{FileReader, SerializedFileReader};
#[doc(hidden)]
pub use parquet::record::Field;
use parquet::schema::types::Type;

use crate::table::{Column, Kind};
use crate::Error;

/// A Rust type a column is read into: its column kind, whether it may be
/// null, and how a Parquet value becomes it.
pub trait CellType: Sized {
    const KIND: Kind;
    const NULLABLE: bool = false;
    /// The value of one cell; the cell back when it holds another type
    /// (a null fits only the nullable types).
    fn from_field(field: Field) -> Result<Self, Field>;
}

impl CellType for i32 {
    const KIND: Kind = Kind::I32;
    fn from_field(field: Field) -> Result<i32, Field> {
        match field {
            Field::Int(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl CellType for i64 {
    const KIND: Kind = Kind::I64;
    fn from_field(field: Field) -> Result<i64, Field> {
        match field {
            Field::Long(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl CellType for u64 {
    const KIND: Kind = Kind::U64;
    fn from_field(field: Field) -> Result<u64, Field> {
        match field {
            Field::ULong(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl CellType for f64 {
    const KIND: Kind = Kind::F64;
    fn from_field(field: Field) -> Result<f64, Field> {
        match field {
            Field::Double(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl CellType for bool {
    const KIND: Kind = Kind::Bool;
    fn from_field(field: Field) -> Result<bool, Field> {
        match field {
            Field::Bool(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl CellType for String {
    const KIND: Kind = Kind::Str;
    fn from_field(field: Field) -> Result<String, Field> {
        match field {
            Field::Str(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl<T: CellType> CellType for Option<T> {
    const KIND: Kind = T::KIND;
    const NULLABLE: bool = true;
    fn from_field(field: Field) -> Result<Option<T>, Field> {
        match field {
            Field::Null => Ok(None),
            other => T::from_field(other).map(Some),
        }
    }
}

/// A table's row, declared with [`table!`].
pub trait TableRow: Sized {
    /// The table's schema, in file order.
    const COLUMNS: &'static [Column];
    /// A row from its cells, one per column of [`TableRow::COLUMNS`] in
    /// that order (`None` for a nullable column the file lacks). `Err`
    /// names the first column whose cell does not fit.
    fn from_cells(cells: &mut [Option<Field>]) -> Result<Self, CellError>;
}

/// Why a cell could not be read as its column's type.
#[derive(Debug)]
pub struct CellError {
    pub column: &'static str,
    pub found: String,
}

/// The value of the next cell (see [`TableRow::from_cells`]).
#[doc(hidden)]
pub fn take_cell<T: CellType>(
    cell: Option<&mut Option<Field>>,
    column: &'static str,
) -> Result<T, CellError> {
    let field = cell.and_then(Option::take).unwrap_or(Field::Null);
    T::from_field(field).map_err(|field| CellError {
        column,
        found: match field {
            Field::Null => "null".to_string(),
            other => format!("{other:?}"),
        },
    })
}

/// Declares a table: its row struct, whose fields are its columns in file
/// order, and the schema constant derived from it. The field types are
/// [`CellType`]s; `Option` makes a column nullable.
macro_rules! table {
    (
        $(#[$doc:meta])*
        pub struct $row:ident, schema $columns:ident {
            $( $(#[$field_doc:meta])* $name:ident : $ty:ty ),* $(,)?
        }
    ) => {
        /// The schema of the table whose rows are
        #[doc = concat!("[`", stringify!($row), "`].")]
        pub const $columns: &[$crate::table::Column] = &[$(
            $crate::table::Column {
                name: stringify!($name),
                kind: <$ty as $crate::rows::CellType>::KIND,
                nullable: <$ty as $crate::rows::CellType>::NULLABLE,
            }
        ),*];

        $crate::table_view! {
            $(#[$doc])*
            pub struct $row of $columns {
                $( $(#[$field_doc])* $name: $ty, )*
            }
        }
    };
}
pub(crate) use table;

/// Declares some columns of a table as a row struct of their own, for a
/// reader that needs only those: a file is then decoded only in them.
/// Each field must be a column of `$columns` (a table's `*_COLUMNS`) with
/// the same name, kind and nullability, or the crate does not compile.
///
/// ```ignore
/// deepspan_store::table_view! {
///     /// What export reads of a system call.
///     pub struct CallTimes of deepspan_store::tables::SYSCALLS_COLUMNS {
///         tid: i32,
///         start_ns: i64,
///         end_ns: i64,
///     }
/// }
/// ```
#[macro_export]
macro_rules! table_view {
    (
        $(#[$doc:meta])*
        pub struct $row:ident of $columns:path {
            $( $(#[$field_doc:meta])* $name:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $row {
            $( $(#[$field_doc])* pub $name: $ty, )*
        }

        impl $crate::rows::TableRow for $row {
            const COLUMNS: &'static [$crate::table::Column] = &[$(
                $crate::table::Column {
                    name: stringify!($name),
                    kind: <$ty as $crate::rows::CellType>::KIND,
                    nullable: <$ty as $crate::rows::CellType>::NULLABLE,
                }
            ),*];

            fn from_cells(
                cells: &mut [Option<$crate::rows::Field>],
            ) -> Result<$row, $crate::rows::CellError> {
                let mut cells = cells.iter_mut();
                Ok($row {
                    $( $name: $crate::rows::take_cell(cells.next(), stringify!($name))?, )*
                })
            }
        }

        const _: () = assert!(
            $crate::rows::columns_of(
                <$row as $crate::rows::TableRow>::COLUMNS,
                $columns,
            ),
            concat!(stringify!($row), " has a field that is not a column of ", stringify!($columns)),
        );
    };
}

/// Whether every column of `view` is a column of `table`, with the same
/// kind and nullability (checked at compile time by [`table_view!`]).
#[doc(hidden)]
pub const fn columns_of(view: &[Column], table: &[Column]) -> bool {
    let mut i = 0;
    while i < view.len() {
        let mut found = false;
        let mut j = 0;
        while j < table.len() {
            let (v, t) = (&view[i], &table[j]);
            if same_text(v.name, t.name) && v.kind as u8 == t.kind as u8 && v.nullable == t.nullable
            {
                found = true;
            }
            j += 1;
        }
        if !found {
            return false;
        }
        i += 1;
    }
    true
}

const fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Calls `each` with every row of the table at `path`, in file order,
/// without holding the table in memory.
pub fn for_each_row<R: TableRow>(path: &Path, mut each: impl FnMut(R)) -> Result<(), Error> {
    let reader = open(path)?;
    let (projection, slot_of) = projection::<R>(path, &reader)?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| Error::parquet(path, "reading rows", e))?;
    let mut cells: Vec<Option<Field>> = vec![None; R::COLUMNS.len()];
    for (n, row) in rows.enumerate() {
        let row = row.map_err(|e| Error::parquet(path, "reading a row", e))?;
        for (position, (_, field)) in row.into_columns().into_iter().enumerate() {
            cells[slot_of[position]] = Some(field);
        }
        let row = R::from_cells(&mut cells).map_err(|e| Error::Schema {
            path: path.to_path_buf(),
            what: format!(
                "row {n}: column {:?} holds {}, not a value of its type",
                e.column, e.found
            ),
        })?;
        each(row);
    }
    Ok(())
}

/// The rows of the table at `path` for which `keep` is true, in file
/// order.
pub fn read_table<R: TableRow>(
    path: &Path,
    mut keep: impl FnMut(&R) -> bool,
) -> Result<Vec<R>, Error> {
    let mut kept = Vec::new();
    for_each_row(path, |row: R| {
        if keep(&row) {
            kept.push(row);
        }
    })?;
    Ok(kept)
}

fn open(path: &Path) -> Result<SerializedFileReader<File>, Error> {
    let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    SerializedFileReader::new(file).map_err(|e| Error::parquet(path, "reading the footer", e))
}

/// The file's columns that `R` has, in file order, and for each the index
/// of its field in `R::COLUMNS`.
fn projection<R: TableRow>(
    path: &Path,
    reader: &SerializedFileReader<File>,
) -> Result<(Type, Vec<usize>), Error> {
    let schema = reader.metadata().file_metadata().schema();
    let in_file = schema.get_fields();
    for column in R::COLUMNS {
        if !column.nullable && !in_file.iter().any(|f| f.name() == column.name) {
            return Err(Error::Schema {
                path: path.to_path_buf(),
                what: format!(
                    "no column {:?}: not a table of this layout (written by another deepspan?)",
                    column.name
                ),
            });
        }
    }
    let (fields, slot_of): (Vec<Arc<Type>>, Vec<usize>) = in_file
        .iter()
        .filter_map(|f| {
            let slot = R::COLUMNS.iter().position(|c| c.name == f.name())?;
            Some((f.clone(), slot))
        })
        .unzip();
    let projection = Type::group_type_builder(schema.name())
        .with_fields(fields)
        .build()
        .map_err(|e| Error::parquet(path, "selecting columns", e))?;
    Ok((projection, slot_of))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::TableWriter;

    table! {
        /// A table of every kind of column.
        pub struct SampleRow, schema SAMPLE_COLUMNS {
            /// An id.
            id: i32,
            big: u64,
            at: i64,
            label: Option<String>,
            share: f64,
            flag: bool,
            extra: Option<i64>,
        }
    }

    fn write(path: &Path, columns: &[Column], rows: &[SampleRow]) {
        let mut w = TableWriter::create(path, columns).unwrap();
        for r in rows {
            for c in columns {
                match c.name {
                    "id" => w.i32(r.id),
                    "big" => w.u64(r.big),
                    "at" => w.i64(r.at),
                    "label" => w.opt_str(r.label.as_deref()),
                    "share" => w.f64(r.share),
                    "flag" => w.bool(r.flag),
                    "extra" => w.opt_i64(r.extra),
                    "unknown" => w.str("ignored"),
                    other => panic!("no column {other}"),
                }
            }
            w.end_row().unwrap();
        }
        w.finish().unwrap();
    }

    fn sample(i: i32) -> SampleRow {
        SampleRow {
            id: i,
            big: u64::MAX - i as u64,
            at: -(i as i64),
            label: (i % 2 == 0).then(|| format!("l{i}")),
            share: f64::from(i) / 4.0,
            flag: i % 3 == 0,
            extra: (i % 5 == 0).then_some(i64::from(i) * 7),
        }
    }

    crate::table_view! {
        /// Two columns of the sample, in another order.
        pub struct SampleIds of SAMPLE_COLUMNS {
            label: Option<String>,
            id: i32,
        }
    }

    #[test]
    fn a_view_reads_only_its_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let rows: Vec<SampleRow> = (0..9).map(sample).collect();
        write(&path, SAMPLE_COLUMNS, &rows);
        let back: Vec<SampleIds> = read_table(&path, |_| true).unwrap();
        let expected: Vec<SampleIds> = rows
            .iter()
            .map(|r| SampleIds {
                label: r.label.clone(),
                id: r.id,
            })
            .collect();
        assert_eq!(back, expected);
        let retyped = [Column::nullable("id", Kind::I32)];
        assert!(columns_of(&SAMPLE_COLUMNS[..2], SAMPLE_COLUMNS));
        assert!(!columns_of(&retyped, SAMPLE_COLUMNS));
        assert!(!columns_of(
            &[Column::new("idx", Kind::I32)],
            SAMPLE_COLUMNS
        ));
    }

    #[test]
    fn the_schema_is_the_struct_in_order() {
        let names: Vec<_> = SAMPLE_COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            ["id", "big", "at", "label", "share", "flag", "extra"]
        );
        assert_eq!(SAMPLE_COLUMNS[1].kind, Kind::U64);
        assert!(!SAMPLE_COLUMNS[0].nullable);
        assert!(SAMPLE_COLUMNS[3].nullable);
        assert_eq!(SAMPLE_COLUMNS[3].kind, Kind::Str);
    }

    #[test]
    fn rows_read_back_as_written_across_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let rows: Vec<SampleRow> = (0..crate::table::ROW_GROUP as i32 + 7)
            .map(sample)
            .collect();
        write(&path, SAMPLE_COLUMNS, &rows);
        let back: Vec<SampleRow> = read_table(&path, |_| true).unwrap();
        assert_eq!(back, rows);
        let odd: Vec<SampleRow> = read_table(&path, |r: &SampleRow| r.id % 2 == 1).unwrap();
        assert_eq!(odd.len(), rows.len() / 2);
        assert!(odd.iter().all(|r| r.label.is_none()));
    }

    #[test]
    fn an_older_layout_without_a_nullable_column_reads_it_as_null() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        // Without `extra`, and with a column the row does not know.
        let mut older: Vec<Column> = SAMPLE_COLUMNS[..6].to_vec();
        older.push(Column::new("unknown", Kind::Str));
        let rows: Vec<SampleRow> = (0..5).map(sample).collect();
        write(&path, &older, &rows);
        let back: Vec<SampleRow> = read_table(&path, |_| true).unwrap();
        let expected: Vec<SampleRow> = rows
            .into_iter()
            .map(|r| SampleRow { extra: None, ..r })
            .collect();
        assert_eq!(back, expected);
    }

    #[test]
    fn a_missing_required_column_names_the_file_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let without_at: Vec<Column> = SAMPLE_COLUMNS
            .iter()
            .filter(|c| c.name != "at")
            .cloned()
            .collect();
        write(&path, &without_at, &[sample(1)]);
        let err = read_table::<SampleRow>(&path, |_| true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.parquet") && err.contains("no column \"at\""),
            "{err}"
        );
    }

    #[test]
    fn a_column_of_another_type_is_an_error_with_its_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut retyped: Vec<Column> = SAMPLE_COLUMNS.to_vec();
        retyped[2] = Column::new("at", Kind::Str);
        let mut w = TableWriter::create(&path, &retyped).unwrap();
        let r = sample(2);
        w.i32(r.id);
        w.u64(r.big);
        w.str("not a time");
        w.opt_str(r.label.as_deref());
        w.f64(r.share);
        w.bool(r.flag);
        w.opt_i64(r.extra);
        w.end_row().unwrap();
        w.finish().unwrap();
        let err = read_table::<SampleRow>(&path, |_| true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 0") && err.contains("\"at\""), "{err}");
    }
}
