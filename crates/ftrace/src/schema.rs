//! The event formats of one trace, indexed for decoding.

use deepspan_model::Name;
use std::collections::HashMap;

use crate::format::EventFormat;
use crate::source::Endian;
use crate::typed::{IntAt, Typed};

/// The event formats of a trace, with what decoding needs precomputed:
/// an id index, and per event its typed decoding and `common_pid` position.
///
/// Shared (`Arc`) between a [`crate::TraceDat`] and everything decoding
/// its records.
#[derive(Debug)]
pub struct Schema {
    events: Vec<EventFormat>,
    infos: Vec<EventInfo>,
    /// Event id -> index into `events` (`NONE` when the id is unknown).
    by_id: Vec<u32>,
    by_name: HashMap<(String, String), usize>,
    /// Used for records whose id has no format.
    unknown: EventInfo,
    common_type: IntAt,
    endian: Endian,
    long_size: usize,
    /// Constant strings of the kernel by address (from `printk_formats`),
    /// which events such as `ipi:ipi_entry` point to.
    printk: HashMap<u64, Name>,
}

const NONE: u32 = u32::MAX;

/// The name given to records whose event id has no format.
pub const UNKNOWN_EVENT: &str = "unknown";

#[derive(Debug)]
pub(crate) struct EventInfo {
    pub(crate) typed: Typed,
    pub(crate) pid: IntAt,
    pub(crate) name: Name,
}

impl Schema {
    /// Builds a schema from event formats. The first format of an id wins.
    /// `long_size` is the traced kernel's `long` (4 or 8 bytes).
    pub fn new(formats: Vec<EventFormat>, big_endian: bool, long_size: u32) -> Schema {
        Schema::with_printk(
            formats,
            Endian { big: big_endian },
            long_size as usize,
            HashMap::new(),
        )
    }

    pub(crate) fn with_printk(
        formats: Vec<EventFormat>,
        endian: Endian,
        long_size: usize,
        printk: HashMap<u64, Name>,
    ) -> Schema {
        let mut events = Vec::with_capacity(formats.len());
        let mut by_id = Vec::new();
        let mut by_name = HashMap::new();
        for f in formats {
            let id = usize::from(f.id);
            if by_id.len() <= id {
                by_id.resize(id + 1, NONE);
            }
            if by_id[id] != NONE {
                continue;
            }
            by_id[id] = events.len() as u32;
            by_name
                .entry((f.system.clone(), f.name.clone()))
                .or_insert(events.len());
            events.push(f);
        }
        let pid_of = |f: &EventFormat| {
            f.field("common_pid")
                .filter(|p| {
                    p.array.is_none() && p.dynamic.is_none() && matches!(p.size, 1 | 2 | 4 | 8)
                })
                .map(|p| IntAt::new(p.offset as u32, p.size as u8, p.signed))
        };
        let infos: Vec<EventInfo> = events
            .iter()
            .map(|f| EventInfo {
                typed: Typed::build(f),
                pid: pid_of(f).unwrap_or_default(),
                name: f.shared.clone(),
            })
            .collect();
        // Records of unknown events still have the common header; read it
        // where the known events have it (the kernel's layout otherwise).
        let default_pid = events
            .iter()
            .find_map(pid_of)
            .unwrap_or(IntAt::new(4, 4, true));
        let common_type = events
            .iter()
            .find_map(|f| {
                f.field("common_type")
                    .filter(|t| t.array.is_none() && matches!(t.size, 1 | 2 | 4))
                    .map(|t| IntAt::new(t.offset as u32, t.size as u8, false))
            })
            .unwrap_or(IntAt::new(0, 2, false));
        Schema {
            events,
            infos,
            by_id,
            by_name,
            unknown: EventInfo {
                typed: Typed::Other,
                pid: default_pid,
                name: Name::new(UNKNOWN_EVENT),
            },
            common_type,
            endian,
            long_size,
            printk,
        }
    }

    /// The format of event `id`, if the trace has it.
    pub fn event(&self, id: u16) -> Option<&EventFormat> {
        self.index(id).map(|i| &self.events[i])
    }

    /// All event formats, in the order the trace stores them.
    pub fn events(&self) -> impl Iterator<Item = &EventFormat> {
        self.events.iter()
    }

    pub fn by_name(&self, system: &str, name: &str) -> Option<&EventFormat> {
        self.by_name
            .get(&(system.to_string(), name.to_string()))
            .map(|&i| &self.events[i])
    }

    /// Which [`deepspan_model::EventKind`] variant records of event `id`
    /// decode to in [`crate::Record::to_event`] (`"SchedSwitch"`, ...), or
    /// `None` when they stay `EventKind::Other`. Decided once per event
    /// format, from the field names it declares.
    pub fn typed_variant(&self, id: u16) -> Option<&'static str> {
        self.info(id).typed.variant()
    }

    /// Byte order of the records.
    pub fn big_endian(&self) -> bool {
        self.endian.big
    }

    /// Size of the traced kernel's `long`, in bytes.
    pub fn long_size(&self) -> u32 {
        self.long_size as u32
    }

    #[inline]
    fn index(&self, id: u16) -> Option<usize> {
        match self.by_id.get(usize::from(id)) {
            Some(&i) if i != NONE => Some(i as usize),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn info(&self, id: u16) -> &EventInfo {
        match self.index(id) {
            Some(i) => &self.infos[i],
            None => &self.unknown,
        }
    }

    #[inline]
    pub(crate) fn endian(&self) -> Endian {
        self.endian
    }

    pub(crate) fn common_type(&self) -> IntAt {
        self.common_type
    }

    /// Shared text for `bytes` (lossy UTF-8).
    /// The constant kernel string at `addr`, or the address in hex when the
    /// trace did not save it.
    pub(crate) fn printk_string(&self, addr: u64) -> Name {
        match self.printk.get(&addr) {
            Some(s) => s.clone(),
            None => Name::new(&format!("{addr:#x}")),
        }
    }
}

/// Parses `printk_formats` lines: `0xffffffff81234567 : "text"`.
pub(crate) fn parse_printk(text: &str) -> HashMap<u64, Name> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some((addr, rest)) = line.split_once(':') else {
            continue;
        };
        let addr = addr.trim();
        let addr = addr.strip_prefix("0x").unwrap_or(addr);
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        let rest = rest.trim();
        let inner = rest
            .strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .unwrap_or(rest);
        out.insert(addr, Name::new(&unescape(inner)));
    }
    out
}

/// Undoes the C escapes `printk_formats` shows (`\n`, `\t`, `\\`, `\"`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printk_strings() {
        let map = parse_printk(
            "0xffffffff81e0f7a0 : \"Rescheduling interrupts\"\n0x10 : \"tab\\there\\n\"\nnot a line\n",
        );
        assert_eq!(
            map.get(&0xffffffff81e0f7a0).map(|s| &**s),
            Some("Rescheduling interrupts")
        );
        assert_eq!(map.get(&0x10).map(|s| &**s), Some("tab\there\n"));
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn unknown_printk_addresses_read_as_hex() {
        let s = Schema::new(Vec::new(), false, 8);
        assert_eq!(&*s.printk_string(0x1234), "0x1234");
        assert!(s.event(0).is_none());
        assert_eq!(s.typed_variant(65535), None);
    }
}
