//! In-band critical paths (DCPT, seed 002): the `deepspan-dcpt-path` reply
//! header that `deepspan_otel.dcpt` (sdk/python) writes, decoded and encoded.
//!
//! A caller that sends `deepspan-dcpt: 1` gets back, from every server with
//! the middleware, its own hop followed by the path of its slowest child
//! call (`self ⊕ argmax(children)`), so the outermost service learns where a
//! request's time went with no collector.
//!
//! Format (version 1), ASCII, at most 4096 bytes as written:
//!
//! ```text
//! value   = "1" *( ";" hop ) [ ";+" dropped ]
//! hop     = service ":" operation ":" self_us ":" total_us [ ":" cause ":" cause_us ]
//! service, operation, cause = *( ALPHA / DIGIT / "-" / "." / "_" / "~" / "/" / pct-encoded )
//! self_us, total_us, cause_us, dropped = "0" / ( %x31-39 *DIGIT )   ; fits in 64 bits
//! ```
//!
//! Strings are UTF-8, percent-encoded except for RFC 3986's unreserved
//! characters and `/`. Times are microseconds; `self_us <= total_us`.
//! `+N` says that N hops were dropped at the deep end to fit the bound; the
//! last kept hop's `total_us - self_us` still holds their time. A hop's
//! `total_us - self_us - next.total_us` is the time spent between the two
//! processes (network, queues). The module docstring of
//! `deepspan_otel.dcpt` has the full semantics; the test vectors
//! (`sdk/python/tests/dcpt_vectors.json`) are shared by both sides.

use serde::Serialize;

/// The version this module reads and writes.
pub const VERSION: &str = "1";
/// The bound the middleware keeps an encoded path within.
pub const MAX_HEADER_BYTES: usize = 4096;
/// Opt-in request header (value `1`).
pub const REQUEST_HEADER: &str = "deepspan-dcpt";
/// Reply header carrying the encoded path.
pub const REPLY_HEADER: &str = "deepspan-dcpt-path";

/// One service on the critical path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub service: String,
    pub operation: String,
    /// Time of the hop not spent waiting for its critical child.
    pub self_us: u64,
    /// From the request's arrival to the reply headers, in the hop's process.
    pub total_us: u64,
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

/// Hops from the outermost service inwards, and how many hops were dropped
/// at the deep end to keep the header within its bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CriticalPath {
    pub hops: Vec<Hop>,
    pub dropped: u64,
}

impl CriticalPath {
    /// The time between hop `index`'s process and the next hop's (network
    /// and queues): its total minus its self time minus the next hop's
    /// total. `None` for the last hop or if the times do not add up (a child
    /// reporting more than its caller waited, as with clock jumps).
    pub fn wire_us(&self, index: usize) -> Option<u64> {
        let hop = self.hops.get(index)?;
        let next = self.hops.get(index + 1)?;
        hop.total_us
            .checked_sub(hop.self_us)?
            .checked_sub(next.total_us)
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

/// Parses a `deepspan-dcpt-path` value. Work is linear in its length; any
/// input that is not exactly the format gives an error with its byte offset.
pub fn decode(value: &str) -> Result<CriticalPath, DecodeError> {
    if let Some(at) = value.bytes().position(|b| !b.is_ascii()) {
        return Err(error(at, "not ASCII"));
    }
    let mut elements = value.split(';');
    let version = elements.next().unwrap_or_default();
    if version != VERSION {
        let shown: String = version.chars().take(16).collect();
        return Err(error(
            0,
            format!("unknown version {shown:?} (this decoder reads {VERSION:?})"),
        ));
    }
    let mut hops = Vec::new();
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
            hops.push(hop(element, offset, hops.len())?);
        }
        offset += element.len() + 1;
    }
    if hops.is_empty() {
        return Err(error(value.len(), "no hops"));
    }
    Ok(CriticalPath { hops, dropped })
}

fn hop(element: &str, offset: usize, index: usize) -> Result<Hop, DecodeError> {
    let fields: Vec<&str> = element.split(':').collect();
    if fields.len() != 4 && fields.len() != 6 {
        return Err(error(
            offset,
            format!(
                "hop {index} has {} ':'-separated fields, expected 4 or 6",
                fields.len()
            ),
        ));
    }
    let mut starts = Vec::with_capacity(fields.len());
    let mut start = offset;
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
        self_us,
        total_us,
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

fn encode_hop(hop: &Hop) -> String {
    let mut out = String::new();
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

/// The header value of `path`, with hops dropped at the deep end (and
/// counted in the `+N` marker) until it fits in `limit` bytes; the first hop
/// is always kept. Names are not cut here (the Python writer cuts them to
/// 200 bytes), so the first hop alone may exceed `limit`.
pub fn encode(path: &CriticalPath, limit: usize) -> String {
    let parts: Vec<String> = path.hops.iter().map(encode_hop).collect();
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
        tail = marker(path.dropped + (parts.len() - kept) as u64);
    }
    let mut out = String::with_capacity(size + tail.len());
    out.push_str(VERSION);
    for part in &parts[..kept] {
        out.push(';');
        out.push_str(part);
    }
    out.push_str(&tail);
    out
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
            self_us: v["self_us"].as_u64().unwrap(),
            total_us: v["total_us"].as_u64().unwrap(),
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
            if case["canonical"].as_bool().unwrap() {
                assert_eq!(encode(&path, MAX_HEADER_BYTES), value, "{}", case["name"]);
            }
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

    fn chain(n: usize) -> CriticalPath {
        let hops = (0..n)
            .map(|i| Hop {
                service: format!("service-{i}"),
                operation: "GET /step".to_string(),
                self_us: 100,
                total_us: 100 * (n - i) as u64,
                cause: None,
            })
            .collect();
        CriticalPath { hops, dropped: 0 }
    }

    #[test]
    fn a_long_chain_is_cut_at_the_deep_end_within_the_bound() {
        let path = chain(1000);
        let value = encode(&path, MAX_HEADER_BYTES);
        assert!(value.len() <= MAX_HEADER_BYTES);
        let back = decode(&value).unwrap();
        assert!(back.hops.len() > 50);
        assert_eq!(back.hops.len() as u64 + back.dropped, 1000);
        assert_eq!(back.hops[..], path.hops[..back.hops.len()]);
        // One more hop would not have fitted.
        let one_more = CriticalPath {
            hops: path.hops[..=back.hops.len()].to_vec(),
            dropped: back.dropped - 1,
        };
        let longer = encode(&one_more, usize::MAX);
        assert!(longer.len() > MAX_HEADER_BYTES, "{}", longer.len());
    }

    #[test]
    fn a_path_already_cut_adds_its_count_to_the_marker() {
        let mut path = chain(3);
        path.dropped = 7;
        assert!(encode(&path, MAX_HEADER_BYTES).ends_with(";+7"));
        let value = encode(&path, 40);
        let back = decode(&value).unwrap();
        assert_eq!(back.hops.len(), 1);
        assert_eq!(back.dropped, 9);
    }

    #[test]
    fn garbage_and_every_prefix_of_a_valid_value_never_panic() {
        let value =
            "1;front:GET%20/checkout:1203:48210;cart:POST%20/items:46001:46790:cpu-wait:31000;+2";
        for end in 0..value.len() {
            // Prefixes cut inside a hop must fail; those cut at a boundary may decode.
            let _ = decode(&value[..end]);
        }
        assert!(
            decode("1;front:GET%20/checkout:1203:48210;cart:POST%20/items:46001:46790").is_ok()
        );
        // Cut inside a number, the self time exceeds the total.
        assert!(
            decode("1;front:GET%20/checkout:1203:48210;cart:POST%20/items:46001:4679").is_err()
        );
        assert!(decode("1;front:GET%20/checkout:1203:48210;cart:POST%20/it").is_err());
        assert!(decode("1;front:GET%20/checkout:1203:48210;cart:POST%2").is_err());
        // Deterministic pseudo-random garbage, biased towards the format's bytes.
        let alphabet = b"1;:+%0123456789aZ/ \xff";
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let len = (state % 40) as usize;
            let mut bytes = Vec::with_capacity(len);
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let text = String::from_utf8_lossy(&bytes);
            if let Err(e) = decode(&text) {
                assert!(e.offset <= text.len(), "{text:?}: {e}");
            }
        }
    }

    #[test]
    fn wire_time_is_what_neither_process_measured() {
        let path = decode("1;a:x:10:100;b:y:50:70;c:z:20:20").unwrap();
        assert_eq!(path.wire_us(0), Some(20));
        assert_eq!(path.wire_us(1), Some(0));
        assert_eq!(path.wire_us(2), None);
        let inconsistent = decode("1;a:x:10:100;b:y:50:95").unwrap();
        assert_eq!(inconsistent.wire_us(0), None);
    }

    #[test]
    fn errors_say_where_and_why() {
        let err = decode("1;a:b:1:2;c:d%G0:1:2").unwrap_err();
        assert_eq!(err.offset, 13);
        assert_eq!(
            err.to_string(),
            "invalid deepspan-dcpt-path value at byte 13: hop 1 operation has a '%' not followed by two hex digits"
        );
    }
}
