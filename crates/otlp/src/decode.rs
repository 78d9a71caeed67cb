//! Request decoding shared by both transports, kept free of any network
//! type so it can be tested and fuzzed on plain bytes: media type →
//! encoding, `Content-Encoding` → decompressed payload (bounded by
//! [`MAX_REQUEST_BYTES`]), payload → `ExportTraceServiceRequest`.
//!
//! OTLP/HTTP uses [`decode_request`] (all three steps); OTLP/gRPC gets the
//! payload already decompressed by tonic and uses [`decode_payload`].

use std::io::Read;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use crate::MAX_REQUEST_BYTES;

/// The media type OTLP/HTTP uses for protobuf payloads.
pub const PROTOBUF_MEDIA_TYPE: &str = "application/x-protobuf";
/// The media type OTLP/HTTP uses for JSON payloads.
pub const JSON_MEDIA_TYPE: &str = "application/json";

/// How a payload is encoded, as its media type says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadEncoding {
    Protobuf,
    Json,
}

impl PayloadEncoding {
    /// From a `Content-Type` header value (parameters such as `charset` are
    /// ignored, case does not matter); `None` for a type OTLP does not use.
    pub fn from_content_type(content_type: &str) -> Option<PayloadEncoding> {
        let media_type = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media_type.as_str() {
            PROTOBUF_MEDIA_TYPE | "application/protobuf" => Some(PayloadEncoding::Protobuf),
            JSON_MEDIA_TYPE => Some(PayloadEncoding::Json),
            _ => None,
        }
    }
}

/// A request ready for the queue.
#[derive(Debug)]
pub struct DecodedRequest {
    pub encoding: PayloadEncoding,
    pub request: ExportTraceServiceRequest,
    /// The protobuf payload as received (after decompression), so the
    /// receiver stores the sender's bytes instead of re-encoding them;
    /// `None` for JSON.
    pub protobuf: Option<Bytes>,
    /// Size of the decompressed payload, for the counters.
    pub payload_bytes: usize,
}

/// Why a request could not be decoded. Each maps to one OTLP/HTTP answer
/// (415, 413 or 400); messages say what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("Content-Type {0:?} is not supported: use {PROTOBUF_MEDIA_TYPE} or {JSON_MEDIA_TYPE}")]
    UnsupportedContentType(String),
    #[error("Content-Encoding {0:?} is not supported: use gzip, deflate or none")]
    UnsupportedContentEncoding(String),
    #[error("the request is over {} MiB once decompressed; send smaller batches", MAX_REQUEST_BYTES >> 20)]
    TooLarge,
    #[error("the {content_encoding} body cannot be decompressed: {source} (after {decompressed_bytes} decompressed bytes)")]
    Corrupt {
        content_encoding: String,
        decompressed_bytes: usize,
        source: std::io::Error,
    },
    #[error("{0}")]
    Malformed(String),
}

/// Decodes one OTLP/HTTP request body: `content_type` and
/// `content_encoding` are the header values ("" when absent).
pub fn decode_request(
    content_type: &str,
    content_encoding: &str,
    body: Bytes,
) -> Result<DecodedRequest, DecodeError> {
    let encoding = PayloadEncoding::from_content_type(content_type)
        .ok_or_else(|| DecodeError::UnsupportedContentType(content_type.to_string()))?;
    let payload = decompress(content_encoding, body)?;
    decode_payload(encoding, payload)
}

/// Decompresses a body into at most [`MAX_REQUEST_BYTES`]: a small gzip
/// body can expand without bound, so the output is never sized by what the
/// body claims, only by what it really inflates to.
pub fn decompress(content_encoding: &str, raw: Bytes) -> Result<Bytes, DecodeError> {
    let name = content_encoding.trim().to_ascii_lowercase();
    let reader: Box<dyn Read> = match name.as_str() {
        "" | "identity" => return Ok(raw),
        "gzip" | "x-gzip" => Box::new(flate2::read::MultiGzDecoder::new(raw.as_ref())),
        "deflate" => Box::new(flate2::read::ZlibDecoder::new(raw.as_ref())),
        _ => return Err(DecodeError::UnsupportedContentEncoding(name)),
    };
    let mut out = Vec::with_capacity(raw.len().saturating_mul(4).min(MAX_REQUEST_BYTES));
    reader
        .take(MAX_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|source| DecodeError::Corrupt {
            content_encoding: name.clone(),
            decompressed_bytes: out.len(),
            source,
        })?;
    if out.len() > MAX_REQUEST_BYTES {
        return Err(DecodeError::TooLarge);
    }
    Ok(out.into())
}

/// Decodes a decompressed payload. Errors name the position: prost's names
/// the message and field, the JSON one the path, line and column.
pub fn decode_payload(
    encoding: PayloadEncoding,
    payload: Bytes,
) -> Result<DecodedRequest, DecodeError> {
    let payload_bytes = payload.len();
    let (request, protobuf) = match encoding {
        PayloadEncoding::Protobuf => {
            let request = ExportTraceServiceRequest::decode(payload.clone()).map_err(|e| {
                DecodeError::Malformed(format!(
                    "not an OTLP ExportTraceServiceRequest in protobuf: {e}"
                ))
            })?;
            (request, Some(payload))
        }
        PayloadEncoding::Json => {
            let de = &mut serde_json::Deserializer::from_slice(&payload);
            let request = serde_path_to_error::deserialize::<_, ExportTraceServiceRequest>(de)
                .map_err(|e| {
                    DecodeError::Malformed(format!(
                        "not an OTLP/JSON ExportTraceServiceRequest: at {}: {}",
                        e.path(),
                        e.inner()
                    ))
                })?;
            (request, None)
        }
    };
    Ok(DecodedRequest {
        encoding,
        request,
        protobuf,
        payload_bytes,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn gzip_json_and_protobuf_decode_to_the_same_request() {
        let json = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"x"}]}]}]}"#;
        let from_json =
            decode_request("application/json; charset=utf-8", "gzip", gzip(json).into()).unwrap();
        assert_eq!(from_json.encoding, PayloadEncoding::Json);
        assert!(from_json.protobuf.is_none());
        assert_eq!(from_json.payload_bytes, json.len());
        let proto = from_json.request.encode_to_vec();
        let from_proto =
            decode_request("Application/X-Protobuf", "", Bytes::from(proto.clone())).unwrap();
        assert_eq!(from_proto.request, from_json.request);
        assert_eq!(from_proto.protobuf.as_deref(), Some(&proto[..]));
        assert_eq!(
            from_proto.request.resource_spans[0].scope_spans[0].spans[0].name,
            "x"
        );
    }

    #[test]
    fn bad_requests_get_the_error_that_says_why() {
        let err = |ct: &str, ce: &str, body: &[u8]| {
            decode_request(ct, ce, Bytes::copy_from_slice(body))
                .unwrap_err()
                .to_string()
        };
        assert!(err("text/plain", "", b"").contains("Content-Type \"text/plain\""));
        assert!(err(JSON_MEDIA_TYPE, "br", b"{}").contains("Content-Encoding \"br\""));
        let truncated = &gzip(b"{}")[..8];
        assert!(
            err(JSON_MEDIA_TYPE, "gzip", truncated).contains("gzip body cannot be decompressed")
        );
        let e = err(
            JSON_MEDIA_TYPE,
            "",
            br#"{"resourceSpans":[{"scopeSpans":7}]}"#,
        );
        assert!(e.contains("resourceSpans[0].scopeSpans"), "{e}");
        // A length prefix far beyond the body is an error, not an allocation.
        let e = err(
            PROTOBUF_MEDIA_TYPE,
            "",
            &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        );
        assert!(e.contains("protobuf"), "{e}");
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_request_limit() {
        let zeros = vec![0u8; MAX_REQUEST_BYTES + 1];
        let bomb = gzip(&zeros);
        assert!(bomb.len() < MAX_REQUEST_BYTES / 100);
        assert!(matches!(
            decode_request(PROTOBUF_MEDIA_TYPE, "gzip", bomb.into()),
            Err(DecodeError::TooLarge)
        ));
    }
}
