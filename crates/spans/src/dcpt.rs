//! In-band critical paths (DCPT, Lopez et al.): the `deepspan-dcpt-path`
//! reply header that `deepspan_otel.dcpt` (sdk/python) writes, decoded and
//! encoded.
//!
//! A caller that sends `deepspan-dcpt: 1` gets back, from every server with
//! the middleware, the tree of calls on its request's critical path, so the
//! outermost service learns where a request's time went with no collector.
//!
//! Format (version 2 is written; versions 1 and 2 are read), ASCII, at most
//! 4096 bytes as written:
//!
//! ```text
//! value   = version *( ";" hop ) [ ";+" dropped ]
//! hop     = [ up "^" ] [ call_us "@" ] service ":" operation ":" self_us ":" total_us [ ":" cause ":" cause_us ]
//! service, operation, cause = *( ALPHA / DIGIT / "-" / "." / "_" / "~" / "/" / pct-encoded )
//! up, call_us, self_us, total_us, cause_us, dropped = "0" / ( %x31-39 *DIGIT )   ; fits in 64 bits
//! ```
//!
//! Hops are in preorder: a hop, then the hops of the calls on its critical
//! path in the order they were made; the first hop (depth 0) is the
//! outermost service. A hop's depth is the previous hop's plus one minus its
//! `up` (0 when absent): no markers make a chain, `1^` a sibling of the hop
//! before, `2^` a sibling of that hop's parent. `call_us` is the call's
//! duration as its caller measured it (network and queues included), so
//! `call_us - total_us` is the wire time into the hop. A marker is a digit
//! run followed by `^` or `@`; other leading digits belong to the service
//! name (`5@9p:…` is a call of 5 µs to service `9p`).
//!
//! Strings are UTF-8, percent-encoded except for RFC 3986's unreserved
//! characters and `/` (so `^` and `@` in names are always escaped). Times are
//! microseconds; `self_us <= total_us`, and a hop's `self_us` is its total
//! minus its child hops' call times. `+N` says that N hops were dropped from
//! the end of the preorder to fit the bound; their time is still in their
//! callers' totals.
//!
//! Version 2 exists because version 1 carried a chain (`self ⊕
//! argmax(children)`): calls a hop made one after the other were folded into
//! its self time, so a caller could be named the slowest hop when its
//! sequential callees were. Version 1 values have no markers and decode as a
//! chain (depth = index) without call times. The module docstring of
//! `deepspan_otel.dcpt` has the full semantics; the test vectors
//! (`sdk/python/tests/dcpt_vectors.json`) are shared by both sides.

use serde::Serialize;

/// The version this module writes.
pub const VERSION: &str = "2";
/// The chain format without markers, still read.
const VERSION_1: &str = "1";
/// The bound the middleware keeps an encoded path within.
pub const MAX_HEADER_BYTES: usize = 4096;
/// Opt-in request header (value `1`).
pub const REQUEST_HEADER: &str = "deepspan-dcpt";
/// Reply header carrying the encoded path.
pub const REPLY_HEADER: &str = "deepspan-dcpt-path";

/// One call on the critical path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub service: String,
    pub operation: String,
    /// Nesting in the call tree: 0 for the outermost service, its caller's
    /// depth plus one otherwise.
    pub depth: usize,
    /// Time of the hop not spent waiting for the calls below it on the path.
    pub self_us: u64,
    /// From the request's arrival to the reply headers, in the hop's process.
    pub total_us: u64,
    /// The call's duration as the caller measured it (send to reply
    /// received), when the caller wrote it; never on the first hop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_us: Option<u64>,
    /// The hop's top kernel cause (e.g. `cpu-wait`) and its time, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<KernelCause>,
}

/// The dominant kernel reason for a hop's self time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelCause {
    pub name: String,
    pub time_us: u64,
}

/// Hops in preorder from the outermost service, and how many hops were
/// dropped from the end to keep the header within its bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CriticalPath {
    pub hops: Vec<Hop>,
    pub dropped: u64,
}

impl CriticalPath {
    /// The hop that made call `index`: the nearest earlier hop one level up.
    /// `None` for the first hop (and for depths that are not a preorder).
    pub fn parent(&self, index: usize) -> Option<usize> {
        let depth = self.hops.get(index)?.depth;
        let parent = self.hops[..index].iter().rposition(|h| h.depth < depth)?;
        (self.hops[parent].depth + 1 == depth).then_some(parent)
    }

    /// `parent(i)` for every hop, in one pass (`parent` alone scans back).
    pub fn parents(&self) -> Vec<Option<usize>> {
        // The hops whose subtrees are still open, outermost first.
        let mut open: Vec<usize> = Vec::new();
        let mut parents = Vec::with_capacity(self.hops.len());
        for (index, hop) in self.hops.iter().enumerate() {
            while open
                .last()
                .is_some_and(|&last| self.hops[last].depth >= hop.depth)
            {
                open.pop();
            }
            parents.push(
                open.last()
                    .copied()
                    .filter(|&parent| self.hops[parent].depth + 1 == hop.depth),
            );
            open.push(index);
        }
        parents
    }

    /// The wire time into hop `index` (network and queues between its
    /// caller and it): `call_us - total_us` when the caller wrote the call
    /// time; else, when the caller made no other call on the path (a version
    /// 1 chain), the caller's total minus its self time minus the hop's
    /// total. `None` for the first hop, when neither applies, or when the
    /// times do not add up (a callee reporting more than its caller waited,
    /// as with clock jumps). Scans the path; `wire_times` does all hops in
    /// linear time.
    pub fn wire_us(&self, index: usize) -> Option<u64> {
        let hop = self.hops.get(index)?;
        if index == 0 {
            return None;
        }
        if let Some(call_us) = hop.call_us {
            return call_us.checked_sub(hop.total_us);
        }
        let parent = self.parent(index)?;
        // Up to two of the parent's calls: one is enough to know it is the only one.
        let parent_calls = self.hops[parent + 1..]
            .iter()
            .take_while(|h| h.depth > self.hops[parent].depth)
            .filter(|h| h.depth == hop.depth)
            .take(2)
            .count();
        self.wire_of_only_child(parent, index, parent_calls)
    }

    /// `wire_us(i)` for every hop.
    pub fn wire_times(&self) -> Vec<Option<u64>> {
        let parents = self.parents();
        let mut calls = vec![0; self.hops.len()];
        for &parent in parents.iter().flatten() {
            calls[parent] += 1;
        }
        self.hops
            .iter()
            .enumerate()
            .map(|(index, hop)| match (index, hop.call_us, parents[index]) {
                (0, _, _) => None,
                (_, Some(call_us), _) => call_us.checked_sub(hop.total_us),
                (_, None, Some(parent)) => self.wire_of_only_child(parent, index, calls[parent]),
                (_, None, None) => None,
            })
            .collect()
    }

    /// The version 1 rule: the time `parent` waited for its only call,
    /// `child`, that `child` did not measure. `None` unless `parent_calls`
    /// (its child hops on the path) is 1: how a wait splits among several
    /// calls is unknown.
    fn wire_of_only_child(&self, parent: usize, child: usize, parent_calls: usize) -> Option<u64> {
        if parent_calls != 1 {
            return None;
        }
        let (parent, child) = (&self.hops[parent], &self.hops[child]);
        parent
            .total_us
            .checked_sub(parent.self_us)?
            .checked_sub(child.total_us)
    }
}

/// Why a header value is not a valid path, and at which byte of it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {REPLY_HEADER} value at byte {offset}: {reason}")]
pub struct DecodeError {
    pub offset: usize,
    pub reason: String,
}

fn error(offset: usize, reason: impl Into<String>) -> DecodeError {
    DecodeError {
        offset,
        reason: reason.into(),
    }
}

/// Parses a `deepspan-dcpt-path` value of version 1 or 2. Work is linear in
/// its length; any input that is not exactly the format gives an error with
/// its byte offset.
pub fn decode(value: &str) -> Result<CriticalPath, DecodeError> {
    if let Some(at) = value.bytes().position(|b| !b.is_ascii()) {
        return Err(error(at, "not ASCII"));
    }
    let mut elements = value.split(';');
    let version = elements.next().unwrap_or_default();
    let has_markers = match version {
        VERSION => true,
        VERSION_1 => false,
        _ => {
            let shown: String = version.chars().take(16).collect();
            return Err(error(
                0,
                format!(
                    "unknown version {shown:?} (this decoder reads {VERSION_1:?} and {VERSION:?})"
                ),
            ));
        }
    };
    let mut hops: Vec<Hop> = Vec::new();
    let mut dropped = 0;
    let mut offset = version.len() + 1;
    let mut elements = elements.peekable();
    while let Some(element) = elements.next() {
        if let Some(count) = element.strip_prefix('+') {
            if elements.peek().is_some() {
                return Err(error(
                    offset,
                    "truncation marker '+N' is not the last element",
                ));
            }
            dropped = number(count, offset + 1, "dropped hop count")?;
            if dropped == 0 {
                return Err(error(
                    offset + 1,
                    "truncation marker says 0 hops were dropped",
                ));
            }
        } else {
            let previous_depth = hops.last().map(|h| h.depth);
            let (markers, fields_start) = if has_markers {
                markers(element, offset, hops.len(), previous_depth)?
            } else {
                (Markers::default(), 0)
            };
            let depth = match previous_depth {
                None => 0,
                // `markers` checked that up <= previous depth.
                Some(previous) => previous + 1 - markers.up,
            };
            let fields = &element[fields_start..];
            hops.push(hop(
                fields,
                offset,
                offset + fields_start,
                hops.len(),
                depth,
                markers.call_us,
            )?);
        }
        offset += element.len() + 1;
    }
    if hops.is_empty() {
        return Err(error(value.len(), "no hops"));
    }
    Ok(CriticalPath { hops, dropped })
}

/// A version 2 hop's optional prefix: how many levels it goes up from just
/// below the previous hop, and the call time its caller measured.
#[derive(Default)]
struct Markers {
    up: usize,
    call_us: Option<u64>,
}

/// Reads the markers at the start of hop `index` (which starts at byte
/// `offset`) and checks them against the previous hop's depth; returns them
/// and where the hop's fields start in `element`. A digit run not followed
/// by its marker character is left to the service name.
fn markers(
    element: &str,
    offset: usize,
    index: usize,
    previous_depth: Option<usize>,
) -> Result<(Markers, usize), DecodeError> {
    let bytes = element.as_bytes();
    let digits_end = |from: usize| {
        from + bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut markers = Markers::default();
    let mut at = 0;
    let end = digits_end(at);
    if bytes.get(end) == Some(&b'^') {
        let up = number(&element[..end], offset, &format!("hop {index} levels up"))?;
        if up == 0 {
            return Err(error(
                offset,
                format!(
                    "hop {index} has '0^' (a call of the hop before it is written without '^')"
                ),
            ));
        }
        let Some(previous_depth) = previous_depth else {
            return Err(error(
                offset,
                "the first hop is the outermost service: it cannot go up a level",
            ));
        };
        if up > previous_depth as u64 {
            return Err(error(
                offset,
                format!(
                    "hop {index} has '{up}^', which puts it above the outermost service \
                     (the hop before it is at depth {previous_depth})"
                ),
            ));
        }
        // Fits: at most `previous_depth`.
        markers.up = up as usize;
        at = end + 1;
    }
    let end = digits_end(at);
    if bytes.get(end) == Some(&b'@') {
        let call_us = number(
            &element[at..end],
            offset + at,
            &format!("hop {index} call time"),
        )?;
        if previous_depth.is_none() {
            return Err(error(
                offset,
                "the first hop is the outermost service: it has no caller's call time",
            ));
        }
        markers.call_us = Some(call_us);
        at = end + 1;
    }
    Ok((markers, at))
}

/// Parses the `:`-separated fields of hop `index`, which start at byte
/// `fields_offset` of the value (its markers, if any, start at
/// `hop_offset`).
fn hop(
    element: &str,
    hop_offset: usize,
    fields_offset: usize,
    index: usize,
    depth: usize,
    call_us: Option<u64>,
) -> Result<Hop, DecodeError> {
    let fields: Vec<&str> = element.split(':').collect();
    if fields.len() != 4 && fields.len() != 6 {
        return Err(error(
            hop_offset,
            format!(
                "hop {index} has {} ':'-separated fields, expected 4 or 6",
                fields.len()
            ),
        ));
    }
    let mut starts = Vec::with_capacity(fields.len());
    let mut start = fields_offset;
    for field in &fields {
        starts.push(start);
        start += field.len() + 1;
    }
    let service = text(fields[0], starts[0], &format!("hop {index} service"))?;
    let operation = text(fields[1], starts[1], &format!("hop {index} operation"))?;
    let self_us = number(fields[2], starts[2], &format!("hop {index} self time"))?;
    let total_us = number(fields[3], starts[3], &format!("hop {index} total time"))?;
    if self_us > total_us {
        return Err(error(
            starts[2],
            format!("hop {index} self time {self_us} µs exceeds its total time {total_us} µs"),
        ));
    }
    let cause = if fields.len() == 6 {
        Some(KernelCause {
            name: text(fields[4], starts[4], &format!("hop {index} kernel cause"))?,
            time_us: number(
                fields[5],
                starts[5],
                &format!("hop {index} kernel cause time"),
            )?,
        })
    } else {
        None
    };
    Ok(Hop {
        service,
        operation,
        depth,
        self_us,
        total_us,
        call_us,
        cause,
    })
}

fn is_unescaped(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/')
}

fn text(field: &str, offset: usize, what: &str) -> Result<String, DecodeError> {
    let bytes = field.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte == b'%' {
            let hex = bytes.get(at + 1..at + 3).and_then(|pair| {
                let pair = std::str::from_utf8(pair).ok()?;
                if pair.bytes().all(|b| b.is_ascii_hexdigit()) {
                    u8::from_str_radix(pair, 16).ok()
                } else {
                    None
                }
            });
            let Some(value) = hex else {
                return Err(error(
                    offset + at,
                    format!("{what} has a '%' not followed by two hex digits"),
                ));
            };
            decoded.push(value);
            at += 3;
        } else if is_unescaped(byte) {
            decoded.push(byte);
            at += 1;
        } else {
            return Err(error(
                offset + at,
                format!(
                    "{what} has a character that must be percent-encoded: {:?}",
                    byte as char
                ),
            ));
        }
    }
    String::from_utf8(decoded).map_err(|e| {
        error(
            offset,
            format!("{what} is not UTF-8 once percent-decoded ({e})"),
        )
    })
}

fn number(field: &str, offset: usize, what: &str) -> Result<u64, DecodeError> {
    let canonical = field == "0"
        || (field.starts_with(|c: char| ('1'..='9').contains(&c))
            && field.bytes().all(|b| b.is_ascii_digit()));
    if !canonical {
        let shown: String = field.chars().take(24).collect();
        return Err(error(
            offset,
            format!("{what} is not a decimal number without leading zeros: {shown:?}"),
        ));
    }
    field
        .parse()
        .map_err(|_| error(offset, format!("{what} does not fit in 64 bits")))
}

fn escape(name: &str, out: &mut String) {
    for byte in name.bytes() {
        if is_unescaped(byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// Why a path cannot be written: its value would not decode to it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("a path needs at least one hop")]
    NoHops,
    #[error("hop 0 is the outermost service, so its depth is 0, not {depth}")]
    FirstHopNotOutermost { depth: usize },
    #[error("hop 0 is the outermost service, so it has no caller's call time")]
    FirstHopHasCallTime,
    #[error(
        "hop {index} has depth {depth} after a hop at depth {previous}: \
         the hops are not in preorder (only the first hop is at depth 0, and a hop is at most one level below the one before it)"
    )]
    NotPreorder {
        index: usize,
        depth: usize,
        previous: usize,
    },
    #[error("hop {index} self time {self_us} µs exceeds its total time {total_us} µs")]
    SelfOverTotal {
        index: usize,
        self_us: u64,
        total_us: u64,
    },
}

/// Checks what `decode` would reject in the value of `hops`: the depths
/// must be a preorder (0 first, then at most one more than the previous
/// hop's), only later hops have a call time, and self times fit in totals.
fn check_encodable(hops: &[Hop]) -> Result<(), EncodeError> {
    let first = hops.first().ok_or(EncodeError::NoHops)?;
    if first.depth != 0 {
        return Err(EncodeError::FirstHopNotOutermost { depth: first.depth });
    }
    if first.call_us.is_some() {
        return Err(EncodeError::FirstHopHasCallTime);
    }
    for (index, pair) in hops.windows(2).enumerate() {
        // Depth 0 again would be a second outermost hop.
        if pair[1].depth > pair[0].depth + 1 || pair[1].depth == 0 {
            return Err(EncodeError::NotPreorder {
                index: index + 1,
                depth: pair[1].depth,
                previous: pair[0].depth,
            });
        }
    }
    for (index, hop) in hops.iter().enumerate() {
        if hop.self_us > hop.total_us {
            return Err(EncodeError::SelfOverTotal {
                index,
                self_us: hop.self_us,
                total_us: hop.total_us,
            });
        }
    }
    Ok(())
}

/// Hop `hop` written after a hop at `previous_depth` (`None` for the first
/// hop, which has no markers). The depths are checked by `check_encodable`.
fn encode_hop(hop: &Hop, previous_depth: Option<usize>) -> String {
    let mut out = String::new();
    if let Some(previous) = previous_depth {
        let up = previous + 1 - hop.depth;
        if up > 0 {
            out.push_str(&format!("{up}^"));
        }
        if let Some(call_us) = hop.call_us {
            out.push_str(&format!("{call_us}@"));
        }
    }
    escape(&hop.service, &mut out);
    out.push(':');
    escape(&hop.operation, &mut out);
    out.push_str(&format!(":{}:{}", hop.self_us, hop.total_us));
    if let Some(cause) = &hop.cause {
        out.push(':');
        escape(&cause.name, &mut out);
        out.push_str(&format!(":{}", cause.time_us));
    }
    out
}

/// The version 2 header value of `path`, with hops dropped from the end of
/// the preorder (and counted in the `+N` marker) until it fits in `limit`
/// bytes; a prefix of a preorder is still a tree, and the first hop is
/// always kept. Names are not cut here (the Python writer cuts them to 200
/// bytes), so the first hop alone may exceed `limit`. Fails, rather than
/// write a value that would not decode to `path`, if the hops are not a
/// tree in preorder (see `EncodeError`).
pub fn encode(path: &CriticalPath, limit: usize) -> Result<String, EncodeError> {
    check_encodable(&path.hops)?;
    let parts: Vec<String> = path
        .hops
        .iter()
        .enumerate()
        .map(|(index, hop)| encode_hop(hop, index.checked_sub(1).map(|i| path.hops[i].depth)))
        .collect();
    let mut kept = parts.len();
    let mut size = VERSION.len() + parts.iter().map(|p| p.len() + 1).sum::<usize>();
    let marker = |missing: u64| {
        if missing == 0 {
            String::new()
        } else {
            format!(";+{missing}")
        }
    };
    let mut tail = marker(path.dropped);
    while kept > 1 && size + tail.len() > limit {
        kept -= 1;
        size -= parts[kept].len() + 1;
        tail = marker(path.dropped.saturating_add((parts.len() - kept) as u64));
    }
    let mut out = String::with_capacity(size + tail.len());
    out.push_str(VERSION);
    for part in &parts[..kept] {
        out.push(';');
        out.push_str(part);
    }
    out.push_str(&tail);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const VECTORS: &str = include_str!("../../../sdk/python/tests/dcpt_vectors.json");

    fn vectors() -> Value {
        serde_json::from_str(VECTORS).unwrap()
    }

    fn expected_hop(v: &Value) -> Hop {
        Hop {
            service: v["service"].as_str().unwrap().to_string(),
            operation: v["operation"].as_str().unwrap().to_string(),
            depth: v["depth"].as_u64().unwrap() as usize,
            self_us: v["self_us"].as_u64().unwrap(),
            total_us: v["total_us"].as_u64().unwrap(),
            call_us: v.get("call_us").map(|us| us.as_u64().unwrap()),
            cause: v.get("cause").map(|name| KernelCause {
                name: name.as_str().unwrap().to_string(),
                time_us: v["cause_us"].as_u64().unwrap(),
            }),
        }
    }

    #[test]
    fn shared_valid_vectors_decode_and_canonical_ones_encode_back() {
        let all = vectors();
        let valid = all["valid"].as_array().unwrap();
        assert!(valid.len() >= 5);
        for case in valid {
            let value = case["value"].as_str().unwrap();
            let path = decode(value).unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
            let hops: Vec<Hop> = case["hops"]
                .as_array()
                .unwrap()
                .iter()
                .map(expected_hop)
                .collect();
            assert_eq!(path.hops, hops, "{}", case["name"]);
            assert_eq!(path.dropped, case["dropped"].as_u64().unwrap());
            let encoded = encode(&path, MAX_HEADER_BYTES).unwrap();
            if case["canonical"].as_bool().unwrap() {
                assert_eq!(encoded, value, "{}", case["name"]);
            }
            // Canonical or not, what is written reads back as the same path.
            assert_eq!(decode(&encoded).unwrap(), path, "{}", case["name"]);
        }
    }

    #[test]
    fn shared_invalid_vectors_fail_at_their_offset() {
        let all = vectors();
        let invalid = all["invalid"].as_array().unwrap();
        assert!(invalid.len() >= 10);
        for case in invalid {
            let value = case["value"].as_str().unwrap();
            let err = decode(value).expect_err(case["name"].as_str().unwrap());
            assert_eq!(
                err.offset as u64,
                case["error_offset"].as_u64().unwrap(),
                "{}: {err}",
                case["name"]
            );
        }
    }

    fn hop(name: String, depth: usize, total_us: u64, call_us: Option<u64>) -> Hop {
        Hop {
            service: name,
            operation: "GET /step".to_string(),
            depth,
            self_us: 100.min(total_us),
            total_us,
            call_us,
            cause: None,
        }
    }

    /// n hops each calling the next, each call 5 µs longer than the callee.
    fn chain(n: usize) -> CriticalPath {
        let hops = (0..n)
            .map(|i| {
                let total_us = 100 * (n - i) as u64;
                hop(
                    format!("service-{i}"),
                    i,
                    total_us,
                    (i > 0).then_some(total_us + 5),
                )
            })
            .collect();
        CriticalPath { hops, dropped: 0 }
    }

    #[test]
    fn a_long_chain_is_cut_at_the_deep_end_within_the_bound() {
        let path = chain(1000);
        let value = encode(&path, MAX_HEADER_BYTES).unwrap();
        assert!(value.len() <= MAX_HEADER_BYTES);
        assert!(value.starts_with("2;service-0:"), "{value}");
        let back = decode(&value).unwrap();
        assert!(back.hops.len() > 50);
        assert_eq!(back.hops.len() as u64 + back.dropped, 1000);
        assert_eq!(back.hops[..], path.hops[..back.hops.len()]);
        // One more hop would not have fitted.
        let one_more = CriticalPath {
            hops: path.hops[..=back.hops.len()].to_vec(),
            dropped: back.dropped - 1,
        };
        let longer = encode(&one_more, usize::MAX).unwrap();
        assert!(longer.len() > MAX_HEADER_BYTES, "{}", longer.len());
    }

    #[test]
    fn a_path_already_cut_adds_its_count_to_the_marker() {
        let mut path = chain(3);
        path.dropped = 7;
        assert!(encode(&path, MAX_HEADER_BYTES).unwrap().ends_with(";+7"));
        let value = encode(&path, 40).unwrap();
        let back = decode(&value).unwrap();
        assert_eq!(back.hops.len(), 1);
        assert_eq!(back.dropped, 9);
    }

    /// A root calling `fanout` services one after the other, each of which
    /// calls two more in turn: depths 0, 1, 2, 2, 1, 2, 2, …
    fn tree(fanout: usize) -> CriticalPath {
        let mut hops = vec![hop("root".to_string(), 0, 1_000_000, None)];
        for i in 0..fanout {
            hops.push(hop(format!("mid-{i}"), 1, 900, Some(950)));
            for j in 0..2 {
                hops.push(hop(format!("leaf-{i}-{j}"), 2, 300, Some(320)));
            }
        }
        CriticalPath { hops, dropped: 0 }
    }

    #[test]
    fn a_tree_cut_to_fit_decodes_to_a_prefix_of_its_hops() {
        let path = tree(200);
        let whole = encode(&path, usize::MAX).unwrap();
        assert!(whole.contains(";950@mid-0:") && whole.contains(";2^950@mid-1:"));
        assert!(whole.contains(";1^320@leaf-1-1:"), "{whole}");
        assert_eq!(decode(&whole).unwrap(), path);
        for limit in [MAX_HEADER_BYTES, 200, 60, 0] {
            let value = encode(&path, limit).unwrap();
            // Only the first hop, which is always kept, may be over the limit.
            assert!(
                value.len() <= limit || !value.contains("@"),
                "{limit}: {value}"
            );
            let back = decode(&value).unwrap_or_else(|e| panic!("{limit}: {e}: {value}"));
            assert!(back.hops.len() < path.hops.len(), "{limit}");
            assert_eq!(back.hops[..], path.hops[..back.hops.len()], "{limit}");
            assert_eq!(
                back.hops.len() as u64 + back.dropped,
                path.hops.len() as u64
            );
            assert_eq!(encode(&back, usize::MAX).unwrap(), value, "{limit}");
        }
    }

    #[test]
    fn a_path_that_is_not_a_preorder_tree_is_not_written() {
        let mut path = chain(3);
        assert_eq!(
            encode(
                &CriticalPath {
                    hops: Vec::new(),
                    dropped: 0
                },
                100
            ),
            Err(EncodeError::NoHops)
        );
        path.hops[2].depth = 3;
        assert_eq!(
            encode(&path, MAX_HEADER_BYTES),
            Err(EncodeError::NotPreorder {
                index: 2,
                depth: 3,
                previous: 1
            })
        );
        let mut path = chain(3);
        path.hops[1].depth = 0;
        assert_eq!(
            encode(&path, MAX_HEADER_BYTES),
            Err(EncodeError::NotPreorder {
                index: 1,
                depth: 0,
                previous: 0
            })
        );
        let mut path = chain(3);
        path.hops[0].depth = 1;
        assert_eq!(
            encode(&path, MAX_HEADER_BYTES),
            Err(EncodeError::FirstHopNotOutermost { depth: 1 })
        );
        let mut path = chain(3);
        path.hops[0].call_us = Some(5);
        assert_eq!(
            encode(&path, MAX_HEADER_BYTES),
            Err(EncodeError::FirstHopHasCallTime)
        );
        let mut path = chain(3);
        path.hops[1].self_us = path.hops[1].total_us + 1;
        assert!(matches!(
            encode(&path, MAX_HEADER_BYTES),
            Err(EncodeError::SelfOverTotal { index: 1, .. })
        ));
        // Going up any number of levels is fine.
        let mut path = chain(4);
        path.hops[3].depth = 1;
        let value = encode(&path, MAX_HEADER_BYTES).unwrap();
        assert!(value.contains(";2^105@service-3:"), "{value}");
        assert_eq!(decode(&value).unwrap(), path);
    }

    #[test]
    fn garbage_and_every_prefix_of_a_valid_value_never_panic() {
        for value in [
            "2;front:GET%20/checkout:1203:48210;46900@cart:POST%20/items:46001:46790:cpu-wait:31000;\
             120@tax:GET:50:100;2^1500@9p:read:900:1400;+2",
            "1;front:GET%20/checkout:1203:48210;cart:POST%20/items:46001:46790:cpu-wait:31000;+2",
        ] {
            assert!(decode(value).is_ok(), "{value}");
            for end in 0..value.len() {
                // Prefixes cut inside a hop must fail; those cut at a boundary may decode.
                if let Err(e) = decode(&value[..end]) {
                    assert!(e.offset <= end, "{}: {e}", &value[..end]);
                }
            }
        }
        assert!(
            decode("2;front:GET%20/checkout:1203:48210;46900@cart:POST%20/items:46001:46790")
                .is_ok()
        );
        // Cut inside a number, the self time exceeds the total.
        assert!(
            decode("2;front:GET%20/checkout:1203:48210;46900@cart:POST%20/items:46001:4679")
                .is_err()
        );
        assert!(decode("2;front:GET%20/checkout:1203:48210;46900@cart:POST%20/it").is_err());
        assert!(decode("2;front:GET%20/checkout:1203:48210;46900@cart:POST%2").is_err());
        // Cut inside the markers, the digits are the service: too few fields.
        assert!(decode("2;front:GET%20/checkout:1203:48210;469").is_err());
        assert!(decode("2;front:GET%20/checkout:1203:48210;46900@cart:P:1:2;2^").is_err());
        // Deterministic pseudo-random garbage, biased towards the format's bytes.
        let alphabet = b"12;:+%^@0123456789aZ/ \xff";
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for round in 0..40_000 {
            let len = (state % 40) as usize;
            let mut bytes = Vec::with_capacity(len + 2);
            if round % 2 == 0 {
                // Half the inputs get a valid start, so hops and markers are reached.
                bytes.extend_from_slice(b"2;");
            }
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let text = String::from_utf8_lossy(&bytes);
            match decode(&text) {
                Ok(path) => assert_eq!(path.hops[0].depth, 0, "{text:?}"),
                Err(e) => assert!(e.offset <= text.len(), "{text:?}: {e}"),
            }
        }
    }

    #[test]
    fn wire_time_is_what_neither_process_measured() {
        // Version 2: the caller wrote each call's time, siblings included.
        let path = decode("2;a:x:10:100;30@b:y:5:25;1^60@c:z:20:50;10@d:w:9:9").unwrap();
        assert_eq!(path.parents(), [None, Some(0), Some(0), Some(2)]);
        assert_eq!(
            (0..4).map(|i| path.parent(i)).collect::<Vec<_>>(),
            path.parents()
        );
        let wire: Vec<_> = (0..5).map(|i| path.wire_us(i)).collect();
        assert_eq!(wire, [None, Some(5), Some(10), Some(1), None]);
        assert_eq!(path.wire_times(), wire[..4]);
        // Version 1: a chain, each hop its caller's only call.
        let path = decode("1;a:x:10:100;b:y:50:70;c:z:20:20").unwrap();
        let wire: Vec<_> = (0..3).map(|i| path.wire_us(i)).collect();
        assert_eq!(wire, [None, Some(20), Some(0)]);
        assert_eq!(path.wire_times(), wire);
        let inconsistent = decode("1;a:x:10:100;b:y:50:95").unwrap();
        assert_eq!(inconsistent.wire_us(1), None);
        // A callee reporting more than its caller waited.
        assert_eq!(decode("2;a:x:1:100;40@b:y:5:45").unwrap().wire_us(1), None);
        // Siblings without call times: how the caller's wait splits is unknown.
        let siblings = decode("2;a:x:10:100;b:y:5:25;1^c:z:20:50").unwrap();
        assert_eq!(siblings.wire_us(1), None);
        assert_eq!(siblings.wire_times(), [None, None, None]);
        // An only child without a call time, after a sibling subtree closed.
        let mixed = decode("2;a:x:10:100;30@b:y:5:25;c:w:1:2;2^60@d:z:20:50").unwrap();
        assert_eq!(mixed.wire_us(2), Some(18));
        assert_eq!(mixed.wire_times(), [None, Some(5), Some(18), Some(10)]);
    }

    #[test]
    fn errors_say_where_and_why() {
        let err = decode("2;a:b:1:2;c:d%G0:1:2").unwrap_err();
        assert_eq!(err.offset, 13);
        assert_eq!(
            err.to_string(),
            "invalid deepspan-dcpt-path value at byte 13: hop 1 operation has a '%' not followed by two hex digits"
        );
        let err = decode("2;a:b:1:2;5@c:d:1:2;2^e:f:1:1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid deepspan-dcpt-path value at byte 20: hop 2 has '2^', which puts it above the outermost service (the hop before it is at depth 1)"
        );
        let err = decode("3;a:b:1:2").unwrap_err();
        assert!(err.reason.contains(r#"reads "1" and "2""#), "{err}");
    }
}
