//! Test support: the graph JSON of `shared/testdata` (load, compare with
//! Trace Compass' `GraphOps.checkEquality` rule) and the Trace Compass XML
//! kernel stub reader.

#![allow(dead_code)]

pub mod requests;
pub mod script;
pub mod stub;

use std::collections::{BTreeSet, HashMap};

use deepspan_analysis::{Direction, EdgeType, Graph, VertexId};
use deepspan_model::Tid;
use serde_json::Value;

pub fn testdata(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata"
    ))
    .join(rel)
}

pub fn read_json(rel: &str) -> Value {
    let path = testdata(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("valid JSON")
}

/// Worker names of the JSON as tids: `"3"` → 3, `"host/12"` → 12.
pub fn worker_tid(name: &str) -> Tid {
    name.rsplit('/')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("worker name {name}"))
}

fn vref(v: &Value) -> (Tid, usize, u64) {
    (
        worker_tid(v["worker"].as_str().expect("worker")),
        v["index"].as_u64().expect("index") as usize,
        v["ts"].as_u64().expect("ts"),
    )
}

fn edge_type(v: &Value) -> EdgeType {
    let name = v["type"].as_str().expect("type");
    EdgeType::from_name(name).unwrap_or_else(|| panic!("edge type {name}"))
}

/// Builds a [`Graph`] from the JSON form.
pub fn load_graph(json: &Value) -> Graph {
    let mut g = Graph::new();
    let mut horizontal: HashMap<(Tid, usize), (EdgeType, Option<String>)> = HashMap::new();
    for e in json["horizontal_edges"]
        .as_array()
        .expect("horizontal_edges")
    {
        let (w, i, _) = vref(&e["from"]);
        horizontal.insert(
            (w, i),
            (
                edge_type(e),
                e.get("link_qualifier")
                    .and_then(Value::as_str)
                    .map(String::from),
            ),
        );
    }
    for w in json["workers"].as_array().expect("workers") {
        let tid = worker_tid(w["worker"].as_str().expect("worker"));
        let worker = g.worker(tid);
        for (i, ts) in w["vertices"]
            .as_array()
            .expect("vertices")
            .iter()
            .enumerate()
        {
            let ts = ts.as_u64().expect("ts");
            let prev = i.checked_sub(1).and_then(|p| horizontal.get(&(tid, p)));
            match prev {
                Some((kind, q)) => g.append(worker, ts, *kind, q.as_deref()),
                None => g.add(worker, ts),
            };
        }
    }
    for e in json["vertical_edges"].as_array().expect("vertical_edges") {
        let (fw, fi, _) = vref(&e["from"]);
        let (tw, ti, _) = vref(&e["to"]);
        let from = VertexId {
            worker: g.worker(fw),
            index: fi as u32,
        };
        let to = VertexId {
            worker: g.worker(tw),
            index: ti as u32,
        };
        let q = e.get("link_qualifier").and_then(Value::as_str);
        assert!(g.link(from, to, edge_type(e), q), "vertical edge {e}");
    }
    g
}

/// What one edge slot holds, as compared by Trace Compass' graph equality.
#[derive(Debug, PartialEq, Eq)]
struct Slot {
    kind: EdgeType,
    duration: u64,
    from: (u32, Tid),
    to: (u32, Tid),
    qualifier: Option<String>,
}

/// A worker of the JSON (`"12"`, `"host/12"`) as (host, tid), the host
/// numbered by `host_of`.
type HostOf<'a> = &'a dyn Fn(&str) -> u32;

fn worker_key(name: &str, host_of: HostOf) -> (u32, Tid) {
    (host_of(name), worker_tid(name))
}

fn actual_slot(g: &Graph, v: VertexId, dir: Direction) -> Option<Slot> {
    let e = g.edge(v, dir)?;
    Some(Slot {
        kind: e.kind,
        duration: g.duration(&e),
        from: (g.host(e.from.worker), g.tid(e.from.worker)),
        to: (g.host(e.to.worker), g.tid(e.to.worker)),
        qualifier: g.qualifier(e.qualifier).map(|s| s.to_string()),
    })
}

fn expected_slot(e: &Value, host_of: HostOf) -> Slot {
    let end = |v: &Value| worker_key(v["worker"].as_str().expect("worker"), host_of);
    Slot {
        kind: edge_type(e),
        duration: e["duration"].as_u64().expect("duration"),
        from: end(&e["from"]),
        to: end(&e["to"]),
        qualifier: e
            .get("link_qualifier")
            .and_then(Value::as_str)
            .map(String::from),
    }
}

/// Trace Compass' `GraphOps.checkEquality`: the same workers; per expected
/// worker the same vertex timestamps; and for each vertex, each of the four
/// edge slots either absent in both or present in both with the same type,
/// duration, end workers and qualifier.
pub fn check_equal(actual: &Graph, expected: &Value) -> Result<(), String> {
    check_equal_on(actual, expected, &|_| 0)
}

/// [`check_equal`] for a graph of several hosts: `host_of` numbers the
/// host of a JSON worker name as the actual graph numbers it.
pub fn check_equal_on(actual: &Graph, expected: &Value, host_of: HostOf) -> Result<(), String> {
    let actual_workers: BTreeSet<(u32, Tid)> = actual
        .workers()
        .iter()
        .map(|w| (w.host(), w.tid()))
        .collect();
    let expected_workers: BTreeSet<(u32, Tid)> = expected["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| worker_key(w["worker"].as_str().expect("worker"), host_of))
        .collect();
    if actual_workers != expected_workers {
        return Err(format!(
            "workers: actual {actual_workers:?}, expected {expected_workers:?}"
        ));
    }
    let mut slots: HashMap<((u32, Tid), usize, u8), Slot> = HashMap::new();
    let end = |v: &Value| {
        let (_, index, _) = vref(v);
        (
            worker_key(v["worker"].as_str().expect("worker"), host_of),
            index,
        )
    };
    for e in expected["horizontal_edges"].as_array().expect("horizontal") {
        let ((fw, fi), (tw, ti)) = (end(&e["from"]), end(&e["to"]));
        slots.insert((fw, fi, 0), expected_slot(e, host_of));
        slots.insert((tw, ti, 1), expected_slot(e, host_of));
    }
    for e in expected["vertical_edges"].as_array().expect("vertical") {
        let ((fw, fi), (tw, ti)) = (end(&e["from"]), end(&e["to"]));
        slots.insert((fw, fi, 2), expected_slot(e, host_of));
        slots.insert((tw, ti, 3), expected_slot(e, host_of));
    }
    for w in expected["workers"].as_array().expect("workers") {
        let key = worker_key(w["worker"].as_str().expect("worker"), host_of);
        let worker = actual.worker_of_on(key.0, key.1).expect("worker present");
        let expected_ts: Vec<u64> = w["vertices"]
            .as_array()
            .expect("vertices")
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        let actual_ts: Vec<u64> = actual.workers()[worker as usize].timestamps().collect();
        if actual_ts != expected_ts {
            return Err(format!(
                "worker {key:?}: vertices {actual_ts:?}, expected {expected_ts:?}"
            ));
        }
        for (i, ts) in expected_ts.iter().enumerate() {
            let v = VertexId {
                worker,
                index: i as u32,
            };
            let dirs = [
                Direction::OutgoingHorizontal,
                Direction::IncomingHorizontal,
                Direction::OutgoingVertical,
                Direction::IncomingVertical,
            ];
            for (slot, dir) in dirs.into_iter().enumerate() {
                let a = actual_slot(actual, v, dir);
                let e = slots.remove(&(key, i, slot as u8));
                if a != e {
                    return Err(format!(
                        "worker {key:?} vertex {i} (ts {ts}) {dir:?}: actual {a:?}, expected {e:?}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A graph printed like the JSON, for failure messages.
pub fn describe(g: &Graph) -> String {
    let mut s = String::new();
    for w in g.workers() {
        s += &format!(
            "W {}/{} {:?}\n",
            w.host(),
            w.tid(),
            w.timestamps().collect::<Vec<_>>()
        );
    }
    for e in g.horizontal_edges().chain(g.vertical_edges()) {
        s += &format!(
            "{} {}/{}:{}({}) -> {}/{}:{}({}) {} {} {:?}\n",
            if e.vertical { "V" } else { "H" },
            g.host(e.from.worker),
            g.tid(e.from.worker),
            e.from.index,
            g.ts(e.from),
            g.host(e.to.worker),
            g.tid(e.to.worker),
            e.to.index,
            g.ts(e.to),
            e.kind,
            g.duration(&e),
            g.qualifier(e.qualifier)
        );
    }
    s
}
