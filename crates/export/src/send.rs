//! Where an export goes: an OTLP/JSON file (one `ExportTraceServiceRequest`
//! per line, one line per trace, as the Collector's file exporter writes;
//! `deepspan import` reads it back), or an OTLP endpoint over gRPC or
//! HTTP/protobuf, gzip-compressed, in requests of whole traces, retried with
//! backoff when the server says to (gRPC `UNAVAILABLE` & co., HTTP
//! 429/502/503/504 with `Retry-After`) or cannot be reached.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deepspan_spans::{request_from_spans, Span};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;

use crate::{Error, Export};

/// Writes the export as OTLP/JSON lines; returns the bytes written.
pub fn write_json(export: &Export, path: &Path) -> Result<u64, Error> {
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::new(file);
    let mut bytes = 0u64;
    for trace in &export.traces {
        let request = request_from_spans(trace);
        let line = serde_json::to_vec(&request)
            .map_err(|e| Error::Send(format!("cannot write OTLP/JSON: {e}")))?;
        out.write_all(&line).map_err(|e| Error::io(path, e))?;
        out.write_all(b"\n").map_err(|e| Error::io(path, e))?;
        bytes += line.len() as u64 + 1;
    }
    out.flush().map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// The transport a URL implies: `grpc://…` or port 4317 → gRPC;
    /// anything else (`http://…:4318`, a path ending in `/v1/traces`) → HTTP.
    pub fn from_url(url: &str) -> Protocol {
        if url.starts_with("grpc://") {
            return Protocol::Grpc;
        }
        match url.parse::<http::Uri>().ok().and_then(|u| u.port_u16()) {
            Some(4317) => Protocol::Grpc,
            _ => Protocol::HttpProtobuf,
        }
    }
}

/// How to send.
#[derive(Clone, Debug)]
pub struct SendOptions {
    /// `None`: from the URL ([`Protocol::from_url`]).
    pub protocol: Option<Protocol>,
    pub gzip: bool,
    /// Tries per request, the first included.
    pub max_attempts: u32,
    /// Wait before the first retry; doubled each time, up to 8 s (or what
    /// the server asks, up to 30 s).
    pub first_backoff: Duration,
    /// Per try.
    pub timeout: Duration,
    /// A request holds whole traces up to about this many protobuf bytes
    /// (a larger trace goes alone).
    pub max_request_bytes: usize,
}

impl Default for SendOptions {
    fn default() -> SendOptions {
        SendOptions {
            protocol: None,
            gzip: true,
            max_attempts: 6,
            first_backoff: Duration::from_millis(500),
            timeout: Duration::from_secs(10),
            max_request_bytes: 2 << 20,
        }
    }
}

/// What [`send_otlp`] did.
#[derive(Clone, Debug, Default)]
pub struct SendReport {
    pub protocol: Option<Protocol>,
    pub requests: usize,
    pub spans: usize,
    /// Protobuf bytes before compression.
    pub bytes: u64,
    pub retries: u32,
    /// Spans the server said it rejected (OTLP partial success).
    pub rejected_spans: i64,
    /// The server's partial-success messages.
    pub messages: Vec<String>,
}

/// Retry-After (seconds) or gRPC RetryInfo honoured at most this long.
pub const MAX_SERVER_BACKOFF: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// Why a try failed: whether the OTLP specification says to retry it, how
/// long the server asked to wait (HTTP `Retry-After`, gRPC `RetryInfo`),
/// and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub retry: bool,
    pub after: Option<Duration>,
    pub message: String,
}

/// Sends the export to an OTLP endpoint (`http://host:4318`,
/// `http://host:4318/v1/traces`, `http://host:4317`, `grpc://host:4317`).
pub fn send_otlp(export: &Export, url: &str, options: &SendOptions) -> Result<SendReport, Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Send(format!("cannot start the network runtime: {e}")))?;
    runtime.block_on(async {
        let mut client = OtlpClient::new(
            url,
            &ClientOptions {
                protocol: options.protocol,
                gzip: options.gzip,
                timeout: options.timeout,
            },
        )?;
        let mut report = SendReport {
            protocol: Some(client.protocol()),
            ..SendReport::default()
        };
        for batch in batches(&export.traces, options.max_request_bytes) {
            let request = request_from_spans(&batch.into_iter().cloned().collect::<Vec<_>>());
            let spans: usize = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            let payload = Bytes::from(request.encode_to_vec());
            let mut backoff = options.first_backoff;
            let mut attempt = 1;
            let response = loop {
                match client.send_encoded(payload.clone()).await {
                    Ok(r) => break r,
                    Err(f) if f.retry && attempt < options.max_attempts => {
                        let wait = f
                            .after
                            .map(|a| a.min(MAX_SERVER_BACKOFF))
                            .unwrap_or(backoff);
                        tokio::time::sleep(wait).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        attempt += 1;
                        report.retries += 1;
                    }
                    Err(f) => {
                        return Err(Error::Send(format!(
                            "{url}: {} (after {attempt} tries; {} of {} spans sent before)",
                            f.message,
                            report.spans,
                            export.spans().count()
                        )))
                    }
                }
            };
            if let Some(p) = response.partial_success {
                report.rejected_spans += p.rejected_spans;
                if !p.error_message.is_empty() {
                    report.messages.push(p.error_message);
                }
            }
            report.requests += 1;
            report.spans += spans;
            report.bytes += payload.len() as u64;
        }
        Ok(report)
    })
}

/// How an [`OtlpClient`] connects.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// `None`: from the URL ([`Protocol::from_url`]).
    pub protocol: Option<Protocol>,
    pub gzip: bool,
    /// Per try.
    pub timeout: Duration,
}

/// One OTLP trace endpoint, over gRPC or HTTP/protobuf, sending requests
/// that are already protobuf-encoded (an agent forwards what it received
/// without decoding it again). One try per call: retrying, and how long to
/// wait, is the caller's business, from the [`Failure`].
pub struct OtlpClient {
    protocol: Protocol,
    /// What is connected to: `http://…`, with `/v1/traces` for HTTP.
    target: String,
    gzip: bool,
    timeout: Duration,
    transport: Transport,
}

// One per sender: the size difference of its variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Transport {
    Grpc(Box<tonic::client::Grpc<tonic::transport::Channel>>),
    Http(
        hyper_util::client::legacy::Client<
            hyper_util::client::legacy::connect::HttpConnector,
            http_body_util::Full<Bytes>,
        >,
    ),
}

impl OtlpClient {
    /// Checks the URL (`http://host:port[/path]` or `grpc://host:port`);
    /// connects on the first send. Must be called inside a tokio runtime
    /// (the gRPC channel's worker is spawned on it).
    pub fn new(url: &str, options: &ClientOptions) -> Result<OtlpClient, Error> {
        let protocol = options.protocol.unwrap_or_else(|| Protocol::from_url(url));
        let target = endpoint(url, protocol)?;
        let transport = match protocol {
            Protocol::Grpc => {
                let channel = tonic::transport::Endpoint::from_shared(target.clone())
                    .map_err(|e| Error::Send(format!("{url}: {e}")))?
                    .timeout(options.timeout)
                    .connect_timeout(options.timeout)
                    .connect_lazy();
                // Servers may answer gzip-compressed (Jaeger does).
                let mut grpc = tonic::client::Grpc::new(channel)
                    .max_encoding_message_size(64 << 20)
                    .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
                if options.gzip {
                    grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Transport::Grpc(Box::new(grpc))
            }
            Protocol::HttpProtobuf => Transport::Http(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http(),
            ),
        };
        Ok(OtlpClient {
            protocol,
            target,
            gzip: options.gzip,
            timeout: options.timeout,
            transport,
        })
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The URL requests go to (`grpc://` written as `http://`, HTTP with its
    /// `/v1/traces` path).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Sends one protobuf-encoded `ExportTraceServiceRequest`, once.
    pub async fn send_encoded(
        &mut self,
        payload: Bytes,
    ) -> Result<ExportTraceServiceResponse, Failure> {
        match &mut self.transport {
            Transport::Grpc(grpc) => send_grpc(grpc, payload, self.timeout).await,
            Transport::Http(client) => {
                send_http(client, &self.target, payload, self.gzip, self.timeout).await
            }
        }
    }
}

/// The URL to connect to: HTTP gets `/v1/traces` when the URL has no path
/// (as `OTEL_EXPORTER_OTLP_ENDPOINT` does); `grpc://` becomes `http://`.
fn endpoint(url: &str, protocol: Protocol) -> Result<String, Error> {
    let url = match url.strip_prefix("grpc://") {
        Some(rest) => format!("http://{rest}"),
        None => url.to_string(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| Error::Send(format!("{url:?} is not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(Error::Send(format!(
                "{url}: https is not supported; send to a local collector over http (it can forward with TLS)"
            )))
        }
        _ => {
            return Err(Error::Send(format!(
                "{url}: give an http:// (or grpc://) URL, e.g. http://127.0.0.1:4318"
            )))
        }
    }
    if uri.host().is_none() {
        return Err(Error::Send(format!("{url}: no host")));
    }
    Ok(match protocol {
        Protocol::HttpProtobuf if matches!(uri.path(), "" | "/") => {
            format!("{}/v1/traces", url.trim_end_matches('/'))
        }
        _ => url,
    })
}

/// Whole traces per request, up to about `max_bytes` each.
fn batches(traces: &[Vec<Span>], max_bytes: usize) -> Vec<Vec<&Span>> {
    let mut out: Vec<Vec<&Span>> = Vec::new();
    let mut size = 0usize;
    for trace in traces {
        let bytes = request_from_spans(trace).encoded_len();
        if out.is_empty() || (size + bytes > max_bytes && size > 0) {
            out.push(Vec::new());
            size = 0;
        }
        out.last_mut().expect("pushed").extend(trace.iter());
        size += bytes;
    }
    out
}

/// The gRPC method of OTLP traces.
const TRACE_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// A gRPC codec whose requests are protobuf bytes already: the encoder
/// copies them into the frame as they are; responses are decoded.
struct EncodedCodec;

struct EncodedEncoder;

struct ResponseDecoder;

impl tonic::codec::Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = EncodedEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> EncodedEncoder {
        EncodedEncoder
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

impl tonic::codec::Encoder for EncodedEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put(item);
        Ok(())
    }
}

impl tonic::codec::Decoder for ResponseDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<ExportTraceServiceResponse>, tonic::Status> {
        ExportTraceServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("cannot decode the response: {e}")))
    }
}

async fn send_grpc(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    payload: Bytes,
    timeout: Duration,
) -> Result<ExportTraceServiceResponse, Failure> {
    grpc.ready().await.map_err(|e| Failure {
        retry: true,
        after: None,
        message: format!("cannot reach the server: {e}"),
    })?;
    let mut request = tonic::Request::new(payload);
    request.set_timeout(timeout);
    let path = http::uri::PathAndQuery::from_static(TRACE_EXPORT_PATH);
    match grpc.unary(request, path, EncodedCodec).await {
        Ok(response) => Ok(response.into_inner()),
        Err(status) => {
            use tonic::Code::*;
            // The OTLP specification's retryable codes.
            let retry = matches!(
                status.code(),
                Unavailable
                    | ResourceExhausted
                    | Aborted
                    | Cancelled
                    | DeadlineExceeded
                    | OutOfRange
                    | DataLoss
            );
            Err(Failure {
                retry,
                after: retry_info(status.details()),
                message: format!("gRPC {:?}: {}", status.code(), status.message()),
            })
        }
    }
}

/// The delay of a `google.rpc.RetryInfo` in a status's details (the
/// `grpc-status-details-bin` trailer: a `google.rpc.Status`), which OTLP
/// servers send with `UNAVAILABLE`/`RESOURCE_EXHAUSTED` to ask for a wait.
fn retry_info(details: &[u8]) -> Option<Duration> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(message, repeated, tag = "3")]
        details: Vec<Any>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Any {
        #[prost(string, tag = "1")]
        type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        value: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        retry_delay: Option<ProtoDuration>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct ProtoDuration {
        #[prost(int64, tag = "1")]
        seconds: i64,
        #[prost(int32, tag = "2")]
        nanos: i32,
    }
    if details.is_empty() {
        return None;
    }
    let status = RpcStatus::decode(details).ok()?;
    status
        .details
        .iter()
        .filter(|any| any.type_url.ends_with("/google.rpc.RetryInfo"))
        .find_map(|any| RetryInfo::decode(any.value.as_slice()).ok()?.retry_delay)
        .filter(|d| d.seconds >= 0 && d.nanos >= 0)
        .map(|d| Duration::new(d.seconds as u64, d.nanos.min(999_999_999) as u32))
}

async fn send_http(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<Bytes>,
    >,
    url: &str,
    payload: Bytes,
    gzip: bool,
    timeout: Duration,
) -> Result<ExportTraceServiceResponse, Failure> {
    use http_body_util::BodyExt;
    let mut builder = http::Request::post(url).header("content-type", "application/x-protobuf");
    let body = if gzip {
        builder = builder.header("content-encoding", "gzip");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let compressed = gz
            .write_all(&payload)
            .and_then(|_| gz.finish())
            .map_err(|e| Failure {
                retry: false,
                after: None,
                message: format!("gzip: {e}"),
            })?;
        Bytes::from(compressed)
    } else {
        payload
    };
    let request = builder
        .body(http_body_util::Full::new(body))
        .map_err(|e| Failure {
            retry: false,
            after: None,
            message: e.to_string(),
        })?;
    let started = Instant::now();
    let response = match tokio::time::timeout(timeout, client.request(request)).await {
        Err(_) => {
            return Err(Failure {
                retry: true,
                after: None,
                message: format!("no answer within {timeout:?}"),
            })
        }
        Ok(Err(e)) => {
            return Err(Failure {
                retry: true,
                after: None,
                message: format!("cannot reach the server: {e}"),
            })
        }
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    let after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let left = timeout.saturating_sub(started.elapsed());
    let body = match tokio::time::timeout(left, response.into_body().collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        _ => Bytes::new(),
    };
    if status.is_success() {
        // An empty body is a full success; a body that is not a response
        // (some proxies answer with text) is taken as one too.
        return Ok(ExportTraceServiceResponse::decode(body.as_ref()).unwrap_or_default());
    }
    let retry = matches!(status.as_u16(), 429 | 502 | 503 | 504);
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    Err(Failure {
        retry,
        after,
        message: format!("HTTP {status}: {}", text.trim()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_follows_the_url() {
        assert_eq!(Protocol::from_url("http://127.0.0.1:4317"), Protocol::Grpc);
        assert_eq!(Protocol::from_url("grpc://collector:9999"), Protocol::Grpc);
        assert_eq!(
            Protocol::from_url("http://127.0.0.1:4318"),
            Protocol::HttpProtobuf
        );
        assert_eq!(
            Protocol::from_url("http://tempo/v1/traces"),
            Protocol::HttpProtobuf
        );
    }

    #[test]
    fn http_urls_without_a_path_get_the_traces_path() {
        let e = |u: &str, p| endpoint(u, p).unwrap();
        assert_eq!(
            e("http://h:4318", Protocol::HttpProtobuf),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            e("http://h:4318/", Protocol::HttpProtobuf),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            e("http://h:1/otlp/v1/traces", Protocol::HttpProtobuf),
            "http://h:1/otlp/v1/traces"
        );
        assert_eq!(e("grpc://h:4317", Protocol::Grpc), "http://h:4317");
        assert!(endpoint("https://h:4318", Protocol::HttpProtobuf).is_err());
        assert!(endpoint("h:4318", Protocol::HttpProtobuf).is_err());
    }

    #[test]
    fn grpc_retry_info_is_read_from_the_status_details() {
        // google.rpc.Status { code 14, details: [Any { RetryInfo { 2.5 s } }] },
        // encoded by hand as the wire format has it.
        let delay = [0x08, 0x02, 0x10, 0x80, 0xCA, 0xB5, 0xEE, 0x01]; // 2 s, 500 000 000 ns
        let mut info = vec![0x0A, delay.len() as u8];
        info.extend(delay);
        let type_url = b"type.googleapis.com/google.rpc.RetryInfo";
        let mut any = vec![0x0A, type_url.len() as u8];
        any.extend(type_url);
        any.extend([0x12, info.len() as u8]);
        any.extend(&info);
        let mut status = vec![0x08, 14, 0x1A, any.len() as u8];
        status.extend(&any);
        assert_eq!(retry_info(&status), Some(Duration::from_millis(2500)));
        assert_eq!(retry_info(&[]), None);
        assert_eq!(retry_info(&[0x08, 14]), None);
        assert_eq!(retry_info(&[0xFF]), None);
    }
}
