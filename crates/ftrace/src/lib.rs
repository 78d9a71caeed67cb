//! Reader for trace-cmd's `trace.dat` files (versions 6 and 7), decoding
//! kernel ring-buffer records into deepspan's typed event model.
//!
//! ```no_run
//! # fn main() -> Result<(), deepspan_ftrace::Error> {
//! let trace = deepspan_ftrace::TraceDat::open("trace.dat".as_ref())?;
//! let schema = trace.schema().clone();
//! for record in trace.records()? {
//!     let event = record?.to_event(&schema);
//!     println!("{} {} {}", event.ts, event.cpu, event.kind.name());
//! }
//! # Ok(()) }
//! ```
//!
//! [`TraceDat`] reads the metadata when opened; records are decoded lazily,
//! per CPU ([`TraceDat::cpu_records`]) or merged in time order
//! ([`TraceDat::records`]), from bounded chunks of the file. The typed path
//! ([`Record::to_event`]) uses field positions worked out once per event
//! format; [`Record::fields`] decodes any event generically.
//!
//! Malformed input gives an [`Error`] naming the file offset, never a panic.
//! A v6 file cut short after its event formats (an interrupted copy) is not
//! refused: every whole ring-buffer page before the cut is decoded and
//! [`TraceDat::truncation`] says what is lost ([`Truncation`]). A cut v7
//! file is refused saying so: trace-cmd writes its CPU table last.

mod compress;
mod error;
mod format;
mod record;
mod retime;
mod ring;
mod schema;
mod source;
mod trace;
mod truncation;
mod typed;

pub use error::{Error, Location};
pub use format::{parse_format, ArrayLen, Dynamic, EventFormat, FieldFormat};
pub use record::{Record, RecordRef};
pub use retime::{retime_trace_dat, RetimeError, RetimeStats};
pub use ring::{CpuRecords, Records};
pub use schema::{Schema, UNKNOWN_EVENT};
pub use trace::TraceDat;
pub use truncation::{CpuCut, Truncation};

// trace.dat v6 writer (used by deepspan-record).
pub mod write;
pub use write::{write_trace_dat, TraceDatMeta, WriteError};
