//! Fuzzes the OTLP protobuf importer and the recognition of binary span
//! files (one request, or deepspan's length-delimited records): any input
//! must import or fail with an error, never panic, hang or allocate by a
//! length field.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("common_spans.rs");

fuzz_target!(|data: &[u8]| {
    if let Ok(import) = deepspan_spans::parse_otlp_protobuf(data, "fuzz.pb") {
        exercise(import);
    }
    // Recognition by content: JSON shapes, the record stream, one request.
    if let Ok(import) = deepspan_spans::import_bytes(data, "fuzz.bin") {
        exercise(import);
    }
});
