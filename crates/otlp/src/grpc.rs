//! OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
//!
//! Served by a hand-written service instead of the generated
//! `TraceServiceServer` for one reason: tonic's prost codec answers an
//! undecodable message with `INTERNAL`, while OTLP asks for
//! `INVALID_ARGUMENT` (non-retryable) there. The codec below decodes into
//! the same message type and reports failures as the specification says.

use std::convert::Infallible;
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Buf;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tonic::body::Body;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::BoxFuture;
use tonic::{Code, Request, Response, Status};

use crate::decode::{decode_payload, DecodeError, PayloadEncoding};
use crate::queue::{Outcome, Queue};
use crate::status::RpcStatus;
use crate::MAX_REQUEST_BYTES;

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Serves until `stop` turns true, then reports on `done`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    queue: Arc<Queue>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let signal = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    // An error here is a failed accept loop; requests already answered are
    // unaffected and shutdown still drains the queue.
    let _ = tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(TraceService { queue }, incoming, signal)
        .await;
    let _ = done.send(());
}

#[derive(Clone)]
struct TraceService {
    queue: Arc<Queue>,
}

impl tonic::codegen::Service<http::Request<Body>> for TraceService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != EXPORT_PATH {
            return Box::pin(async {
                Ok(Status::unimplemented("only TraceService/Export is served here").into_http())
            });
        }
        let queue = self.queue.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ExportCodec)
                .accept_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(MAX_REQUEST_BYTES);
            Ok(grpc.unary(Export { queue }, req).await)
        })
    }
}

struct Export {
    queue: Arc<Queue>,
}

impl tonic::server::UnaryService<Decoded> for Export {
    type Response = ExportTraceServiceResponse;
    type Future = BoxFuture<Response<Self::Response>, Status>;

    fn call(&mut self, request: Request<Decoded>) -> Self::Future {
        let queue = self.queue.clone();
        Box::pin(async move {
            let request = request.into_inner();
            let (message, raw) = match request {
                Decoded::Ok { message, raw } => (message, raw),
                Decoded::Malformed { error, bytes } => {
                    queue.invalid(bytes);
                    return Err(Status::new(Code::InvalidArgument, error.to_string()));
                }
            };
            let size = raw.len();
            match queue.offer(message, Some(raw), size) {
                Outcome::Accepted { rejected, problem } => {
                    Ok(Response::new(ExportTraceServiceResponse {
                        partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
                            rejected_spans: rejected as i64,
                            error_message: format!(
                                "{rejected} spans rejected; first: {}",
                                problem.unwrap_or_default()
                            ),
                        }),
                    }))
                }
                Outcome::Full => Err(unavailable("the receiver's queue is full; retry later")),
                Outcome::Closed => Err(unavailable("the receiver is shutting down")),
            }
        })
    }
}

fn unavailable(message: &str) -> Status {
    let details = RpcStatus::unavailable(message).encode_to_vec();
    Status::with_details(Code::Unavailable, message, details.into())
}

/// A request as the codec hands it over: decoding errors are carried to the
/// service (which counts them and answers INVALID_ARGUMENT) instead of being
/// answered by tonic as INTERNAL.
enum Decoded {
    Ok {
        message: ExportTraceServiceRequest,
        /// The message as received (after decompression), to be stored as is.
        raw: bytes::Bytes,
    },
    Malformed {
        error: DecodeError,
        bytes: usize,
    },
}

struct ExportCodec;

impl Codec for ExportCodec {
    type Encode = ExportTraceServiceResponse;
    type Decode = Decoded;
    type Encoder = ResponseEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder
    }
}

struct ResponseEncoder;

impl Encoder for ResponseEncoder {
    type Item = ExportTraceServiceResponse;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("cannot encode the response: {e}")))
    }
}

struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = Decoded;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Decoded>, Status> {
        // tonic has already taken the gRPC framing and gzip off.
        let raw = src.copy_to_bytes(src.remaining());
        Ok(Some(
            match decode_payload(PayloadEncoding::Protobuf, raw.clone()) {
                Ok(decoded) => Decoded::Ok {
                    message: decoded.request,
                    raw,
                },
                Err(error) => Decoded::Malformed {
                    error,
                    bytes: raw.len(),
                },
            },
        ))
    }
}
