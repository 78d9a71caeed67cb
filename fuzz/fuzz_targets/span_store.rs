//! Fuzzes the reader of a run's span files (length-delimited OTLP records):
//! any bytes must give records, errors naming the offset, or a note about a
//! truncated last record; never a panic, or an allocation sized by a record
//! length beyond the bytes present.
#![no_main]

use std::path::Path;

use deepspan_spans::store::RecordReader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut reader = RecordReader::from_reader(Path::new("fuzz/otlp-000.pb"), data);
    for record in reader.by_ref() {
        match record {
            Ok(request) => {
                let _ = request.resource_spans.len();
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    // Offsets count bytes really read: never past the end of the input.
    assert!(reader.offset() as usize <= data.len());
    let _ = reader.warnings.len();
});
