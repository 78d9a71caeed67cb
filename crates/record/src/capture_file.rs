//! What the eBPF captures that write a text file share: the file (a
//! header line, then one record a line), its reader, the capture of a
//! standard recording that writes it, and the flight recorder's history
//! that writes a window's of it.
//!
//! A capture's record type says how it reads from the program's ring and
//! from a line, and how it writes its line ([`CaptureLine`]); one that
//! every recording and flight window makes also says which program, file
//! and manifest section are its ([`Recorded`]). The rest is here, once:
//! `blocked_syscalls.rs`, `socket_calls.rs`, `idle_switches.rs`,
//! `throttle.rs` and `tcpkeys.rs` keep only their record layout, their
//! program and their manifest section.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::bpf::{Capture, RecordSink, Ring};
use crate::sched_switch::SwitchProgram;
use crate::Error;

/// One record of a capture: a line of its file and a record of its
/// program's ring buffer.
pub(crate) trait CaptureLine: Copy + Send + 'static {
    /// The file's first line, `# deepspan NAME vN: COLUMNS`.
    const HEADER: &'static str;
    /// Appends the line (without its newline) to `out` ([`Fields`]).
    fn write_line(&self, out: &mut String);
    /// The line that [`CaptureLine::from_line`] reads back (the tests'
    /// round trips).
    #[cfg(test)]
    fn line(&self) -> String {
        let mut line = String::new();
        self.write_line(&mut line);
        line
    }
    /// What the file holds, for messages ("blocked system calls").
    const WHAT: &'static str;
    /// A record of the program's ring buffer, or None when it is not one.
    fn from_record(record: &[u8]) -> Option<Self>;
    /// One line of the file (without its newline).
    fn from_line(line: &str) -> Result<Self, String>;
    /// Older versions of the file that [`CaptureLine::from_line_of`]
    /// still reads; the current one is [`CaptureLine::HEADER`]'s.
    const OLDER_VERSIONS: &'static [u32] = &[];
    /// One line of a file whose header says `version`: the current one or
    /// one of [`CaptureLine::OLDER_VERSIONS`].
    fn from_line_of(version: u32, line: &str) -> Result<Self, String> {
        let _ = version;
        Self::from_line(line)
    }
    /// CLOCK_MONOTONIC ns.
    fn mono_ns(&self) -> u64;
}

/// A capture line under construction: fields separated by one space.
/// Numbers are written by `itoa` (decimal) or by hand (hexadecimal), not
/// through `core::fmt`: a capture's thread writes tens of thousands of
/// lines a second, and `core::fmt`'s machinery per field was the largest
/// part of the recorder's own CPU samples (bench `capture_lines`).
pub(crate) struct Fields<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(out: &'a mut String) -> Fields<'a> {
        Fields { out, first: true }
    }

    fn separate(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.out.push(' ');
        }
    }

    /// A decimal integer.
    pub(crate) fn num(&mut self, n: impl itoa::Integer) -> &mut Self {
        self.separate();
        self.out.push_str(itoa::Buffer::new().format(n));
        self
    }

    /// `0x` and lowercase hexadecimal digits without leading zeros (`0x0`
    /// for 0), as `{:#x}` writes it.
    pub(crate) fn hex(&mut self, n: u64) -> &mut Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        self.separate();
        self.out.push_str("0x");
        let nibbles = (64 - n.leading_zeros()).div_ceil(4).max(1);
        for k in (0..nibbles).rev() {
            self.out.push(DIGITS[(n >> (4 * k) & 0xf) as usize] as char);
        }
        self
    }

    /// A word without spaces.
    pub(crate) fn text(&mut self, word: &str) -> &mut Self {
        self.separate();
        self.out.push_str(word);
        self
    }
}

/// A capture that every standard recording and every flight window
/// makes: its program, its file in the run folder and its section of the
/// manifest. [`RunCapture`] writes it during a recording; [`History`]
/// keeps it for the flight recorder's windows.
pub(crate) trait Recorded: CaptureLine {
    /// The file, relative to the run folder.
    const FILE: &'static str;
    /// The name of the thread that drains the program's ring.
    const THREAD: &'static str;
    /// Records a flight recorder keeps; beyond, the oldest are dropped.
    const HISTORY: usize;
    /// What a recording without the capture does instead, for its warning
    /// (`": …"`), or nothing.
    const WITHOUT: &'static str = "";
    /// The manifest's section.
    type Section;
    /// Loads and attaches the program (or takes its ring from the
    /// recording's context-switch program): once this returns, every
    /// record is captured. An error says why this kernel or build cannot.
    fn attach(switch: &mut SwitchProgram) -> Result<Ring, String>;
    /// The manifest's section for what was written.
    fn section(written: Written) -> Self::Section;
}

/// What a sink wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) records: u64,
    /// Records the sink's filter left out.
    pub(crate) filtered: u64,
    /// Records the ring had no room for.
    pub(crate) lost: u64,
}

/// Parses the text of a capture's file: every record, in file order. A
/// last line without its newline is what a killed recorder left
/// mid-write: it is left out. A header of a version this deepspan does not
/// read is an error, as is any bad line; the error names the line and
/// says why.
pub(crate) fn parse_file<L: CaptureLine>(text: &str) -> Result<Vec<L>, String> {
    // "# deepspan NAME vN: COLUMNS".
    let (name, current) = L::HEADER
        .split_once(" v")
        .and_then(|(name, rest)| Some((name, rest.split_once(':')?.0.parse::<u32>().ok()?)))
        .expect("a capture's header is `# deepspan NAME vN: COLUMNS`");
    let any_version = format!("{name} v");
    let complete = &text[..text.rfind('\n').map_or(0, |n| n + 1)];
    let mut version = current;
    let mut records = Vec::new();
    for (n, line) in complete.lines().enumerate() {
        if let Some(rest) = line.strip_prefix(&any_version) {
            // Another version's columns would read as numbers of this one's.
            version = rest
                .split_once(':')
                .and_then(|(v, _)| v.parse::<u32>().ok())
                .filter(|v| *v == current || L::OLDER_VERSIONS.contains(v))
                .ok_or_else(|| {
                    format!(
                        "line {}: {line:?} is not this deepspan's format ({})",
                        n + 1,
                        L::HEADER
                    )
                })?;
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        records.push(L::from_line_of(version, line).map_err(|e| format!("line {}: {e}", n + 1))?);
    }
    Ok(records)
}

/// Reads a capture's file (see [`parse_file`]); errors name the file.
pub(crate) fn read_file<L: CaptureLine>(path: &Path) -> Result<Vec<L>, Error> {
    let bad = |reason: String| Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {reason}", L::WHAT),
        ),
    };
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        bad(format!(
            "not UTF-8 text at byte {}",
            e.utf8_error().valid_up_to()
        ))
    })?;
    parse_file(&text).map_err(bad)
}

/// A record the sink keeps (true) or leaves out.
pub(crate) type Filter<L> = Box<dyn FnMut(&L) -> bool + Send>;

/// A capture's file being written, with its counts.
pub(crate) struct FileSink<L> {
    out: BufWriter<File>,
    keep: Option<Filter<L>>,
    written: Written,
    /// The line being made: formatted into memory, then written at once
    /// (formatting straight into the file's buffer goes through an
    /// io::Write call per piece of the line).
    line: String,
}

impl<L: CaptureLine> FileSink<L> {
    /// Creates the file at `path` and writes its header.
    pub(crate) fn create(path: &Path) -> Result<FileSink<L>, String> {
        let file =
            File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        FileSink::from_file(file)
    }

    /// Writes the header into `file`, and the records after it.
    pub(crate) fn from_file(file: File) -> Result<FileSink<L>, String> {
        let mut out = BufWriter::with_capacity(1 << 16, file);
        writeln!(out, "{}", L::HEADER).map_err(write_error::<L>)?;
        Ok(FileSink {
            out,
            keep: None,
            written: Written::default(),
            line: String::with_capacity(128),
        })
    }

    /// Writes only the records `keep` keeps; counts the others.
    pub(crate) fn filtered(mut self, keep: Filter<L>) -> FileSink<L> {
        self.keep = Some(keep);
        self
    }

    pub(crate) fn push_line(&mut self, record: &L) -> Result<(), String> {
        if let Some(keep) = &mut self.keep {
            if !keep(record) {
                self.written.filtered += 1;
                return Ok(());
            }
        }
        self.line.clear();
        record.write_line(&mut self.line);
        self.line.push('\n');
        self.out
            .write_all(self.line.as_bytes())
            .map_err(write_error::<L>)?;
        self.written.records += 1;
        Ok(())
    }
}

impl<L: CaptureLine> RecordSink for FileSink<L> {
    type Summary = Written;

    fn push(&mut self, record: &[u8]) -> Result<(), String> {
        match L::from_record(record) {
            Some(line) => self.push_line(&line),
            None => Ok(()),
        }
    }

    fn finish(mut self, lost: u64) -> Result<Written, String> {
        self.out.flush().map_err(write_error::<L>)?;
        self.written.lost = lost;
        Ok(self.written)
    }
}

fn write_error<L: CaptureLine>(e: std::io::Error) -> String {
    format!("cannot write the {}: {e}", L::WHAT)
}

/// The running capture of a standard recording: its program's records
/// written to one file of the run.
pub(crate) struct FileCapture {
    capture: Capture<Written>,
    path: std::path::PathBuf,
}

impl FileCapture {
    /// Drains `ring` into `sink` (writing the file at `path`) on a thread
    /// named `name`.
    pub(crate) fn start<L: CaptureLine>(
        name: &str,
        ring: Ring,
        sink: FileSink<L>,
        path: &Path,
    ) -> Result<FileCapture, Error> {
        let capture = Capture::start(name, ring, sink)?;
        Ok(FileCapture {
            capture,
            path: path.to_path_buf(),
        })
    }

    /// Detaches the program (once the ring is drained) and returns what
    /// was written.
    pub(crate) fn stop(self) -> Result<Written, String> {
        self.capture
            .stop()
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

/// The running capture `C` of a standard recording, into its file.
pub(crate) struct RunCapture<C> {
    capture: FileCapture,
    kind: PhantomData<C>,
}

impl<C: Recorded> RunCapture<C> {
    /// Starts the capture into `run`'s file; None, with a warning saying
    /// why, when this kernel or build cannot.
    pub(crate) fn start(
        run: &Path,
        switch: &mut SwitchProgram,
        warnings: &mut Vec<String>,
    ) -> Option<RunCapture<C>> {
        let started = C::attach(switch).and_then(|ring| {
            let path = run.join(C::FILE);
            let sink = FileSink::<C>::create(&path)?;
            FileCapture::start(C::THREAD, ring, sink, &path).map_err(|e| e.to_string())
        });
        match started {
            Ok(capture) => Some(RunCapture {
                capture,
                kind: PhantomData,
            }),
            Err(e) => {
                warnings.push(format!("{} not recorded ({e}){}", C::WHAT, C::WITHOUT));
                None
            }
        }
    }

    /// Detaches the program (once the ring is drained) and returns the
    /// manifest's section; None, with a warning, when the file may miss
    /// records.
    pub(crate) fn stop(self, warnings: &mut Vec<String>) -> Option<C::Section> {
        match self.capture.stop() {
            Ok(written) => Some(C::section(written)),
            Err(e) => {
                warnings.push(format!("{} incomplete: {e}", C::WHAT));
                None
            }
        }
    }
}

/// A flight recorder's records of one capture: kept in memory, the oldest
/// dropped beyond [`Recorded::HISTORY`], and written with each window
/// ([`History::write_window`]).
pub(crate) struct History<L> {
    kept: Arc<Mutex<Kept<L>>>,
    capture: Capture<()>,
}

/// The history, and how far back it is complete.
struct Kept<L> {
    records: VecDeque<L>,
    max: usize,
    /// The latest time of a record dropped because the history was full:
    /// a window that starts before it misses some.
    dropped_until_ns: Option<u64>,
}

impl<L> Kept<L> {
    fn new(max: usize) -> Kept<L> {
        Kept {
            records: VecDeque::new(),
            max,
            dropped_until_ns: None,
        }
    }
}

impl<C: Recorded> History<C> {
    /// Keeps the capture's records; None, with a warning saying why, when
    /// this kernel or build cannot.
    pub(crate) fn start(
        switch: &mut SwitchProgram,
        warnings: &mut Vec<String>,
    ) -> Option<History<C>> {
        let kept = Arc::new(Mutex::new(Kept::new(C::HISTORY)));
        let sink = HistorySink(kept.clone());
        let started = C::attach(switch)
            .and_then(|ring| Capture::start(C::THREAD, ring, sink).map_err(|e| e.to_string()));
        match started {
            Ok(capture) => Some(History { kept, capture }),
            Err(e) => {
                warnings.push(format!("{} not recorded ({e}){}", C::WHAT, C::WITHOUT));
                None
            }
        }
    }

    /// Writes the records from `since_ns` to `end_ns` (at most now) into
    /// the capture's file in `run`, and forgets those before `since_ns`
    /// (the history of the trace no longer reaches them). The ring is
    /// drained first, so that the window holds its last moments. Returns
    /// the manifest's section, and adds to `warnings` when the window
    /// misses records (it reaches back before what the history still
    /// holds, or the drain failed); None, with a warning, when the file
    /// could not be written.
    pub(crate) fn write_window(
        &self,
        run: &Path,
        since_ns: u64,
        end_ns: u64,
        warnings: &mut Vec<String>,
    ) -> Option<C::Section> {
        let flushed = self.capture.flush();
        match write_window(&self.kept, &run.join(C::FILE), since_ns, end_ns) {
            Ok((written, incomplete)) => {
                warnings.extend(incomplete);
                if let Err(e) = flushed {
                    warnings.push(format!(
                        "{} may miss the window's last moments: {e}",
                        C::WHAT
                    ));
                }
                Some(C::section(written))
            }
            Err(e) => {
                warnings.push(format!("{} not written: {e}", C::WHAT));
                None
            }
        }
    }
}

/// [`History::write_window`] of the history `kept`, into `path`.
fn write_window<L: CaptureLine>(
    kept: &Mutex<Kept<L>>,
    path: &Path,
    since_ns: u64,
    end_ns: u64,
) -> Result<(Written, Option<String>), String> {
    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
    // The ring is one for all CPUs, in the order records were written:
    // time order, but for records of two CPUs a moment apart. One a
    // little early left behind a later one stays until a later window
    // forgets it; the filter below leaves it out of this one.
    while kept.records.front().is_some_and(|r| r.mono_ns() < since_ns) {
        kept.records.pop_front();
    }
    let mut sink = FileSink::<L>::create(path)?;
    for r in kept
        .records
        .iter()
        .filter(|r| (since_ns..=end_ns).contains(&r.mono_ns()))
    {
        sink.push_line(r)?;
    }
    let written = sink.finish(0)?;
    let incomplete = kept.dropped_until_ns.filter(|&t| t >= since_ns).map(|t| {
        format!(
            "{} incomplete: those until {t} ns were dropped from the flight recorder's history \
             ({} kept)",
            L::WHAT,
            kept.max
        )
    });
    Ok((written, incomplete))
}

/// Keeps records in the flight recorder's history.
struct HistorySink<L>(Arc<Mutex<Kept<L>>>);

impl<L: CaptureLine> RecordSink for HistorySink<L> {
    type Summary = ();

    fn push(&mut self, record: &[u8]) -> Result<(), String> {
        if let Some(record) = L::from_record(record) {
            let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if kept.records.len() >= kept.max {
                if let Some(dropped) = kept.records.pop_front() {
                    kept.dropped_until_ns =
                        Some(dropped.mono_ns().max(kept.dropped_until_ns.unwrap_or(0)));
                }
            }
            kept.records.push_back(record);
        }
        Ok(())
    }

    fn finish(self, _lost: u64) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_write_what_core_fmt_writes() {
        let mut line = String::new();
        let values = [
            0,
            1,
            9,
            10,
            15,
            16,
            255,
            0x1000,
            u32::MAX as u64,
            u64::MAX >> 4,
            u64::MAX,
        ];
        for v in values {
            line.clear();
            Fields::new(&mut line).num(v).hex(v).num(v as i64).text("-");
            assert_eq!(line, format!("{v} {v:#x} {} -", v as i64));
        }
        line.clear();
        Fields::new(&mut line).num(i32::MIN).num(u16::MAX);
        assert_eq!(line, format!("{} {}", i32::MIN, u16::MAX));
    }

    /// A record of one time and one number.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Tick(u64, u32);

    impl CaptureLine for Tick {
        const HEADER: &'static str = "# deepspan ticks v1: mono_ns n";
        fn write_line(&self, out: &mut String) {
            Fields::new(out).num(self.0).num(self.1);
        }
        const WHAT: &'static str = "ticks";
        fn from_record(b: &[u8]) -> Option<Tick> {
            Some(Tick(
                u64::from_ne_bytes(b.get(0..8)?.try_into().ok()?),
                u32::from_ne_bytes(b.get(8..12)?.try_into().ok()?),
            ))
        }
        fn from_line(line: &str) -> Result<Tick, String> {
            let (t, n) = line.split_once(' ').ok_or("one field")?;
            Ok(Tick(
                t.parse().map_err(|_| "time")?,
                n.parse().map_err(|_| "n")?,
            ))
        }
        fn mono_ns(&self) -> u64 {
            self.0
        }
    }

    fn record(t: u64, n: u32) -> [u8; 12] {
        let mut r = [0u8; 12];
        r[0..8].copy_from_slice(&t.to_ne_bytes());
        r[8..12].copy_from_slice(&n.to_ne_bytes());
        r
    }

    #[test]
    fn the_sink_writes_what_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ticks.tsv");
        let mut sink = FileSink::<Tick>::create(&path)
            .unwrap()
            .filtered(Box::new(|t: &Tick| t.1 != 9));
        sink.push(&record(5, 1)).unwrap();
        sink.push(&record(6, 9)).unwrap();
        // Shorter than a record: not one, skipped.
        sink.push(&[0u8; 4]).unwrap();
        let written = sink.finish(2).unwrap();
        assert_eq!(
            written,
            Written {
                records: 1,
                filtered: 1,
                lost: 2
            }
        );
        assert_eq!(read_file::<Tick>(&path).unwrap(), vec![Tick(5, 1)]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "# deepspan ticks v1: mono_ns n\n5 1\n");
        // A recorder killed mid-line: the torn line is left out.
        assert_eq!(
            parse_file::<Tick>(&format!("{text}7 ")).unwrap(),
            vec![Tick(5, 1)]
        );
        let e = parse_file::<Tick>(&format!("{text}\n7 x\n")).unwrap_err();
        assert_eq!(e, "line 4: n");
        let e = parse_file::<Tick>("# deepspan ticks v2: n\n1\n").unwrap_err();
        assert!(e.starts_with("line 1: ") && e.contains("v2"), "{e}");
        std::fs::write(&path, b"# h\n\xff\n").unwrap();
        let e = read_file::<Tick>(&path).unwrap_err().to_string();
        assert!(
            e.contains("ticks.tsv") && e.contains("ticks: not UTF-8 text at byte 4"),
            "{e}"
        );
    }

    #[test]
    fn a_window_holds_its_records_and_says_when_the_history_dropped_some() {
        let kept = Arc::new(Mutex::new(Kept::<Tick>::new(1000)));
        let mut sink = HistorySink(kept.clone());
        for t in [10, 20, 30, 40] {
            sink.push(&record(t, 0)).unwrap();
        }
        // The window [since, 30] of the history, as the records' times, and
        // the note on what it misses.
        let window = |since: u64| -> (Vec<u64>, Option<String>) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("ticks.tsv");
            let (w, note) = write_window(&kept, &path, since, 30).unwrap();
            let ticks = read_file::<Tick>(&path).unwrap();
            assert_eq!(w.records, ticks.len() as u64);
            (ticks.iter().map(|t| t.0).collect(), note)
        };
        assert_eq!(window(20), (vec![20, 30], None));
        // Those before the window were forgotten; those after stay.
        let left = |kept: &Mutex<Kept<Tick>>| -> Vec<u64> {
            kept.lock().unwrap().records.iter().map(|t| t.0).collect()
        };
        assert_eq!(left(&kept), vec![20, 30, 40]);
        // A full history drops its oldest, and a window reaching back to
        // them says so.
        for t in 0..1000 {
            sink.push(&record(100 + t, 0)).unwrap();
        }
        assert_eq!(kept.lock().unwrap().records.len(), 1000);
        assert_eq!(kept.lock().unwrap().dropped_until_ns, Some(40));
        let (ticks, note) = window(30);
        assert_eq!(ticks, Vec::<u64>::new());
        let note = note.unwrap();
        assert!(
            note.starts_with("ticks incomplete: those until 40 ns were dropped"),
            "{note}"
        );
        assert_eq!(window(41).1, None);
    }
}
