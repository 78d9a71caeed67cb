//! Diagnoses as stored: [`DiagnosisDoc`], the JSON object of a request's
//! diagnosis — each request's `diagnosis` in `requests.json`, `deepspan
//! report`'s `"diagnosis"`, and in parts the `diagnoses` table's
//! `evidence_json`, `culprits_json` and `root_*` columns. The writers and
//! the readers share these types, so a field cannot be written and read
//! apart. The causes, evidence and culprits are described in
//! docs/analysis.md ("Diagnosis", "Root causes"), the columns in
//! docs/tables.md.
//!
//! Every object's keys are in alphabetical order, as they have been since
//! the format began (they were written through serde_json's map, which
//! sorts its keys): the structs declare their fields alphabetically and
//! [`Evidence`] is a sorted map. Reading is lenient as for the rest of
//! `requests.json`: what names a cause or a culprit (`cause`, `kind`, `ns`)
//! is required, the rest reads as empty when a file has none (`root_cause`
//! is absent from analyses made before root causes), and unknown keys are
//! ignored.

use std::collections::BTreeMap;
use std::fmt;

use deepspan_analysis::{Cause, Culprit, CulpritKind, Diagnosis, RootCause};
use deepspan_model::container::Container;
use deepspan_model::Tid;
use serde::{Deserialize, Serialize};

use crate::{span_hex, trace_hex, SpanMeta};

/// A request's diagnosis: what its critical path mostly waited for (the
/// proximate cause) and, through the requests it waited for, why (the
/// root cause).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiagnosisDoc {
    /// What the request mostly waited for (`cpu_throttled`, `network`, …).
    #[serde(with = "cause_name")]
    pub cause: Cause,
    /// Who the cause's time is attributed to, largest first.
    #[serde(default)]
    pub culprits: Vec<CulpritDoc>,
    /// The numbers behind the cause (`share`, `ns`, then the cause's own).
    #[serde(default)]
    pub evidence: Evidence,
    /// One line for people, at most 78 characters.
    #[serde(default)]
    pub headline: String,
    /// The root cause; the cause itself (with a null `chain`) when the
    /// request was not blocked by other requests. Absent in analyses made
    /// before root causes (then the cause is the root cause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_cause: Option<RootCauseDoc>,
}

/// What the time a request spent waiting for other requests was spent on,
/// followed through those requests' own paths (`deepspan.root_cause`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RootCauseDoc {
    /// The deepest cause found (`cpu_throttled`, …).
    #[serde(with = "cause_name")]
    pub cause: Cause,
    /// The chain as a person reads it (`[front] GET /product → behind 5 ×
    /// [pricing] GET /price → PREEMPTED (throttled) 98 %`); null when the
    /// request was not blocked by others: then the root cause is the
    /// cause, and the other fields are the cause's.
    #[serde(default)]
    pub chain: Option<String>,
    /// Who the root cause's time is attributed to, largest first.
    #[serde(default)]
    pub culprits: Vec<CulpritDoc>,
    /// `share` (of the request's time) and `ns` of the root cause,
    /// `blocked_ns`, `blocked_share`, `depth`, the cause's own numbers, and
    /// `cycles` / `cycle_ns` when a chain came back on itself.
    #[serde(default)]
    pub evidence: Evidence,
    /// One line for people, at most 78 characters.
    #[serde(default)]
    pub headline: String,
}

/// Something a cause's time is attributed to. Only the fields that apply
/// to its kind are written: a thread has `tid`, `pid`, `comm` and the
/// system call it waited in as `name`; a process `pid` and `comm`; a
/// request its span (`trace_id`, `span_id`, `service`, `operation`); a
/// span the client span the request waited in, named by the service and
/// operation it called; a device its `name`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CulpritDoc {
    /// The thread's or process's command name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// A thread's or process's container: the runtime's id (64 hex
    /// digits) and, where the host gave one, its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// `thread`, `process`, `request`, `span` or `device`.
    #[serde(with = "culprit_kind_name")]
    pub kind: CulpritKind,
    /// Free text: a thread's system call, a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The request's time attributed to this culprit.
    pub ns: u64,
    /// The span's operation (a span culprit's: the downstream one's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<Tid>,
    /// A thread's or process's Kubernetes pod: name, namespace and uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The span's service (a span culprit's: the service it called).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The span's id, 16 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// A thread id; in a run of several hosts, host N > 0's threads carry
    /// N in their high bits (`deepspan_analysis::tid_label` shows them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<Tid>,
    /// The span's trace id, 32 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// Named numbers, by name (docs/analysis.md lists them per cause). Kept
/// sorted by name, the order in which they are written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Evidence(BTreeMap<String, EvidenceValue>);

/// One number of the evidence: written as a JSON integer when it is whole
/// (times, bytes, counts, addresses) and below 2^53, as a float otherwise
/// (ratios, means), as null when it was not a finite number. Read back as
/// it was written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EvidenceValue(Option<serde_json::Number>);

impl DiagnosisDoc {
    /// The stored form of `d`; `spans` name its request and span culprits.
    pub fn new(d: &Diagnosis, spans: &[SpanMeta]) -> DiagnosisDoc {
        DiagnosisDoc {
            cause: d.cause,
            culprits: CulpritDoc::all(&d.culprits, spans),
            evidence: Evidence::from_numbers(&d.evidence),
            headline: d.headline.clone(),
            root_cause: Some(RootCauseDoc::new(d, spans)),
        }
    }

    /// The root cause: the chain's deepest cause, else the cause itself
    /// (also for analyses made before root causes).
    pub fn root_cause(&self) -> Cause {
        self.root_cause.as_ref().map_or(self.cause, |r| r.cause)
    }
}

impl RootCauseDoc {
    /// The root cause of `d`: [`Diagnosis::root`], or the cause itself
    /// with no chain when the request was not blocked by others.
    pub fn new(d: &Diagnosis, spans: &[SpanMeta]) -> RootCauseDoc {
        match d.root.as_deref() {
            Some(RootCause {
                cause,
                headline,
                evidence,
                culprits,
                chain,
            }) => RootCauseDoc {
                cause: *cause,
                chain: Some(chain.clone()),
                culprits: CulpritDoc::all(culprits, spans),
                evidence: Evidence::from_numbers(evidence),
                headline: headline.clone(),
            },
            None => RootCauseDoc {
                cause: d.cause,
                chain: None,
                culprits: CulpritDoc::all(&d.culprits, spans),
                evidence: Evidence::from_numbers(&d.evidence),
                headline: d.headline.clone(),
            },
        }
    }
}

impl CulpritDoc {
    /// One culprit: only the fields that apply to its kind.
    pub fn new(c: &Culprit, spans: &[SpanMeta]) -> CulpritDoc {
        let span = c.span.and_then(|s| spans.get(s as usize));
        // A span culprit is named by the service it called, when known.
        let named = span.map(|s| match c.kind {
            CulpritKind::Span => c
                .downstream
                .and_then(|d| spans.get(d as usize))
                .unwrap_or(s),
            _ => s,
        });
        let container = c.container.as_deref();
        let of_container =
            |field: fn(&Container) -> &Option<String>| container.and_then(|x| field(x).clone());
        CulpritDoc {
            comm: c.comm.map(|comm| comm.to_string_lossy()),
            container_id: of_container(|x| &x.id),
            container_name: of_container(|x| &x.name),
            kind: c.kind,
            name: c.name.clone(),
            ns: c.ns,
            operation: named.map(|s| s.operation.clone()),
            pid: c.pid,
            pod_name: of_container(|x| &x.pod_name),
            pod_namespace: of_container(|x| &x.pod_namespace),
            pod_uid: of_container(|x| &x.pod_uid),
            service: named.map(|s| s.service.clone()),
            span_id: span.map(|s| span_hex(s.span_id)),
            tid: c.tid,
            trace_id: span.map(|s| trace_hex(s.trace_id)),
        }
    }

    /// The culprit's container and pod, when it has one.
    pub fn container(&self) -> Option<Container> {
        let c = Container {
            id: self.container_id.clone(),
            runtime: None,
            name: self.container_name.clone(),
            pod_uid: self.pod_uid.clone(),
            pod_name: self.pod_name.clone(),
            pod_namespace: self.pod_namespace.clone(),
        };
        (c != Container::default()).then_some(c)
    }

    /// Culprits in their order (largest first).
    pub fn all(culprits: &[Culprit], spans: &[SpanMeta]) -> Vec<CulpritDoc> {
        culprits.iter().map(|c| CulpritDoc::new(c, spans)).collect()
    }
}

impl Evidence {
    /// The evidence of named numbers (a name given twice keeps its last
    /// number).
    pub fn from_numbers(numbers: &[(&str, f64)]) -> Evidence {
        Evidence(
            numbers
                .iter()
                .map(|(k, v)| ((*k).to_string(), EvidenceValue::new(*v)))
                .collect(),
        )
    }

    /// The value named `name`.
    pub fn get(&self, name: &str) -> Option<&EvidenceValue> {
        self.0.get(name)
    }

    /// `(name, value)` by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &EvidenceValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Into<String>> FromIterator<(K, EvidenceValue)> for Evidence {
    fn from_iter<I: IntoIterator<Item = (K, EvidenceValue)>>(iter: I) -> Evidence {
        Evidence(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl EvidenceValue {
    /// `v` as it is written: whole numbers below 2^53 as integers, other
    /// finite numbers as floats, the rest as null.
    pub fn new(v: f64) -> EvidenceValue {
        let n = if v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15 {
            Some(if v >= 0.0 {
                serde_json::Number::from(v as u64)
            } else {
                serde_json::Number::from(v as i64)
            })
        } else {
            serde_json::Number::from_f64(v)
        };
        EvidenceValue(n)
    }

    /// The number; None for null.
    pub fn as_f64(&self) -> Option<f64> {
        self.0.as_ref().and_then(serde_json::Number::as_f64)
    }

    /// The number when it was written as an integer (of `i64`'s range).
    pub fn as_i64(&self) -> Option<i64> {
        self.0.as_ref().and_then(serde_json::Number::as_i64)
    }
}

/// As written in JSON: `42`, `0.5`, `null`.
impl fmt::Display for EvidenceValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(n) => n.fmt(f),
            None => f.write_str("null"),
        }
    }
}

/// A [`Cause`] as its contract name ([`Cause::name`]).
mod cause_name {
    use deepspan_analysis::Cause;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(c: &Cause, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Cause, D::Error> {
        let name = String::deserialize(d)?;
        Cause::from_name(&name).ok_or_else(|| {
            let names = Cause::ALL.map(|c| format!("`{}`", c.name()));
            serde::de::Error::custom(format!(
                "unknown cause `{name}`, expected one of {}",
                names.join(", ")
            ))
        })
    }
}

/// A [`CulpritKind`] as its contract name ([`CulpritKind::name`]).
mod culprit_kind_name {
    use deepspan_analysis::CulpritKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(k: &CulpritKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(k.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CulpritKind, D::Error> {
        let name = String::deserialize(d)?;
        CulpritKind::from_name(&name).ok_or_else(|| {
            let names = CulpritKind::ALL.map(|k| format!("`{}`", k.name()));
            serde::de::Error::custom(format!(
                "unknown culprit kind `{name}`, expected one of {}",
                names.join(", ")
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepspan_analysis::{Cause, RootCause};
    use deepspan_model::Comm;
    use serde_json::{json, Map, Value};

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

    fn culprit(kind: CulpritKind, ns: u64) -> Culprit {
        Culprit {
            kind,
            tid: None,
            pid: None,
            comm: None,
            span: None,
            downstream: None,
            name: None,
            container: None,
            ns,
        }
    }

    fn json_of(d: &Diagnosis, spans: &[SpanMeta]) -> Value {
        serde_json::to_value(DiagnosisDoc::new(d, spans)).unwrap()
    }

    #[test]
    fn culprits_carry_only_their_kinds_fields() {
        let spans = vec![
            meta(1, "front", "GET /"),
            meta(2, "front", "call media"),
            meta(3, "media", "GET /image"),
        ];
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
                Culprit {
                    pid: Some(9),
                    comm: Some(Comm::from_bytes(b"cpuhog")),
                    container: Some(std::sync::Arc::new(Container {
                        id: Some("ab".repeat(32)),
                        runtime: Some("podman".into()),
                        name: Some("shop-hog".into()),
                        pod_uid: Some("0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d".into()),
                        pod_name: None,
                        pod_namespace: None,
                    })),
                    ..culprit(CulpritKind::Process, 5)
                },
            ],
            root: None,
        };
        let v = json_of(&d, &spans);
        // Not blocked by others: the root cause is the cause itself.
        assert_eq!(v["root_cause"]["cause"], "network");
        assert_eq!(v["root_cause"]["chain"], Value::Null);
        assert_eq!(v["root_cause"]["culprits"], v["culprits"]);
        assert_eq!(v["cause"], "network");
        assert_eq!(v["evidence"], json!({"share": 0.9, "ns": 900}));
        // A span culprit is the client span, named by its downstream service.
        assert_eq!(
            v["culprits"][0],
            json!({"kind": "span", "trace_id": "00000000000000000000000000000abc",
                "span_id": "0000000000000002", "service": "media", "operation": "GET /image",
                "ns": 900})
        );
        assert_eq!(
            v["culprits"][1],
            json!({"kind": "thread", "tid": 7, "pid": 5, "comm": "media",
                "name": "recvfrom", "ns": 50})
        );
        assert_eq!(v["culprits"][2]["operation"], "GET /");
        assert_eq!(v["culprits"][2]["span_id"], "0000000000000001");
        // A process in a container: its ids and names, not the runtime.
        assert_eq!(
            v["culprits"][3],
            json!({"kind": "process", "pid": 9, "comm": "cpuhog", "ns": 5,
                "container_id": "ab".repeat(32), "container_name": "shop-hog",
                "pod_uid": "0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d"})
        );
        let read: CulpritDoc = serde_json::from_value(v["culprits"][3].clone()).unwrap();
        assert_eq!(
            read.container().map(|c| c.label()).as_deref(),
            Some("container shop-hog, pod 0c2b4e6a")
        );
        assert_eq!(read.container().and_then(|c| c.runtime), None);
        let none: CulpritDoc = serde_json::from_value(v["culprits"][1].clone()).unwrap();
        assert_eq!(none.container(), None);
    }

    #[test]
    fn a_root_cause_through_other_requests_has_its_chain() {
        let spans = vec![meta(1, "front", "GET /"), meta(2, "pricing", "GET /price")];
        let root = RootCause {
            cause: Cause::CpuThrottled,
            headline: "PREEMPTED 70%: CPU held back".into(),
            evidence: vec![("share", 0.7), ("ns", 70.0), ("depth", 1.0)],
            culprits: vec![Culprit {
                span: Some(1),
                ..culprit(CulpritKind::Request, 70)
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
        let v = json_of(&d, &spans);
        assert_eq!(v["cause"], "blocked_by_request");
        let r = &v["root_cause"];
        assert_eq!(r["cause"], "cpu_throttled");
        assert_eq!(
            r["chain"],
            "[front] GET / → behind [pricing] GET /price → PREEMPTED (throttled) 100 %"
        );
        assert_eq!(r["evidence"], json!({"share": 0.7, "ns": 70, "depth": 1}));
        assert_eq!(r["culprits"][0]["operation"], "GET /price");
    }

    /// A diagnosis with a culprit of every kind, every culprit field, a
    /// root cause through a chain, and evidence of every kind of number.
    fn everything() -> (Diagnosis, Vec<SpanMeta>) {
        let spans = vec![
            meta(1, "front", "GET /product"),
            meta(2, "front", "call \"pricing\""),
            meta(3, "pricing", "GET /price"),
        ];
        let all_kinds = |ns: u64| {
            vec![
                Culprit {
                    tid: Some(7),
                    pid: Some(5),
                    comm: Some(Comm::from_bytes(b"pricing")),
                    name: Some("futex".into()),
                    ..culprit(CulpritKind::Thread, ns)
                },
                Culprit {
                    pid: Some(-3),
                    comm: Some(Comm::from_bytes(b"hog\xff")),
                    ..culprit(CulpritKind::Process, ns / 2)
                },
                Culprit {
                    span: Some(2),
                    ..culprit(CulpritKind::Request, ns / 3)
                },
                Culprit {
                    span: Some(1),
                    downstream: Some(2),
                    ..culprit(CulpritKind::Span, ns / 4)
                },
                Culprit {
                    // A host's thread in a run of several (high bits).
                    tid: Some((1 << 24) | 42),
                    name: Some("sda".into()),
                    ..culprit(CulpritKind::Device, 0)
                },
            ]
        };
        let root = RootCause {
            cause: Cause::CpuThrottled,
            headline: "PREEMPTED 70%: CPU held back".into(),
            evidence: vec![
                ("share", 0.7),
                ("ns", 70_000_000.0),
                ("blocked_ns", 100_000_000.0),
                ("blocked_share", 0.25),
                ("depth", 2.0),
                ("cycles", 0.0),
            ],
            culprits: all_kinds(70_000_000),
            chain: "[front] GET /product → behind 5 × [pricing] GET /price → PREEMPTED (throttled) 98 %"
                .into(),
        };
        let d = Diagnosis {
            cause: Cause::BlockedByRequest,
            headline: "BLOCKED 90%: behind [pricing] GET /price".into(),
            evidence: vec![
                ("share", 0.9),
                ("ns", 90_000_000.0),
                ("futex_uaddr", 140_737_488_355_328.0),
                ("negative", -12.0),
                ("mean", 2.5),
                ("huge", 1e16),
                ("nan", f64::NAN),
                ("infinite", f64::INFINITY),
                ("zero", -0.0),
            ],
            culprits: all_kinds(90_000_000),
            root: Some(Box::new(root)),
        };
        (d, spans)
    }

    #[test]
    fn every_culprit_kind_and_a_root_chain_round_trip_byte_for_byte() {
        let (d, spans) = everything();
        let doc = DiagnosisDoc::new(&d, &spans);
        for pretty in [false, true] {
            let write = |doc: &DiagnosisDoc| {
                if pretty {
                    serde_json::to_vec_pretty(doc).unwrap()
                } else {
                    serde_json::to_vec(doc).unwrap()
                }
            };
            let bytes = write(&doc);
            let back: DiagnosisDoc = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, doc);
            assert_eq!(
                String::from_utf8(write(&back)).unwrap(),
                String::from_utf8(bytes).unwrap()
            );
        }
        let kinds: Vec<&str> = doc.culprits.iter().map(|c| c.kind.name()).collect();
        assert_eq!(kinds, ["thread", "process", "request", "span", "device"]);
        let root = doc.root_cause.as_ref().unwrap();
        assert_eq!(root.culprits.len(), 5);
        assert!(root
            .chain
            .as_ref()
            .unwrap()
            .starts_with("[front] GET /product → "));
        assert_eq!(doc.root_cause(), Cause::CpuThrottled);
        // Non-finite numbers are null, read back as no number.
        assert_eq!(doc.evidence.get("nan").unwrap().as_f64(), None);
        assert_eq!(doc.evidence.get("infinite").unwrap().to_string(), "null");
        assert_eq!(doc.evidence.get("ns").unwrap().as_i64(), Some(90_000_000));
        assert_eq!(doc.evidence.get("mean").unwrap().as_i64(), None);
        assert_eq!(doc.evidence.get("huge").unwrap().as_i64(), None);
    }

    /// The object as it was built by hand before these types (commit
    /// a29ffd8's `diagnosis_json`): the types must write it byte for byte.
    fn hand_built(d: &Diagnosis, spans: &[SpanMeta]) -> Value {
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
        fn numbers(v: &[(&'static str, f64)]) -> Value {
            let m: Map<String, Value> = v.iter().map(|(k, v)| ((*k).into(), number(*v))).collect();
            Value::Object(m)
        }
        fn culprit(c: &Culprit, spans: &[SpanMeta]) -> Value {
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
        let culprits =
            |cs: &[Culprit]| Value::Array(cs.iter().map(|c| culprit(c, spans)).collect());
        let root = match &d.root {
            Some(r) => json!({"cause": r.cause.name(), "headline": r.headline, "chain": r.chain,
                "evidence": numbers(&r.evidence), "culprits": culprits(&r.culprits)}),
            None => json!({"cause": d.cause.name(), "headline": d.headline, "chain": null,
                "evidence": numbers(&d.evidence), "culprits": culprits(&d.culprits)}),
        };
        json!({"cause": d.cause.name(), "headline": d.headline,
            "evidence": numbers(&d.evidence), "culprits": culprits(&d.culprits),
            "root_cause": root})
    }

    #[test]
    fn the_types_write_what_was_written_by_hand() {
        let (mut d, spans) = everything();
        for root in [true, false] {
            if !root {
                d.root = None;
            }
            let doc = DiagnosisDoc::new(&d, &spans);
            let old = hand_built(&d, &spans);
            assert_eq!(
                serde_json::to_string(&doc).unwrap(),
                serde_json::to_string(&old).unwrap()
            );
            assert_eq!(
                serde_json::to_string_pretty(&doc).unwrap(),
                serde_json::to_string_pretty(&old).unwrap()
            );
            // Read back, it is served as the untyped value was.
            let text = serde_json::to_string(&old).unwrap();
            let typed: DiagnosisDoc = serde_json::from_str(&text).unwrap();
            let untyped: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                serde_json::to_string(&typed).unwrap(),
                serde_json::to_string(&untyped).unwrap()
            );
            assert_eq!(serde_json::to_value(&typed).unwrap(), untyped);
        }
    }

    #[test]
    fn older_and_newer_diagnoses_read() {
        // Before root causes; a culprit with only what names it; keys a
        // later version may add.
        let d: DiagnosisDoc = serde_json::from_value(json!({
            "cause": "disk", "headline": "DISK", "evidence": {"ns": 5, "share": 0.5},
            "culprits": [{"kind": "process", "ns": 5, "cgroup": "/backup"}],
            "confidence": 0.9
        }))
        .unwrap();
        assert_eq!(d.root_cause, None);
        assert_eq!(d.root_cause(), Cause::Disk);
        assert_eq!(d.culprits[0].kind, CulpritKind::Process);
        assert_eq!(d.culprits[0].pid, None);
        // Written back without what it never had.
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"cause": "disk", "headline": "DISK", "evidence": {"ns": 5, "share": 0.5},
                "culprits": [{"kind": "process", "ns": 5}]})
        );
        // Only the cause: the details read as empty.
        let d: DiagnosisDoc = serde_json::from_value(json!({"cause": "timer"})).unwrap();
        assert!(d.culprits.is_empty() && d.evidence.is_empty() && d.headline.is_empty());
        let r: RootCauseDoc = serde_json::from_value(json!({"cause": "timer"})).unwrap();
        assert_eq!(r.chain, None);
    }

    #[test]
    fn unknown_causes_and_kinds_are_named_in_the_error() {
        let e = serde_json::from_value::<DiagnosisDoc>(json!({"cause": "gremlins"})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown cause `gremlins`, expected one of `cpu_throttled`, "),
            "{e}"
        );
        let e =
            serde_json::from_value::<CulpritDoc>(json!({"kind": "planet", "ns": 1})).unwrap_err();
        assert!(
            e.to_string().contains("unknown culprit kind `planet`"),
            "{e}"
        );
        let e = serde_json::from_value::<CulpritDoc>(json!({"kind": "thread"})).unwrap_err();
        assert!(e.to_string().contains("missing field `ns`"), "{e}");
    }
}
