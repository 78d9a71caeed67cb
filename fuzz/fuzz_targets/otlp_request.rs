//! Fuzzes the OTLP receiver's request decoding (the part both transports
//! share): media type, Content-Encoding (gzip, deflate) and body. Any input
//! must decode or be refused with an error; decompression stays within the
//! request limit whatever the body claims.
//!
//! Input layout: the first byte picks the headers (low two bits the
//! Content-Type, the next two the Content-Encoding), the rest is the body.
//! Seeds in fuzz/otlp_request_seeds (`fuzz/make_seeds.py` writes them).
#![no_main]

use deepspan_otlp::decode::decode_request;
use libfuzzer_sys::fuzz_target;

const CONTENT_TYPES: [&str; 4] = [
    "application/x-protobuf",
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
];
const CONTENT_ENCODINGS: [&str; 4] = ["", "gzip", "deflate", "br"];

fuzz_target!(|data: &[u8]| {
    let Some((&headers, body)) = data.split_first() else {
        return;
    };
    let content_type = CONTENT_TYPES[(headers & 3) as usize];
    let content_encoding = CONTENT_ENCODINGS[((headers >> 2) & 3) as usize];
    if let Ok(decoded) = decode_request(
        content_type,
        content_encoding,
        bytes::Bytes::copy_from_slice(body),
    ) {
        // What the receiver stores is read back by the protobuf importer.
        use prost::Message;
        let stored = decoded
            .protobuf
            .map(|b| b.to_vec())
            .unwrap_or_else(|| decoded.request.encode_to_vec());
        let _ = deepspan_spans::parse_otlp_protobuf(&stored, "fuzz request");
    }
});
