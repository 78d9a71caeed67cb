//! `google.rpc.Status` and `google.rpc.RetryInfo`: the error bodies OTLP
//! uses on both transports (HTTP response body; gRPC
//! `grpc-status-details-bin`). Four small messages, so they are declared
//! here rather than pulling in a crate of Google API types.

use prost::Message;

/// gRPC status codes used here.
pub(crate) const INVALID_ARGUMENT: i32 = 3;
pub(crate) const UNAVAILABLE: i32 = 14;

/// How long a refused sender is asked to wait before retrying.
pub(crate) const RETRY_AFTER_SECONDS: i64 = 1;

#[derive(Clone, PartialEq, Message)]
pub(crate) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

#[derive(Clone, PartialEq, Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

impl RpcStatus {
    pub(crate) fn invalid(message: impl Into<String>) -> RpcStatus {
        RpcStatus {
            code: INVALID_ARGUMENT,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// UNAVAILABLE with a RetryInfo, which OTLP exporters honour as the delay
    /// before their next attempt.
    pub(crate) fn unavailable(message: impl Into<String>) -> RpcStatus {
        let retry = RetryInfo {
            retry_delay: Some(ProtoDuration {
                seconds: RETRY_AFTER_SECONDS,
                nanos: 0,
            }),
        };
        RpcStatus {
            code: UNAVAILABLE,
            message: message.into(),
            details: vec![Any {
                type_url: RETRY_INFO_TYPE.into(),
                value: retry.encode_to_vec(),
            }],
        }
    }

    /// The proto3 JSON form (`{"code":…,"message":…,"details":[…]}`).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let details: Vec<serde_json::Value> = self
            .details
            .iter()
            .filter(|d| d.type_url == RETRY_INFO_TYPE)
            .map(|_| {
                serde_json::json!({
                    "@type": RETRY_INFO_TYPE,
                    "retryDelay": format!("{RETRY_AFTER_SECONDS}s"),
                })
            })
            .collect();
        let mut v = serde_json::json!({ "code": self.code, "message": self.message });
        if !details.is_empty() {
            v["details"] = serde_json::Value::Array(details);
        }
        v
    }
}
