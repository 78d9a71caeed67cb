//! OTLP/HTTP: `POST /v1/traces` with a protobuf or JSON
//! `ExportTraceServiceRequest`, optionally gzip- or deflate-compressed.
//!
//! Answers follow the OTLP/HTTP specification: 200 with an
//! `ExportTraceServiceResponse` in the request's encoding (a partial success
//! when spans were left out); 400 with a `google.rpc.Status` for a payload
//! that cannot be decoded; 503 with `Retry-After` when the queue is full;
//! 413 and 415 for oversized and unsupported payloads.

use std::io::Read;
use std::sync::mpsc;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;

use crate::queue::{Outcome, Queue};
use crate::status::{RpcStatus, RETRY_AFTER_SECONDS};
use crate::MAX_REQUEST_BYTES;

const PROTOBUF: &str = "application/x-protobuf";
const JSON: &str = "application/json";

/// Serves until `stop` turns true, then reports on `done`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    queue: Arc<Queue>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) {
    let app = Router::new()
        .route("/v1/traces", post(export))
        .fallback(not_found)
        .with_state(queue);
    let signal = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    // axum::serve only returns on shutdown (accept errors are retried inside).
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await;
    let _ = done.send(());
}

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Protobuf,
    Json,
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        Encoding::Protobuf,
        RpcStatus::invalid("not found: OTLP traces are received at POST /v1/traces"),
    )
}

async fn export(State(queue): State<Arc<Queue>>, headers: HeaderMap, body: Body) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let encoding = match content_type.as_str() {
        PROTOBUF | "application/protobuf" => Encoding::Protobuf,
        JSON => Encoding::Json,
        other => {
            queue.invalid(0);
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Encoding::Protobuf,
                RpcStatus::invalid(format!(
                    "Content-Type {other:?} is not supported: use {PROTOBUF} or {JSON}"
                )),
            );
        }
    };
    let raw = match Limited::new(body, MAX_REQUEST_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            queue.invalid(0);
            return too_large(encoding);
        }
        Err(e) => {
            queue.invalid(0);
            return error(
                StatusCode::BAD_REQUEST,
                encoding,
                RpcStatus::invalid(format!("cannot read the request body: {e}")),
            );
        }
    };
    let content_encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let payload = match decompress(&content_encoding, raw) {
        Ok(p) => p,
        Err(Inflate::TooLarge) => {
            queue.invalid(0);
            return too_large(encoding);
        }
        Err(Inflate::Unsupported) => {
            queue.invalid(0);
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                encoding,
                RpcStatus::invalid(format!(
                    "Content-Encoding {content_encoding:?} is not supported: use gzip, deflate or none"
                )),
            );
        }
        Err(Inflate::Corrupt(e)) => {
            queue.invalid(0);
            return error(
                StatusCode::BAD_REQUEST,
                encoding,
                RpcStatus::invalid(format!(
                    "the {content_encoding} body cannot be decompressed: {e}"
                )),
            );
        }
    };
    let decoded = match encoding {
        Encoding::Protobuf => ExportTraceServiceRequest::decode(payload.as_ref())
            .map(|r| (r, Some(payload.clone())))
            .map_err(|e| format!("not an OTLP ExportTraceServiceRequest in protobuf: {e}")),
        Encoding::Json => {
            let de = &mut serde_json::Deserializer::from_slice(&payload);
            serde_path_to_error::deserialize::<_, ExportTraceServiceRequest>(de)
                .map(|r| (r, None))
                .map_err(|e| {
                    format!(
                        "not an OTLP/JSON ExportTraceServiceRequest: at {}: {}",
                        e.path(),
                        e.inner()
                    )
                })
        }
    };
    let (request, protobuf) = match decoded {
        Ok(d) => d,
        Err(message) => {
            queue.invalid(payload.len());
            return error(
                StatusCode::BAD_REQUEST,
                encoding,
                RpcStatus::invalid(message),
            );
        }
    };
    match queue.offer(request, protobuf, payload.len()) {
        Outcome::Accepted { rejected, problem } => {
            let response = ExportTraceServiceResponse {
                partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
                    rejected_spans: rejected as i64,
                    error_message: format!(
                        "{rejected} spans rejected; first: {}",
                        problem.unwrap_or_default()
                    ),
                }),
            };
            let body = match encoding {
                Encoding::Protobuf => response.encode_to_vec(),
                // `{}` rather than `{"partialSuccess":null}` for a full success.
                Encoding::Json if response.partial_success.is_none() => b"{}".to_vec(),
                Encoding::Json => serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec()),
            };
            reply(StatusCode::OK, encoding, body)
        }
        Outcome::Full => unavailable(encoding, "the receiver's queue is full; retry later"),
        Outcome::Closed => unavailable(encoding, "the receiver is shutting down"),
    }
}

enum Inflate {
    Unsupported,
    TooLarge,
    Corrupt(std::io::Error),
}

/// Decompresses into at most [`MAX_REQUEST_BYTES`] (a small gzip body can
/// expand without bound).
fn decompress(content_encoding: &str, raw: Bytes) -> Result<Bytes, Inflate> {
    let reader: Box<dyn Read> = match content_encoding {
        "" | "identity" => return Ok(raw),
        "gzip" | "x-gzip" => Box::new(flate2::read::MultiGzDecoder::new(raw.as_ref())),
        "deflate" => Box::new(flate2::read::ZlibDecoder::new(raw.as_ref())),
        _ => return Err(Inflate::Unsupported),
    };
    let mut out = Vec::with_capacity(raw.len().saturating_mul(4).min(MAX_REQUEST_BYTES));
    reader
        .take(MAX_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(Inflate::Corrupt)?;
    if out.len() > MAX_REQUEST_BYTES {
        return Err(Inflate::TooLarge);
    }
    Ok(out.into())
}

fn too_large(encoding: Encoding) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        encoding,
        RpcStatus::invalid(format!(
            "the request is over {} MiB; send smaller batches",
            MAX_REQUEST_BYTES >> 20
        )),
    )
}

fn unavailable(encoding: Encoding, message: &str) -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        encoding,
        RpcStatus::unavailable(message),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    r
}

fn error(status: StatusCode, encoding: Encoding, body: RpcStatus) -> Response {
    let bytes = match encoding {
        Encoding::Protobuf => body.encode_to_vec(),
        Encoding::Json => body.to_json().to_string().into_bytes(),
    };
    reply(status, encoding, bytes)
}

fn reply(status: StatusCode, encoding: Encoding, body: Vec<u8>) -> Response {
    let content_type = match encoding {
        Encoding::Protobuf => PROTOBUF,
        Encoding::Json => JSON,
    };
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
