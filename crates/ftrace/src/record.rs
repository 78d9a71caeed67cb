//! One ring-buffer record and its decodings: typed ([`Record::to_event`])
//! and generic ([`Record::fields`]).

use bytes::Bytes;
use deepspan_model::{Event, EventKind, Fields, Value};

use crate::error::Error;
use crate::format::{ArrayLen, FieldFormat};
use crate::schema::{Schema, UNKNOWN_EVENT};
use crate::source::Endian;
use crate::typed::dynamic_range;

/// One event record as stored in the ring buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Nanoseconds, as `trace-cmd report -t` shows them.
    pub ts: u64,
    pub cpu: u32,
    /// The event id (`common_type`); see [`Schema::event`].
    pub event_id: u16,
    /// The whole record, `common_*` fields included, laid out as the
    /// event's format file says. A slice of the reader's buffer, not a copy.
    pub payload: Bytes,
}

impl Record {
    /// The thread the event was recorded for (`common_pid`).
    #[inline]
    pub fn tid(&self, schema: &Schema) -> i32 {
        schema
            .info(self.event_id)
            .pid
            .i64(&self.payload, schema.endian()) as i32
    }

    /// The event name (`sched_switch`), or `"unknown"` for an id the trace
    /// has no format for.
    pub fn name<'s>(&self, schema: &'s Schema) -> &'s str {
        schema
            .event(self.event_id)
            .map_or(UNKNOWN_EVENT, |f| f.name.as_str())
    }

    /// The typed event. Events without a typed variant (see
    /// [`Schema::typed_variant`]) become [`EventKind::Other`] carrying the
    /// schema's shared name. Never fails: fields beyond a short record read
    /// as zero or empty.
    #[inline]
    pub fn to_event(&self, schema: &Schema) -> Event {
        decode_event(schema, self.ts, self.cpu, self.event_id, &self.payload)
    }

    /// Every field except the `common_*` ones, decoded by the format file:
    /// integers as `Int`/`UInt` by their signedness, char arrays as `Str`
    /// (up to the first NUL), other arrays as `Array` (byte arrays as
    /// `Bytes`).
    pub fn fields(&self, schema: &Schema) -> Result<Fields, Error> {
        let Some(format) = schema.event(self.event_id) else {
            return Err(Error::UnknownEvent {
                ts: self.ts,
                cpu: self.cpu,
                id: self.event_id,
            });
        };
        format
            .payload_fields()
            .map(|f| {
                field_value(f, &self.payload, schema.endian())
                    .map(|v| (f.shared_name().clone(), v))
                    .map_err(|what| self.field_error(&format.name, &f.name, what))
            })
            .collect()
    }

    /// One field by name (`common_*` fields included); `None` when the
    /// event has no such field or the record does not hold it.
    pub fn field(&self, schema: &Schema, name: &str) -> Option<Value> {
        let f = schema.event(self.event_id)?.field(name)?;
        field_value(f, &self.payload, schema.endian()).ok()
    }

    fn field_error(&self, event: &str, field: &str, what: String) -> Error {
        Error::Field {
            ts: self.ts,
            cpu: self.cpu,
            event: event.to_string(),
            field: field.to_string(),
            what,
        }
    }
}

/// A record lent by [`crate::CpuRecords::next_ref`]: a [`Record`] whose
/// payload borrows the reader's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// Nanoseconds, as `trace-cmd report -t` shows them.
    pub ts: u64,
    pub cpu: u32,
    /// The event id (`common_type`); see [`Schema::event`].
    pub event_id: u16,
    /// The whole record, laid out as the event's format file says.
    pub payload: &'a [u8],
}

impl RecordRef<'_> {
    /// The typed event; see [`Record::to_event`].
    #[inline]
    pub fn to_event(&self, schema: &Schema) -> Event {
        decode_event(schema, self.ts, self.cpu, self.event_id, self.payload)
    }
}

/// The typed event of a record's parts (see [`Record::to_event`]).
#[inline]
fn decode_event(schema: &Schema, ts: u64, cpu: u32, event_id: u16, p: &[u8]) -> Event {
    let info = schema.info(event_id);
    let kind = info
        .typed
        .decode(p, schema)
        .unwrap_or_else(|| EventKind::Other {
            name: info.name.clone(),
        });
    Event {
        ts,
        cpu,
        tid: info.pid.i64(p, schema.endian()) as i32,
        kind,
    }
}

/// Decodes one field of a record.
pub(crate) fn field_value(f: &FieldFormat, p: &[u8], e: Endian) -> Result<Value, String> {
    let in_place = |len: usize| -> Result<&[u8], String> {
        f.offset
            .checked_add(len)
            .and_then(|end| p.get(f.offset..end))
            .ok_or_else(|| {
                format!(
                    "bytes {}..{} are outside the {}-byte record",
                    f.offset,
                    f.offset.saturating_add(len),
                    p.len()
                )
            })
    };
    let bytes = if let Some(kind) = f.dynamic {
        in_place(4)?;
        let range = dynamic_range(p, f.offset, kind, e).ok_or_else(|| {
            let word = e.uint(p, f.offset, 4).unwrap_or(0);
            format!(
                "{kind:?} {word:#x} (offset {}, length {}) points outside the {}-byte record",
                word & 0xffff,
                word >> 16,
                p.len()
            )
        })?;
        &p[range]
    } else {
        match f.array {
            None => {
                let raw = in_place(f.size)?;
                return Ok(
                    match (f.signed, e.int(raw, 0, f.size), e.uint(raw, 0, f.size)) {
                        (true, Some(v), _) => Value::Int(v),
                        (false, _, Some(v)) => Value::UInt(v),
                        _ => Value::Bytes(raw.to_vec()),
                    },
                );
            }
            Some(ArrayLen::Fixed(_)) => in_place(f.size)?,
            Some(ArrayLen::Flexible) => p.get(f.offset..).unwrap_or(&[]),
        }
    };
    Ok(array_value(f, bytes, e))
}

/// The value of an array field's bytes.
fn array_value(f: &FieldFormat, bytes: &[u8], e: Endian) -> Value {
    if f.is_string() {
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        return Value::Str(String::from_utf8_lossy(&bytes[..len]).into_owned());
    }
    let size = f.elem_size;
    if !matches!(size, 2 | 4 | 8) {
        return Value::Bytes(bytes.to_vec());
    }
    Value::Array(
        bytes
            .chunks_exact(size)
            .map(|c| {
                if f.signed {
                    Value::Int(e.int(c, 0, size).unwrap_or(0))
                } else {
                    Value::UInt(e.uint(c, 0, size).unwrap_or(0))
                }
            })
            .collect(),
    )
}
