//! The `metadata` stream: plain text or packetized (CTF 7.1), parsed with
//! [`crate::tsdl`] and compiled into per-stream and per-event layouts.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use deepspan_model::Name;

use crate::error::{Error, Result};
use crate::fast::{ClassSteps, HeaderFast};
use crate::layout::{self, compile_scope, ClassFast, Env, Node, Scope};
use crate::tsdl::{self, EnvIr, OrderSpec, ParseError, TypeIr};

const METADATA_MAGIC: u32 = 0x75D1_1D57;
const METADATA_HEADER_LEN: usize = 37;
/// Far above any real metadata; keeps a hostile file from exhausting memory.
const MAX_METADATA_LEN: u64 = 256 << 20;

/// An `env` entry value.
#[derive(Clone, Debug, PartialEq)]
pub enum EnvValue {
    Int(i64),
    Str(String),
}

impl std::fmt::Display for EnvValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvValue::Int(i) => write!(f, "{i}"),
            EnvValue::Str(s) => f.write_str(s),
        }
    }
}

/// A clock of the trace (`clock { ... }` block).
#[derive(Clone, Debug, PartialEq)]
pub struct Clock {
    pub name: String,
    pub uuid: Option<String>,
    pub description: Option<String>,
    /// Ticks per second.
    pub freq: u64,
    /// Offset of the clock's zero from the Unix epoch: `offset_s` seconds
    /// plus `offset` ticks.
    pub offset_s: i64,
    pub offset: i64,
    /// Uncertainty, in ticks.
    pub precision: u64,
    pub absolute: bool,
}

impl Clock {
    fn implicit() -> Clock {
        Clock {
            name: "default".into(),
            uuid: None,
            description: None,
            freq: 1_000_000_000,
            offset_s: 0,
            offset: 0,
            precision: 0,
            absolute: false,
        }
    }

    /// Nanoseconds from the Unix epoch to the clock's zero.
    pub fn offset_ns(&self) -> i128 {
        self.offset_s as i128 * 1_000_000_000
            + self.offset as i128 * 1_000_000_000 / self.freq as i128
    }

    /// A raw clock value in nanoseconds since the clock's zero.
    #[inline]
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        if self.freq == 1_000_000_000 {
            ticks
        } else {
            let ns = ticks as u128 * 1_000_000_000 / self.freq as u128;
            ns.min(u64::MAX as u128) as u64
        }
    }
}

/// Declares the payload fields the typed mapping reads ([`P`]), each by
/// its names in order of preference.
macro_rules! params {
    ($($id:ident = [$($n:literal),+];)*) => {
        /// A payload field the typed mapping reads.
        #[derive(Clone, Copy, Debug)]
        #[repr(u8)]
        pub(crate) enum P { $($id),* }
        /// Names of each [`P`], in order of preference.
        pub(crate) const PARAM_NAMES: &[&[&str]] = &[$(&[$($n),+]),*];
    };
}

params! {
    Tid = ["tid", "pid"];
    Comm = ["comm"];
    Prio = ["prio"];
    TargetCpu = ["target_cpu"];
    Dev = ["dev"];
    Sector = ["sector"];
    NrSector = ["nr_sector"];
    Rwbs = ["rwbs"];
    Error = ["error", "errors"];
    Skbaddr = ["skbaddr"];
    Len = ["len"];
    NameDev = ["name", "dev"];
    PrevComm = ["prev_comm"];
    PrevTid = ["prev_tid", "prev_pid"];
    PrevPrio = ["prev_prio"];
    PrevState = ["prev_state"];
    NextComm = ["next_comm"];
    NextTid = ["next_tid", "next_pid"];
    NextPrio = ["next_prio"];
    ParentTid = ["parent_tid", "parent_pid"];
    ParentComm = ["parent_comm"];
    ChildTid = ["child_tid", "child_pid"];
    ChildComm = ["child_comm"];
    OldTid = ["old_tid", "old_pid"];
    Filename = ["filename"];
    OrigCpu = ["orig_cpu"];
    DestCpu = ["dest_cpu"];
    Irq = ["irq"];
    Name = ["name"];
    Ret = ["ret"];
    Vec = ["vec"];
    Hrtimer = ["hrtimer"];
    Function = ["function"];
    Now = ["now"];
    Id = ["id"];
}

/// No such field.
pub(crate) const NO_PARAM: u16 = u16::MAX;

/// Typed events the reader maps; decided once per event class from its name.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Known {
    SchedSwitch,
    SchedWaking,
    SchedWakeup,
    SchedWakeupNew,
    SchedProcessFork,
    SchedProcessExec,
    SchedProcessExit,
    SchedProcessFree,
    SchedMigrateTask,
    IrqHandlerEntry,
    IrqHandlerExit,
    SoftirqRaise,
    SoftirqEntry,
    SoftirqExit,
    HrtimerExpireEntry,
    HrtimerExpireExit,
    BlockRqInsert,
    BlockRqIssue,
    BlockRqComplete,
    NetDevQueue,
    NetifReceiveSkb,
    /// `syscall_entry_NAME` (LTTng ≥ 2.6) or `sys_NAME` (older).
    SysEnter(Name),
    /// `syscall_exit_NAME`.
    SysExit(Name),
    /// Pre-2.6 LTTng `exit_syscall`: the name is not known.
    SysExitUnnamed,
    /// Pre-2.6 LTTng `sys_unknown { id, args[6] }`.
    SysUnknown,
    SpanStart,
    SpanEnd,
    Other,
}

fn known(name: &str, kernel: bool) -> Known {
    if name == "jaeger_ust:start_span" {
        return Known::SpanStart;
    }
    if name == "jaeger_ust:end_span" {
        return Known::SpanEnd;
    }
    if !kernel {
        return Known::Other;
    }
    // perf-to-CTF names carry the subsystem: `sched:sched_switch`.
    let bare = name.rsplit_once(':').map_or(name, |(_, n)| n);
    match bare {
        "sched_switch" => Known::SchedSwitch,
        "sched_waking" => Known::SchedWaking,
        "sched_wakeup" => Known::SchedWakeup,
        "sched_wakeup_new" => Known::SchedWakeupNew,
        "sched_process_fork" => Known::SchedProcessFork,
        "sched_process_exec" => Known::SchedProcessExec,
        "sched_process_exit" => Known::SchedProcessExit,
        "sched_process_free" => Known::SchedProcessFree,
        "sched_migrate_task" => Known::SchedMigrateTask,
        "irq_handler_entry" => Known::IrqHandlerEntry,
        "irq_handler_exit" => Known::IrqHandlerExit,
        "softirq_raise" => Known::SoftirqRaise,
        "softirq_entry" => Known::SoftirqEntry,
        "softirq_exit" => Known::SoftirqExit,
        "hrtimer_expire_entry" => Known::HrtimerExpireEntry,
        "hrtimer_expire_exit" => Known::HrtimerExpireExit,
        "block_rq_insert" => Known::BlockRqInsert,
        "block_rq_issue" => Known::BlockRqIssue,
        "block_rq_complete" => Known::BlockRqComplete,
        "net_dev_queue" => Known::NetDevQueue,
        "netif_receive_skb" | "netif_receive_skb_internal" => Known::NetifReceiveSkb,
        "exit_syscall" => Known::SysExitUnnamed,
        "sys_unknown" | "compat_sys_unknown" => Known::SysUnknown,
        _ => {
            for prefix in ["syscall_entry_", "compat_syscall_entry_"] {
                if let Some(n) = bare.strip_prefix(prefix) {
                    return Known::SysEnter(Name::new(n));
                }
            }
            for prefix in ["syscall_exit_", "compat_syscall_exit_"] {
                if let Some(n) = bare.strip_prefix(prefix) {
                    return Known::SysExit(Name::new(n));
                }
            }
            // LTTng < 2.6 named syscall entries `sys_NAME`; perf's
            // `raw_syscalls:sys_enter` is not one of them.
            if name == bare {
                for prefix in ["sys_", "compat_sys_"] {
                    if let Some(n) = bare.strip_prefix(prefix) {
                        return Known::SysEnter(Name::new(n));
                    }
                }
            }
            Known::Other
        }
    }
}

pub(crate) struct EventClass {
    pub id: u64,
    /// Position among all event classes of the trace (every stream class),
    /// from 0: a dense key for per-class tables.
    pub seq: u32,
    pub name: Name,
    pub loglevel: Option<i64>,
    pub context: Option<Scope>,
    pub payload: Option<Scope>,
    pub known: Known,
    /// Payload slots the reader needs while iterating.
    pub perf_cpu: Option<u32>,
    pub perf_tid: Option<u32>,
    /// Stream event context, event context and payload as one program,
    /// when their shapes allow it.
    pub fast: Option<ClassSteps>,
    /// Top-level payload field index of each [`P`] ([`NO_PARAM`]: none).
    pub params: Box<[u16]>,
    /// Payload field indices of prev_tid and next_tid (sched_switch; see
    /// `CtfEvent::switch`).
    pub switch_fields: Option<(usize, usize)>,
}

pub(crate) struct StreamClass {
    pub id: u64,
    pub packet_context: Option<Scope>,
    pub event_header: Option<Scope>,
    pub event_context: Option<Scope>,
    /// The event classes, in declaration order ([`StreamClass::event`]
    /// gives an index in it).
    pub classes: Vec<Arc<EventClass>>,
    /// Indices in `classes` by id, plus one (0: no such id): dense table
    /// for small ids, map otherwise.
    dense: Vec<u32>,
    sparse: HashMap<u64, u32>,
    /// The only event class, for streams whose header has no id.
    pub single: Option<u32>,
    /// The classes by id for small ids (the fast path's lookup).
    by_id: Vec<Option<Arc<EventClass>>>,
    /// The event header the fast way.
    pub header_fast: HeaderFast,
    /// Most slots any event class uses in its context and its payload.
    pub class_slots: (u32, u32),
    /// Index in [`TraceMeta::clocks`] of the clock event timestamps use.
    pub clock: usize,
    /// Stream event context slots of thread identity fields.
    pub ctx_tid: Option<u32>,
    pub ctx_vtid: Option<u32>,
}

impl StreamClass {
    /// The index in [`StreamClass::classes`] of event class `id`.
    #[inline]
    pub fn event(&self, id: u64) -> Option<u32> {
        match self.dense.get(id as usize) {
            Some(0) => None,
            Some(i) => Some(i - 1),
            None => self.sparse.get(&id).copied(),
        }
    }

    /// Event class `id` (the fast path: small ids, or with no id the
    /// only class).
    #[inline(always)]
    pub fn class_of(&self, id: Option<u64>) -> Option<&EventClass> {
        match id {
            Some(id) => match self.by_id.get(id as usize) {
                Some(c) => c.as_deref(),
                None => Some(&*self.classes[self.event(id)? as usize]),
            },
            None => Some(&*self.classes[self.single? as usize]),
        }
    }

    pub fn events(&self) -> impl Iterator<Item = &Arc<EventClass>> {
        self.classes.iter()
    }

    pub fn event_count(&self) -> usize {
        self.classes.len()
    }
}

/// A compiled trace description.
pub(crate) struct TraceMeta {
    pub uuid: Option<[u8; 16]>,
    pub packet_header: Option<Scope>,
    pub env: Vec<(String, EnvValue)>,
    pub clocks: Vec<Clock>,
    pub streams: Vec<Arc<StreamClass>>,
    /// Kernel-domain trace (LTTng kernel, perf): kernel event names map to
    /// typed events.
    pub kernel: bool,
    /// The largest alignment (bits) of any field of any scope.
    pub max_align: u32,
    /// The raw TSDL text (for diagnostics and tools).
    pub text: String,
}

impl TraceMeta {
    pub fn stream(&self, id: u64) -> Option<&Arc<StreamClass>> {
        self.streams.iter().find(|s| s.id == id)
    }

    pub fn env(&self, key: &str) -> Option<&EnvValue> {
        self.env.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// Maps byte offsets of the concatenated metadata text back to file offsets.
struct TextMap {
    /// (text offset, file offset) at the start of each metadata packet.
    segments: Vec<(usize, u64)>,
}

impl TextMap {
    fn file_offset(&self, text_offset: usize) -> u64 {
        let i = self.segments.partition_point(|(t, _)| *t <= text_offset);
        match i.checked_sub(1).and_then(|i| self.segments.get(i)) {
            Some((t, f)) => f + (text_offset - t) as u64,
            None => text_offset as u64,
        }
    }
}

/// Reads and compiles the metadata file at `path`.
pub(crate) fn read_metadata(path: &Path) -> Result<TraceMeta> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    if len > MAX_METADATA_LEN {
        return Err(Error::metadata(
            path,
            0,
            format!("metadata of {len} bytes is larger than {MAX_METADATA_LEN}"),
        ));
    }
    let raw = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse_metadata(path, &raw)
}

/// Parses metadata bytes; `path` only names them in errors.
pub(crate) fn parse_metadata(path: &Path, raw: &[u8]) -> Result<TraceMeta> {
    let (text, map) = metadata_text(path, raw)?;
    let at = |e: ParseError| Error::metadata(path, map.file_offset(e.offset), describe(&text, e));
    let ir = tsdl::parse(&text).map_err(at)?;
    // Kept as is when valid UTF-8 (always, from LTTng): no copy.
    let text = String::from_utf8(text)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    match compile(ir) {
        Ok(mut meta) => {
            meta.text = text;
            Ok(meta)
        }
        Err(e) => {
            let off = map.file_offset(e.offset);
            Err(Error::metadata(path, off, describe(text.as_bytes(), e)))
        }
    }
}

fn describe(text: &[u8], e: ParseError) -> String {
    let upto = &text[..e.offset.min(text.len())];
    let line = upto.iter().filter(|&&b| b == b'\n').count() + 1;
    format!("{} (metadata text line {line})", e.message)
}

/// The TSDL text: the file itself, or the concatenated payloads of its
/// packets. Each packet's header tells its own byte order (magic test).
fn metadata_text(path: &Path, raw: &[u8]) -> Result<(Vec<u8>, TextMap)> {
    let magic_at = |off: usize| -> Option<bool> {
        let b: [u8; 4] = raw.get(off..off + 4)?.try_into().ok()?;
        if u32::from_be_bytes(b) == METADATA_MAGIC {
            Some(true)
        } else if u32::from_le_bytes(b) == METADATA_MAGIC {
            Some(false)
        } else {
            None
        }
    };
    if magic_at(0).is_none() {
        return Ok((
            raw.to_vec(),
            TextMap {
                segments: vec![(0, 0)],
            },
        ));
    }
    let mut text = Vec::with_capacity(raw.len());
    let mut segments = Vec::new();
    let mut off = 0usize;
    while off < raw.len() {
        let Some(be) = magic_at(off) else {
            return Err(Error::metadata(
                path,
                off as u64,
                "metadata packet without magic 0x75D11D57",
            ));
        };
        if raw.len() - off < METADATA_HEADER_LEN {
            return Err(Error::metadata(
                path,
                off as u64,
                "truncated metadata packet header",
            ));
        }
        let u32_at = |o: usize| {
            let b: [u8; 4] = raw[off + o..off + o + 4].try_into().unwrap_or([0; 4]);
            if be {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        let content_bits = u32_at(24) as usize;
        let packet_bits = u32_at(28) as usize;
        let (compression, encryption, checksum) = (raw[off + 32], raw[off + 33], raw[off + 34]);
        if compression != 0 || encryption != 0 || checksum != 0 {
            return Err(Error::metadata(
                path,
                off as u64,
                format!("metadata packet uses compression/encryption/checksum schemes {compression}/{encryption}/{checksum}, which are not supported"),
            ));
        }
        if packet_bits % 8 != 0 || content_bits % 8 != 0 {
            return Err(Error::metadata(
                path,
                off as u64 + 24,
                "metadata packet sizes are not whole bytes",
            ));
        }
        let (content, packet) = (content_bits / 8, packet_bits / 8);
        if content < METADATA_HEADER_LEN || content > packet {
            return Err(Error::metadata(
                path,
                off as u64 + 24,
                format!("metadata packet content size {content} bytes is outside [{METADATA_HEADER_LEN}, packet size {packet}]"),
            ));
        }
        if packet > raw.len() - off {
            return Err(Error::metadata(
                path,
                off as u64 + 28,
                format!(
                    "metadata packet of {packet} bytes but only {} bytes remain",
                    raw.len() - off
                ),
            ));
        }
        segments.push((text.len(), (off + METADATA_HEADER_LEN) as u64));
        text.extend_from_slice(&raw[off + METADATA_HEADER_LEN..off + content]);
        off += packet;
    }
    Ok((text, TextMap { segments }))
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// Where the typed mapping finds each [`P`]: the top-level payload field
/// with the first of its names (in order of preference) that any field
/// has. Without a fixed layout, fields are found by flattened path, which
/// no struct has (its members have `a.b` paths). One look-up per field:
/// a kernel trace declares hundreds of classes.
fn param_indices(payload: Option<&Scope>) -> Box<[u16]> {
    /// The params each field name stands for, with its rank among their
    /// names.
    fn params_named(name: &str) -> &'static [(usize, usize)] {
        static BY_NAME: OnceLock<HashMap<&'static str, Vec<(usize, usize)>>> = OnceLock::new();
        let by_name = BY_NAME.get_or_init(|| {
            let mut m: HashMap<&'static str, Vec<(usize, usize)>> = HashMap::new();
            for (param, names) in PARAM_NAMES.iter().enumerate() {
                for (rank, name) in names.iter().enumerate() {
                    m.entry(name).or_default().push((param, rank));
                }
            }
            m
        });
        by_name.get(name).map_or(&[], Vec::as_slice)
    }
    let mut out = vec![NO_PARAM; PARAM_NAMES.len()];
    let Some(p) = payload else {
        return out.into();
    };
    let fixed = p.offsets.is_some();
    let mut best = vec![usize::MAX; PARAM_NAMES.len()];
    for (i, f) in p.fields().iter().enumerate() {
        if !fixed && matches!(f.node, Node::Struct(_)) {
            continue;
        }
        for &(param, rank) in params_named(&f.name) {
            if rank < best[param] {
                best[param] = rank;
                out[param] = u16::try_from(i)
                    .ok()
                    .filter(|i| *i != NO_PARAM)
                    .unwrap_or(NO_PARAM);
            }
        }
    }
    out.into()
}

fn small(v: i128, what: &str, at: usize) -> Result<u64, ParseError> {
    u64::try_from(v).map_err(|_| ParseError::new(at, format!("{what} {v} is out of range")))
}

/// The first clock any integer of `ty` maps to.
fn first_clock(ty: &TypeIr) -> Option<&str> {
    match ty {
        TypeIr::Int(i) => i.clock.as_deref(),
        TypeIr::Enum { container, .. } => container.clock.as_deref(),
        TypeIr::Struct { fields, .. } => fields.iter().find_map(|(_, t)| first_clock(t)),
        TypeIr::Variant { options, .. } => options.iter().find_map(|(_, t)| first_clock(t)),
        TypeIr::Array { elem, .. } | TypeIr::Sequence { elem, .. } => first_clock(elem),
        _ => None,
    }
}

fn make_env<'a>(
    native_be: bool,
    uppers: [Option<&'a Scope>; layout::SCOPES],
    clock_known: &'a dyn Fn(&str) -> bool,
    budget: &'a Cell<usize>,
    cross: &'a RefCell<Vec<(u8, u32)>>,
) -> Env<'a> {
    Env {
        native_be,
        uppers,
        clock_known,
        budget,
        cross,
    }
}

/// Compiles the IR; the returned metadata's `text` is left empty for the
/// caller to fill.
fn compile(ir: tsdl::MetadataIr) -> Result<TraceMeta, ParseError> {
    let trace = ir
        .trace
        .ok_or_else(|| ParseError::new(0, "no `trace` block"))?;
    let big_endian = match trace.byte_order {
        Some(OrderSpec::Be) => true,
        Some(OrderSpec::Le) => false,
        _ => {
            return Err(ParseError::new(
                trace.offset,
                "`trace` block without byte_order",
            ))
        }
    };
    let uuid = match &trace.uuid {
        Some(s) => Some(
            parse_uuid(s)
                .ok_or_else(|| ParseError::new(trace.offset, format!("bad trace uuid {s:?}")))?,
        ),
        None => None,
    };

    let mut clocks = Vec::new();
    for c in &ir.clocks {
        let freq = match c.freq {
            None => 1_000_000_000,
            Some(f) if f > 0 && f <= u64::MAX as i128 => f as u64,
            Some(f) => {
                return Err(ParseError::new(
                    c.at,
                    format!("clock frequency {f} is not positive"),
                ))
            }
        };
        let offset_s = i64::try_from(c.offset_s)
            .map_err(|_| ParseError::new(c.at, "clock offset_s out of range"))?;
        let offset = i64::try_from(c.offset)
            .map_err(|_| ParseError::new(c.at, "clock offset out of range"))?;
        clocks.push(Clock {
            name: c.name.clone(),
            uuid: c.uuid.clone(),
            description: c.description.clone(),
            freq,
            offset_s,
            offset,
            precision: u64::try_from(c.precision).unwrap_or(0),
            absolute: c.absolute,
        });
    }
    let clock_names: Vec<String> = clocks.iter().map(|c| c.name.clone()).collect();
    let clock_known = |n: &str| clock_names.iter().any(|c| c == n);
    let budget = Cell::new(layout::MAX_NODES);

    let mut uppers: [Option<&Scope>; layout::SCOPES] = [None; layout::SCOPES];
    let clock_known: &dyn Fn(&str) -> bool = &clock_known;
    let packet_header = match &trace.packet_header {
        Some(t) => Some(compile_scope(
            t,
            layout::PACKET_HEADER,
            &make_env(
                big_endian,
                uppers,
                clock_known,
                &budget,
                &RefCell::default(),
            ),
            &[],
            trace.offset,
        )?),
        None => None,
    };
    uppers[layout::PACKET_HEADER as usize] = packet_header.as_ref();

    let env_values: Vec<(String, EnvValue)> = ir
        .env
        .iter()
        .map(|(k, v)| {
            let v = match v {
                EnvIr::Int(i) => match i64::try_from(*i) {
                    Ok(i) => EnvValue::Int(i),
                    Err(_) => EnvValue::Str(i.to_string()),
                },
                EnvIr::Str(s) => EnvValue::Str(s.clone()),
            };
            (k.clone(), v)
        })
        .collect();
    let env_str = |k: &str| {
        env_values
            .iter()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| match v {
                EnvValue::Str(s) => Some(s.as_str()),
                _ => None,
            })
    };
    let kernel = env_str("domain") == Some("kernel")
        || matches!(env_str("tracer_name"), Some("perf" | "lttng-modules"));

    // Stream ids: absent only when there is a single stream.
    let single_stream = ir.streams.len() <= 1;
    let mut stream_ids: Vec<u64> = Vec::new();
    for s in &ir.streams {
        let id = match s.id {
            Some(id) => small(id, "stream id", s.offset)?,
            None if single_stream => 0,
            None => {
                return Err(ParseError::new(
                    s.offset,
                    "stream without id in a trace with several streams",
                ))
            }
        };
        if stream_ids.contains(&id) {
            return Err(ParseError::new(
                s.offset,
                format!("second stream with id {id}"),
            ));
        }
        stream_ids.push(id);
    }
    // A trace without stream block still has one implicit stream (id 0).
    let implicit_stream = tsdl::StreamIr::default();
    let stream_irs: Vec<(&tsdl::StreamIr, u64)> = if ir.streams.is_empty() {
        vec![(&implicit_stream, 0)]
    } else {
        ir.streams.iter().zip(stream_ids.iter().copied()).collect()
    };

    // Events grouped by stream.
    let mut by_stream: HashMap<u64, Vec<&tsdl::EventIr>> = HashMap::new();
    for e in &ir.events {
        let sid = match e.stream_id {
            Some(s) => small(s, "stream_id", e.offset)?,
            None if stream_irs.len() == 1 => stream_irs[0].1,
            None => {
                return Err(ParseError::new(
                    e.offset,
                    "event without stream_id in a trace with several streams",
                ))
            }
        };
        if !stream_irs.iter().any(|(_, id)| *id == sid) {
            return Err(ParseError::new(
                e.offset,
                format!("event refers to undeclared stream {sid}"),
            ));
        }
        by_stream.entry(sid).or_default().push(e);
    }

    let mut implicit_clock = false;
    let mut class_seq = 0u32;
    let mut streams = Vec::new();
    for (s, sid) in stream_irs {
        let cross = RefCell::new(Vec::new());
        let compile_opt = |t: &Option<Rc<TypeIr>>,
                           scope: u8,
                           up: [Option<&Scope>; layout::SCOPES],
                           read: &[&str]| {
            match t {
                Some(t) => compile_scope(
                    t,
                    scope,
                    &make_env(big_endian, up, clock_known, &budget, &cross),
                    read,
                    s.offset,
                )
                .map(Some),
                None => Ok(None),
            }
        };
        let mut up = uppers;
        let packet_context = compile_opt(
            &s.packet_context,
            layout::PACKET_CONTEXT,
            up,
            &[
                "content_size",
                "packet_size",
                "timestamp_begin",
                "timestamp_end",
                "events_discarded",
                "cpu_id",
            ],
        )?;
        up[layout::PACKET_CONTEXT as usize] = packet_context.as_ref();
        let event_header = compile_opt(&s.event_header, layout::EVENT_HEADER, up, &[])?;
        up[layout::EVENT_HEADER as usize] = event_header.as_ref();
        let event_context = compile_opt(
            &s.event_context,
            layout::STREAM_EVENT_CONTEXT,
            up,
            &["tid", "vtid"],
        )?;
        up[layout::STREAM_EVENT_CONTEXT as usize] = event_context.as_ref();

        let clock_name = [&s.packet_context, &s.event_header]
            .iter()
            .find_map(|t| t.as_deref().and_then(first_clock));
        let clock = match clock_name {
            Some(n) => clock_names.iter().position(|c| c == n).unwrap_or(0),
            None if !clocks.is_empty() => 0,
            None => {
                implicit_clock = true;
                0
            }
        };

        let events_ir = by_stream.remove(&sid).unwrap_or_default();
        let mut classes: Vec<EventClass> = Vec::new();
        let mut dense: Vec<u32> = Vec::new();
        let mut sparse = HashMap::new();
        let single_event = events_ir.len() == 1;
        let mut only = None;
        for e in events_ir {
            let id = match e.id {
                Some(id) => small(id, "event id", e.offset)?,
                None if single_event => 0,
                None => {
                    return Err(ParseError::new(
                        e.offset,
                        "event without id in a stream with several events",
                    ))
                }
            };
            let name = Name::new(e.name.as_deref().unwrap_or_default());
            let mut up = up;
            let context = e
                .context
                .as_ref()
                .map(|t| {
                    let env = make_env(big_endian, up, clock_known, &budget, &cross);
                    compile_scope(t, layout::EVENT_CONTEXT, &env, &[], e.offset)
                })
                .transpose()?;
            up[layout::EVENT_CONTEXT as usize] = context.as_ref();
            let known = known(&name, kernel);
            let read: Vec<&str> = vec!["perf_cpu", "perf_tid"];
            let payload = e
                .fields
                .as_ref()
                .map(|t| {
                    let env = make_env(big_endian, up, clock_known, &budget, &cross);
                    compile_scope(t, layout::PAYLOAD, &env, &read, e.offset)
                })
                .transpose()?;
            let slot = |names: &[&str]| {
                payload
                    .as_ref()
                    .and_then(|p| names.iter().find_map(|n| p.int_slot(n).map(|(s, _)| s)))
            };
            let field_index = |names: &[&str]| {
                let p = payload.as_ref()?;
                names.iter().find_map(|n| {
                    let (slot, _) = p.int_slot(n)?;
                    p.fields().iter().position(
                        |f| matches!(&f.node, Node::Int(i) | Node::Enum(i, _) if i.slot == slot),
                    )
                })
            };
            let switch_fields =
                field_index(&["prev_tid", "prev_pid"]).zip(field_index(&["next_tid", "next_pid"]));
            let params = param_indices(payload.as_ref());
            let class = EventClass {
                id,
                seq: class_seq,
                params,
                fast: None,
                switch_fields,
                loglevel: e.loglevel.and_then(|l| i64::try_from(l).ok()),
                perf_cpu: slot(&["perf_cpu"]),
                perf_tid: slot(&["perf_tid"]),
                name,
                context,
                payload,
                known,
            };
            let index = classes.len() as u32;
            if single_event {
                only = Some(index);
            }
            classes.push(class);
            class_seq += 1;
            let duplicate = if id < 1 << 16 {
                let i = id as usize;
                if dense.len() <= i {
                    dense.resize(i + 1, 0);
                }
                std::mem::replace(&mut dense[i], index + 1) != 0
            } else {
                sparse.insert(id, index).is_some()
            };
            if duplicate {
                return Err(ParseError::new(
                    e.offset,
                    format!("second event with id {id} in stream {sid}"),
                ));
            }
        }
        // Fixed runs store only what someone reads, now that every
        // reference into the stream's scopes is known.
        let cross = cross.into_inner();
        let mut event_header = event_header;
        let mut event_context = event_context;
        for (scope, id) in [
            (&mut event_header, layout::EVENT_HEADER),
            (&mut event_context, layout::STREAM_EVENT_CONTEXT),
        ] {
            if let Some(sc) = scope {
                sc.prune_stores(id, &cross);
            }
        }
        let classes: Vec<Arc<EventClass>> = classes
            .into_iter()
            .map(|mut c| {
                for (scope, id) in [
                    (&mut c.context, layout::EVENT_CONTEXT),
                    (&mut c.payload, layout::PAYLOAD),
                ] {
                    if let Some(sc) = scope {
                        sc.prune_stores(id, &cross);
                    }
                }
                c.fast = ClassFast::new(
                    event_context.as_ref(),
                    c.context.as_ref(),
                    c.payload.as_ref(),
                )
                .as_ref()
                .map(ClassSteps::of);
                Arc::new(c)
            })
            .collect();
        let ctx_slot = |n: &str| {
            event_context
                .as_ref()
                .and_then(|c| c.int_slot(n).map(|(s, _)| s))
        };
        let slots = |s: &Option<Scope>| s.as_ref().map_or(0, |s| s.slots);
        let class_slots = classes.iter().fold((0, 0), |(c, p), e| {
            (c.max(slots(&e.context)), p.max(slots(&e.payload)))
        });
        let header_fast = match &event_header {
            Some(h) => {
                let tag_elsewhere = match &h.plan {
                    layout::Plan::Tagged(t) => cross.contains(&(layout::EVENT_HEADER, t.tag_slot)),
                    _ => false,
                };
                HeaderFast::of(&h.plan, tag_elsewhere)
            }
            None => HeaderFast::Nothing,
        };
        let by_id = dense
            .iter()
            .map(|&i| i.checked_sub(1).map(|i| classes[i as usize].clone()))
            .collect();
        streams.push(Arc::new(StreamClass {
            id: sid,
            by_id,
            header_fast,
            class_slots,
            ctx_tid: ctx_slot("tid"),
            ctx_vtid: ctx_slot("vtid"),
            packet_context,
            event_header,
            event_context,
            classes,
            dense,
            sparse,
            single: only,
            clock,
        }));
    }
    if implicit_clock {
        clocks.push(Clock::implicit());
    }
    let align = |s: &Option<Scope>| s.as_ref().map_or(1, Scope::max_align);
    let max_align = streams
        .iter()
        .flat_map(|s| {
            [&s.packet_context, &s.event_header, &s.event_context]
                .into_iter()
                .map(align)
                .chain(
                    s.classes
                        .iter()
                        .flat_map(|c| [align(&c.context), align(&c.payload)]),
                )
                .collect::<Vec<_>>()
        })
        .fold(align(&packet_header), u32::max);
    Ok(TraceMeta {
        max_align,
        uuid,
        packet_header,
        env: env_values,
        clocks,
        streams,
        kernel,
        text: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn packetized_metadata_maps_errors_to_file_offsets() {
        let body = b"trace { byte_order = le; }; oops";
        let mut raw = Vec::new();
        raw.extend_from_slice(&METADATA_MAGIC.to_le_bytes());
        raw.extend_from_slice(&[0; 16]);
        raw.extend_from_slice(&0u32.to_le_bytes());
        let content = ((METADATA_HEADER_LEN + body.len()) * 8) as u32;
        raw.extend_from_slice(&content.to_le_bytes());
        raw.extend_from_slice(&(content + 64).to_le_bytes());
        raw.extend_from_slice(&[0, 0, 0, 1, 8]);
        raw.extend_from_slice(body);
        raw.extend_from_slice(&[0; 8]);
        let e = parse_metadata(Path::new("m"), &raw).err().unwrap();
        let ErrorKind::Metadata {
            offset, message, ..
        } = e.kind()
        else {
            panic!("{e}")
        };
        assert_eq!(*offset as usize, METADATA_HEADER_LEN + 28, "{message}");
        assert!(message.contains("unknown type `oops`"), "{message}");
    }

    #[test]
    fn lying_metadata_packet_sizes_are_errors() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&METADATA_MAGIC.to_be_bytes());
        raw.extend_from_slice(&[0; 20]);
        raw.extend_from_slice(&(1000u32 * 8).to_be_bytes());
        raw.extend_from_slice(&(2000u32 * 8).to_be_bytes());
        raw.extend_from_slice(&[0; 5]);
        let e = parse_metadata(Path::new("m"), &raw).err().unwrap();
        assert!(e.to_string().contains("remain"), "{e}");
    }

    #[test]
    fn classifies_kernel_event_names() {
        assert_eq!(known("sched:sched_switch", true), Known::SchedSwitch);
        assert_eq!(
            known("syscall_entry_futex", true),
            Known::SysEnter(Name::new("futex"))
        );
        assert_eq!(
            known("syscall_exit_read", true),
            Known::SysExit(Name::new("read"))
        );
        assert_eq!(known("sys_read", true), Known::SysEnter(Name::new("read")));
        assert_eq!(known("raw_syscalls:sys_enter", true), Known::Other);
        assert_eq!(known("sched_switch", false), Known::Other);
        assert_eq!(known("jaeger_ust:end_span", false), Known::SpanEnd);
    }
}
