//! Fuzzes the OTLP/JSON importer (one request, or one per line): any input must import or fail with an
//! error, never panic, hang or allocate by a claimed size; what imports must
//! go through the critical-path analysis as well.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("common_spans.rs");

fuzz_target!(|data: &[u8]| {
    if let Ok(import) = deepspan_spans::parse_otlp_json(data, "fuzz.json") {
        exercise(import);
    }
});
