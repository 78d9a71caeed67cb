//! LTTng / CTF 1.8 trace reader for deepspan.
//!
//! Reads a folder holding one or more CTF traces (an LTTng session: kernel
//! and user-space domains, per-uid or per-pid buffers, rotated tracefiles)
//! and yields all their events as one stream ordered by absolute time, the
//! way `babeltrace2` prints them. Everything is decoded here: a TSDL parser
//! (text and packetized metadata), integers of any size, alignment and byte
//! order, enumerations, floats, strings, structs, variants, arrays and
//! sequences, LTTng's compact and large event headers with timestamp
//! wrap-around, and lost-event counts.
//!
//! - [`CtfTrace::open`] reads metadata and stream layouts;
//!   [`CtfTrace::events`] streams [`CtfEvent`]s (memory stays at a few
//!   windows of a few MiB per stream whatever the trace size; files are
//!   mapped read-only, as babeltrace2 does, so they must not be truncated
//!   while being read); [`CtfTrace::stream_events`] gives each stream on
//!   its own, and [`CtfTrace::stream_parts`] cuts the large ones into runs
//!   of packets, for threads that decode in parallel and merge by time.
//! - [`CtfEvent::to_event`] maps kernel events to the typed
//!   [`deepspan_model::Event`]; [`CtfEvent::fields`] gives every field;
//!   [`CtfEvent::span_sync`] decodes `jaeger_ust` span start/end events.
//!
//! # Time bases
//!
//! LTTng records CLOCK_MONOTONIC ticks and, per trace, the offset of that
//! clock from the Unix epoch measured when tracing started.
//! [`CtfEvent::ts`] — and `Event::ts` from [`CtfEvent::to_event`] — is the
//! *absolute* time, ticks + offset, in ns:
//! - within a trace the offset is constant, so order and durations are
//!   exactly CLOCK_MONOTONIC's;
//! - the kernel and user-space traces of one session share the clock but
//!   measure their offsets separately (40 ns apart in the corpus'
//!   multi-domains trace): merging on absolute time interleaves them the way
//!   babeltrace2 does, and the merged stream stays ordered on `ts`;
//! - absolute time is what wall-clock span timestamps (Jaeger, OTLP) compare
//!   with, as in `deepspan import --jaeger ... --ctf ...`.
//!
//! To join with spans that carry CLOCK_MONOTONIC (the deepspan SDK's
//! `deepspan.mono_start_ns`), use [`CtfEvent::monotonic_ns`] (ticks in ns,
//! no offset) or subtract [`TraceInfo::clock_offset_ns`].
//!
//! Malformed input never panics: every failure is an [`Error`] naming the
//! file and byte offset. A stream file cut short (an interrupted copy) is
//! not an error: its whole packets are decoded and
//! [`CtfTrace::truncations`] says what is lost ([`StreamCut`]; LTTng's
//! packet index, when present, also reveals a cut between packets).
//! Metadata cut short is an error.
//!
//! # Speed
//!
//! Events are decoded in batches by a fast path compiled from the metadata
//! for the common layouts (fixed runs of integers, strings, LTTng's compact
//! and large headers), into small records; a [`CtfEvent`] is a 16-byte
//! handle on its record, and the records are shared by reference counting
//! that costs no atomic operation per event. Field values are decoded only
//! when asked for. Anything the fast path does not cover (and every error)
//! goes through the general decoder.

// `x % 8 == 0` stays: `is_multiple_of` needs Rust 1.87, the workspace
// supports 1.80.
#![allow(clippy::manual_is_multiple_of)]

mod decode;
mod error;
mod event;
mod fast;
mod layout;
mod metadata;
mod share;
mod stream;
mod trace;
mod tsdl;
mod typed;

pub use error::{Error, ErrorKind, Result};
pub use event::{CtfEvent, SpanSync};
pub use metadata::{Clock, EnvValue};
pub use stream::{LostEvents, StreamCut};
pub use trace::{CtfTrace, Events, LostLogHandle, StreamReader, TraceInfo};

/// Events and traces can move to (and be shared with) other threads.
#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<CtfEvent>();
    check::<CtfTrace>();
    check::<Events>();
    check::<StreamReader>();
}
