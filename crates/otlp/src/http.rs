//! OTLP/HTTP: `POST /v1/traces` with a protobuf or JSON
//! `ExportTraceServiceRequest`, optionally gzip- or deflate-compressed.
//!
//! Answers follow the OTLP/HTTP specification: 200 with an
//! `ExportTraceServiceResponse` in the request's encoding (a partial success
//! when spans were left out); 400 with a `google.rpc.Status` for a payload
//! that cannot be decoded; 503 with `Retry-After` when the queue is full;
//! 413 and 415 for oversized and unsupported payloads.

use std::sync::mpsc;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;

use crate::decode::{
    decode_request, DecodeError, PayloadEncoding, JSON_MEDIA_TYPE, PROTOBUF_MEDIA_TYPE,
};
use crate::queue::{Outcome, Queue};
use crate::status::{RpcStatus, RETRY_AFTER_SECONDS};
use crate::MAX_REQUEST_BYTES;

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

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        PayloadEncoding::Protobuf,
        RpcStatus::invalid("not found: OTLP traces are received at POST /v1/traces"),
    )
}

async fn export(State(queue): State<Arc<Queue>>, headers: HeaderMap, body: Body) -> Response {
    let header_text = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let content_type = header_text(header::CONTENT_TYPE);
    // Errors are answered in the request's encoding when it is known.
    let encoding = PayloadEncoding::from_content_type(&content_type);
    let answer_encoding = encoding.unwrap_or(PayloadEncoding::Protobuf);
    if encoding.is_none() {
        queue.invalid(0);
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            answer_encoding,
            RpcStatus::invalid(DecodeError::UnsupportedContentType(content_type).to_string()),
        );
    }
    let raw = match Limited::new(body, MAX_REQUEST_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            queue.invalid(0);
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                answer_encoding,
                RpcStatus::invalid(DecodeError::TooLarge.to_string()),
            );
        }
        Err(e) => {
            queue.invalid(0);
            return error(
                StatusCode::BAD_REQUEST,
                answer_encoding,
                RpcStatus::invalid(format!("cannot read the request body: {e}")),
            );
        }
    };
    let raw_bytes = raw.len();
    let decoded = match decode_request(&content_type, &header_text(header::CONTENT_ENCODING), raw) {
        Ok(d) => d,
        Err(e) => {
            let status = match &e {
                DecodeError::UnsupportedContentType(_)
                | DecodeError::UnsupportedContentEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                DecodeError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                DecodeError::Corrupt { .. } => StatusCode::BAD_REQUEST,
                DecodeError::Malformed(_) => StatusCode::BAD_REQUEST,
            };
            // Only a payload that was read in full counts its bytes.
            let counted = if matches!(e, DecodeError::Malformed(_)) {
                raw_bytes
            } else {
                0
            };
            queue.invalid(counted);
            return error(status, answer_encoding, RpcStatus::invalid(e.to_string()));
        }
    };
    let encoding = decoded.encoding;
    let payload_bytes = decoded.payload_bytes;
    match queue.offer(decoded.request, decoded.protobuf, payload_bytes) {
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
                PayloadEncoding::Protobuf => response.encode_to_vec(),
                // `{}` rather than `{"partialSuccess":null}` for a full success.
                PayloadEncoding::Json if response.partial_success.is_none() => b"{}".to_vec(),
                PayloadEncoding::Json => {
                    serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec())
                }
            };
            reply(StatusCode::OK, encoding, body)
        }
        Outcome::Full => unavailable(encoding, "the receiver's queue is full; retry later"),
        Outcome::Closed => unavailable(encoding, "the receiver is shutting down"),
    }
}

fn unavailable(encoding: PayloadEncoding, message: &str) -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        encoding,
        RpcStatus::unavailable(message),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    r
}

fn error(status: StatusCode, encoding: PayloadEncoding, body: RpcStatus) -> Response {
    let bytes = match encoding {
        PayloadEncoding::Protobuf => body.encode_to_vec(),
        PayloadEncoding::Json => body.to_json().to_string().into_bytes(),
    };
    reply(status, encoding, bytes)
}

fn reply(status: StatusCode, encoding: PayloadEncoding, body: Vec<u8>) -> Response {
    let content_type = match encoding {
        PayloadEncoding::Protobuf => PROTOBUF_MEDIA_TYPE,
        PayloadEncoding::Json => JSON_MEDIA_TYPE,
    };
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
