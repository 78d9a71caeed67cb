//! Span storage inside a run folder.
//!
//! Layout: `RUN/spans/otlp-NNN.pb`, each file a sequence of records, each
//! record one OTLP `ExportTraceServiceRequest` in protobuf, preceded by its
//! length as a protobuf varint (`prost`'s length-delimited encoding, the same
//! framing as `writeDelimitedTo` in the protobuf libraries). So:
//! - a receiver appends the requests it gets as they are (no conversion);
//! - any protobuf library reads the files back; nothing deepspan-specific;
//! - several writers (receiver, importer, a later session) never share a
//!   file: each [`SpanWriter`] creates the next free `NNN`;
//! - a writer killed mid-record leaves a truncated last record, which the
//!   reader skips with a note naming the file, byte offset and sizes, after
//!   yielding every complete record before it; a record that is complete
//!   but does not decode is an error naming file and offset.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use crate::error::Error;
use crate::model::Span;
use crate::otlp::{request_from_spans, spans_from_request};
use crate::{Format, Import};
use deepspan_run::Run;

/// Appends spans to a new file in `RUN/spans/`.
pub struct SpanWriter {
    path: PathBuf,
    out: BufWriter<File>,
    records: u64,
}

impl SpanWriter {
    /// Creates `RUN/spans/otlp-NNN.pb` with the first unused `NNN` (creating
    /// `spans/` if needed).
    pub fn create(run_dir: &Path) -> Result<SpanWriter, Error> {
        let run = Run::new(run_dir);
        let dir = run.spans_dir();
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(&dir, "cannot create the spans folder", e))?;
        for n in 0..100_000u32 {
            let path = run.span_file(n);
            // create_new: two writers racing for a number never share a file.
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => {
                    return Ok(SpanWriter {
                        path,
                        out: BufWriter::new(f),
                        records: 0,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&path, "cannot create span file", e)),
            }
        }
        Err(Error::io(
            &dir,
            "no free otlp-NNN.pb name",
            std::io::Error::other("100000 files already"),
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one request as one record (what an OTLP receiver gets).
    pub fn append_request(&mut self, req: &ExportTraceServiceRequest) -> Result<(), Error> {
        let buf = req.encode_length_delimited_to_vec();
        self.out
            .write_all(&buf)
            .map_err(|e| Error::io(&self.path, "cannot write spans", e))?;
        self.records += 1;
        Ok(())
    }

    /// Appends one request already encoded in protobuf as one record, without
    /// decoding it again: a receiver that has checked a request stores the
    /// bytes it got (unknown fields included) instead of re-encoding it. The
    /// caller vouches that `encoded` is an `ExportTraceServiceRequest`.
    pub fn append_encoded(&mut self, encoded: &[u8]) -> Result<(), Error> {
        let mut header = Vec::with_capacity(10);
        prost::encoding::encode_varint(encoded.len() as u64, &mut header);
        self.out
            .write_all(&header)
            .and_then(|()| self.out.write_all(encoded))
            .map_err(|e| Error::io(&self.path, "cannot write spans", e))?;
        self.records += 1;
        Ok(())
    }

    /// Appends spans as one record. Empty slices write nothing.
    pub fn append(&mut self, spans: &[Span]) -> Result<(), Error> {
        if spans.is_empty() {
            return Ok(());
        }
        self.append_request(&request_from_spans(spans))
    }

    /// Pushes buffered records to the file (readers see them after this).
    pub fn flush(&mut self) -> Result<(), Error> {
        self.out
            .flush()
            .map_err(|e| Error::io(&self.path, "cannot flush spans", e))
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }
}

impl Drop for SpanWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

/// The span files of a run, in name order. A run without spans has none.
pub fn span_files(run_dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let dir = Run::new(run_dir).spans_dir();
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .map_err(|e| Error::io(&dir, "cannot list the spans folder", e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| Run::is_span_file(&n.to_string_lossy()))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Streams the records of one length-delimited file.
///
/// A writer killed mid-record (SIGKILL, power loss) leaves a truncated last
/// record: it is skipped with a note in [`RecordReader::warnings`] (file,
/// byte offset, bytes present and expected), after every complete record.
/// Anything else that does not decode is an error naming file and offset.
pub struct RecordReader<R: Read = BufReader<File>> {
    path: PathBuf,
    input: R,
    offset: u64,
    index: u64,
    done: bool,
    /// Non-fatal problems: a truncated last record.
    pub warnings: Vec<String>,
}

/// Records longer than this are not something deepspan writes (the receiver
/// takes requests of at most 16 MiB): the length is corruption.
const MAX_RECORD_BYTES: u64 = 1 << 31;

impl RecordReader {
    pub fn open(path: &Path) -> Result<RecordReader, Error> {
        let f = File::open(path).map_err(|e| Error::io(path, "cannot open span file", e))?;
        Ok(RecordReader::from_reader(path, BufReader::new(f)))
    }
}

impl<R: Read> RecordReader<R> {
    /// Records from any reader (bytes in memory, a pipe); `name` stands for
    /// the file in errors and notes.
    pub fn from_reader(name: &Path, input: R) -> RecordReader<R> {
        RecordReader {
            path: name.to_path_buf(),
            input,
            offset: 0,
            index: 0,
            done: false,
            warnings: Vec::new(),
        }
    }

    /// Where the next record starts: its byte offset in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn bad(&self, reason: String) -> Error {
        Error::invalid(
            &self.path.display().to_string(),
            "deepspan span storage",
            format!("record {} at byte {}", self.index, self.offset),
            reason,
        )
    }

    fn truncated(&mut self, present: u64, expected: String) {
        self.done = true;
        self.warnings.push(format!(
            "{}: the last record (record {}, at byte {}) is truncated: {present} bytes present, {expected}; the writer probably stopped mid-write; skipped (every record before it is read)",
            self.path.display(),
            self.index,
            self.offset
        ));
    }
}

impl<R: Read> Iterator for RecordReader<R> {
    type Item = Result<ExportTraceServiceRequest, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        // Varint length, byte by byte, so a clean end of file is told apart from a truncated header.
        let mut len: u64 = 0;
        let mut shift = 0;
        let mut header = 0u64;
        loop {
            let mut b = [0u8; 1];
            match self.input.read(&mut b) {
                Ok(0) if header == 0 => {
                    self.done = true;
                    return None;
                }
                Ok(0) => {
                    self.truncated(header, "the record length is incomplete".into());
                    return None;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.done = true;
                    return Some(Err(Error::io(&self.path, "cannot read span file", e)));
                }
            }
            header += 1;
            len |= ((b[0] & 0x7f) as u64) << shift;
            if b[0] & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                self.done = true;
                return Some(Err(self.bad("record length is not a valid varint".into())));
            }
        }
        if len > MAX_RECORD_BYTES {
            self.done = true;
            return Some(Err(self.bad(format!(
                "record length {len} is implausible (over 2 GiB): not a span file, or corrupted"
            ))));
        }
        // The buffer grows with the bytes really read, never to what the
        // length field claims: a corrupt length costs no memory.
        let mut buf = Vec::new();
        if let Err(e) = (&mut self.input).take(len).read_to_end(&mut buf) {
            self.done = true;
            return Some(Err(Error::io(&self.path, "cannot read span file", e)));
        }
        if (buf.len() as u64) < len {
            self.truncated(
                header + buf.len() as u64,
                format!("the record needs {}", header + len),
            );
            return None;
        }
        let item = ExportTraceServiceRequest::decode(buf.as_slice())
            .map_err(|e| self.bad(format!("not an OTLP ExportTraceServiceRequest: {e}")));
        if item.is_err() {
            self.done = true;
        }
        self.offset += header + len;
        self.index += 1;
        Some(item)
    }
}

/// Streams every span of a run (all `spans/otlp-*.pb` files, in order).
pub struct RunSpans {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<(RecordReader, String)>,
    pending: std::vec::IntoIter<Span>,
    /// Non-fatal problems seen so far (times clamped, links dropped, a
    /// truncated last record skipped).
    pub warnings: Vec<String>,
}

/// Opens the spans of a run for streaming. A run without `spans/` yields nothing.
pub fn read_run_spans(run_dir: &Path) -> Result<RunSpans, Error> {
    Ok(RunSpans {
        files: span_files(run_dir)?.into_iter(),
        current: None,
        pending: Vec::new().into_iter(),
        warnings: Vec::new(),
    })
}

impl Iterator for RunSpans {
    type Item = Result<Span, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(s) = self.pending.next() {
                return Some(Ok(s));
            }
            if self.current.is_none() {
                let path = self.files.next()?;
                match RecordReader::open(&path) {
                    Ok(r) => self.current = Some((r, path.display().to_string())),
                    Err(e) => return Some(Err(e)),
                }
            }
            let (reader, name) = self.current.as_mut().expect("set above");
            match reader.next() {
                None => {
                    self.warnings.append(&mut reader.warnings);
                    self.current = None;
                }
                Some(Err(e)) => {
                    self.current = None;
                    return Some(Err(e));
                }
                Some(Ok(req)) => {
                    let mut import = Import::new(Format::OtlpProtobuf);
                    let label = format!("{name} record {}", reader.index - 1);
                    if let Err(e) = spans_from_request(&req, &label, "OTLP protobuf", &mut import) {
                        return Some(Err(e));
                    }
                    self.warnings.append(&mut import.warnings);
                    self.pending = import.spans.into_iter();
                }
            }
        }
    }
}
