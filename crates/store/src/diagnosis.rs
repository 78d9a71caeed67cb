//! Diagnoses as stored: the JSON object of a diagnosis (in `requests.json`,
//! the `diagnoses` table's `evidence_json`/`culprits_json` and `deepspan
//! report`'s `"diagnosis"` key). The causes, evidence and culprits are
//! described in docs/analysis.md ("Diagnosis", "Root causes"), the columns
//! in docs/tables.md.

use deepspan_analysis::{Culprit, CulpritKind, Diagnosis};
use serde_json::{Map, Value};

use crate::{span_hex, trace_hex, SpanMeta};

/// A number as JSON: integers as integers (times, bytes, ids), the rest
/// (ratios, means) as floats.
fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15 {
        if v >= 0.0 {
            Value::from(v as u64)
        } else {
            Value::from(v as i64)
        }
    } else {
        serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
    }
}

/// `{"<name>": number, …}`.
pub fn evidence_json(d: &Diagnosis) -> Value {
    let mut m = Map::new();
    for (k, v) in &d.evidence {
        m.insert((*k).to_string(), number(*v));
    }
    Value::Object(m)
}

/// One culprit: only the fields that apply to its kind.
pub fn culprit_json(c: &Culprit, spans: &[SpanMeta]) -> Value {
    let mut m = Map::new();
    m.insert("kind".into(), c.kind.name().into());
    if let Some(t) = c.tid {
        m.insert("tid".into(), t.into());
    }
    if let Some(p) = c.pid {
        m.insert("pid".into(), p.into());
    }
    if let Some(comm) = c.comm {
        m.insert("comm".into(), comm.to_string_lossy().into());
    }
    if let Some(s) = c.span.and_then(|s| spans.get(s as usize)) {
        m.insert("trace_id".into(), trace_hex(s.trace_id).into());
        m.insert("span_id".into(), span_hex(s.span_id).into());
        // A span culprit is named by the service it called, when known.
        let named = match c.kind {
            CulpritKind::Span => c
                .downstream
                .and_then(|d| spans.get(d as usize))
                .unwrap_or(s),
            _ => s,
        };
        m.insert("service".into(), named.service.clone().into());
        m.insert("operation".into(), named.operation.clone().into());
    }
    if let Some(n) = &c.name {
        m.insert("name".into(), n.clone().into());
    }
    m.insert("ns".into(), c.ns.into());
    Value::Object(m)
}

/// The culprits, largest first.
pub fn culprits_json(d: &Diagnosis, spans: &[SpanMeta]) -> Value {
    Value::Array(d.culprits.iter().map(|c| culprit_json(c, spans)).collect())
}

/// The whole object: `cause`, `headline`, `evidence`, `culprits` (the
/// proximate cause) and `root_cause`.
pub fn diagnosis_json(d: &Diagnosis, spans: &[SpanMeta]) -> Value {
    let mut m = Map::new();
    m.insert("cause".into(), d.cause.name().into());
    m.insert("headline".into(), d.headline.clone().into());
    m.insert("evidence".into(), evidence_json(d));
    m.insert("culprits".into(), culprits_json(d, spans));
    m.insert("root_cause".into(), root_cause_json(d, spans));
    Value::Object(m)
}

/// `{"name": number, …}` of a list of named numbers.
fn numbers_json(v: &[(&'static str, f64)]) -> Value {
    let mut m = Map::new();
    for (k, v) in v {
        m.insert((*k).to_string(), number(*v));
    }
    Value::Object(m)
}

/// The root cause (`deepspan.root_cause`): `cause`, `headline`, `chain`
/// (null when the request was not blocked by other requests: then the
/// root cause is the cause, and the other fields are the cause's),
/// `evidence`, `culprits`.
pub fn root_cause_json(d: &Diagnosis, spans: &[SpanMeta]) -> Value {
    let mut m = Map::new();
    match &d.root {
        Some(r) => {
            m.insert("cause".into(), r.cause.name().into());
            m.insert("headline".into(), r.headline.clone().into());
            m.insert("chain".into(), r.chain.clone().into());
            m.insert("evidence".into(), numbers_json(&r.evidence));
            let culprits = r.culprits.iter().map(|c| culprit_json(c, spans)).collect();
            m.insert("culprits".into(), Value::Array(culprits));
        }
        None => {
            m.insert("cause".into(), d.cause.name().into());
            m.insert("headline".into(), d.headline.clone().into());
            m.insert("chain".into(), Value::Null);
            m.insert("evidence".into(), evidence_json(d));
            m.insert("culprits".into(), culprits_json(d, spans));
        }
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepspan_analysis::{Cause, RootCause};
    use deepspan_model::Comm;

    fn meta(span_id: u64, service: &str, operation: &str) -> SpanMeta {
        SpanMeta {
            trace_id: 0xabc,
            span_id,
            service: service.into(),
            operation: operation.into(),
            kind: "server",
            ..SpanMeta::default()
        }
    }

    #[test]
    fn culprits_carry_only_their_kinds_fields() {
        let spans = vec![
            meta(1, "front", "GET /"),
            meta(2, "front", "call media"),
            meta(3, "media", "GET /image"),
        ];
        let culprit = |kind, ns| Culprit {
            kind,
            tid: None,
            pid: None,
            comm: None,
            span: None,
            downstream: None,
            name: None,
            ns,
        };
        let d = Diagnosis {
            cause: Cause::Network,
            headline: "NETWORK 90%: waiting for [media] GET /image".into(),
            evidence: vec![("share", 0.9), ("ns", 900.0)],
            culprits: vec![
                Culprit {
                    span: Some(1),
                    downstream: Some(2),
                    ..culprit(CulpritKind::Span, 900)
                },
                Culprit {
                    tid: Some(7),
                    pid: Some(5),
                    comm: Some(Comm::from_bytes(b"media")),
                    name: Some("recvfrom".into()),
                    ..culprit(CulpritKind::Thread, 50)
                },
                Culprit {
                    span: Some(0),
                    ..culprit(CulpritKind::Request, 10)
                },
            ],
            root: None,
        };
        let v = diagnosis_json(&d, &spans);
        // Not blocked by others: the root cause is the cause itself.
        assert_eq!(v["root_cause"]["cause"], "network");
        assert_eq!(v["root_cause"]["chain"], Value::Null);
        assert_eq!(v["root_cause"]["culprits"], v["culprits"]);
        assert_eq!(v["cause"], "network");
        assert_eq!(v["evidence"], serde_json::json!({"share": 0.9, "ns": 900}));
        // A span culprit is the client span, named by its downstream service.
        assert_eq!(
            v["culprits"][0],
            serde_json::json!({"kind": "span", "trace_id": "00000000000000000000000000000abc",
                "span_id": "0000000000000002", "service": "media", "operation": "GET /image",
                "ns": 900})
        );
        assert_eq!(
            v["culprits"][1],
            serde_json::json!({"kind": "thread", "tid": 7, "pid": 5, "comm": "media",
                "name": "recvfrom", "ns": 50})
        );
        assert_eq!(v["culprits"][2]["operation"], "GET /");
        assert_eq!(v["culprits"][2]["span_id"], "0000000000000001");
    }

    #[test]
    fn a_root_cause_through_other_requests_has_its_chain() {
        let spans = vec![meta(1, "front", "GET /"), meta(2, "pricing", "GET /price")];
        let root = RootCause {
            cause: Cause::CpuThrottled,
            headline: "PREEMPTED 70%: CPU held back".into(),
            evidence: vec![("share", 0.7), ("ns", 70.0), ("depth", 1.0)],
            culprits: vec![Culprit {
                kind: CulpritKind::Request,
                tid: None,
                pid: None,
                comm: None,
                span: Some(1),
                downstream: None,
                name: None,
                ns: 70,
            }],
            chain: "[front] GET / → behind [pricing] GET /price → PREEMPTED (throttled) 100 %"
                .into(),
        };
        let d = Diagnosis {
            cause: Cause::BlockedByRequest,
            headline: "BLOCKED 70%".into(),
            evidence: vec![("share", 0.7), ("ns", 70.0)],
            culprits: Vec::new(),
            root: Some(Box::new(root)),
        };
        let v = diagnosis_json(&d, &spans);
        assert_eq!(v["cause"], "blocked_by_request");
        let r = &v["root_cause"];
        assert_eq!(r["cause"], "cpu_throttled");
        assert_eq!(
            r["chain"],
            "[front] GET / → behind [pricing] GET /price → PREEMPTED (throttled) 100 %"
        );
        assert_eq!(
            r["evidence"],
            serde_json::json!({"share": 0.7, "ns": 70, "depth": 1})
        );
        assert_eq!(r["culprits"][0]["operation"], "GET /price");
    }
}
