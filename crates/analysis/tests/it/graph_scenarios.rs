//! Oracle: Trace Compass' hand-built graph scenarios (GraphFactory) and the
//! critical paths its bounded algorithm gives from the head of worker 0
//! (`TmfCriticalPathAlgoBoundedTest`), compared with its graph equality.

use crate::common;

use deepspan_analysis::critical_path_of;

#[test]
fn all_bounded_scenarios_match_trace_compass() {
    let doc = common::read_json("kernel/graph-scenarios.json");
    let scenarios = doc["scenarios"].as_array().expect("scenarios");
    assert_eq!(scenarios.len(), 12);
    let mut failures = Vec::new();
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        let graph = common::load_graph(&s["graph"]);
        let w0 = graph.worker_of(0).expect("worker 0");
        let head = graph.head(w0).expect("head");
        let path = critical_path_of(&graph, head, None);
        assert!(!path.truncated);
        if let Err(e) = common::check_equal(&path.graph, &s["expected_critical_path_bounded"]) {
            failures.push(format!(
                "{name}: {e}\nactual:\n{}",
                common::describe(&path.graph)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn loaded_graphs_round_trip_through_the_comparison() {
    let doc = common::read_json("kernel/graph-scenarios.json");
    for s in doc["scenarios"].as_array().unwrap() {
        let graph = common::load_graph(&s["graph"]);
        common::check_equal(&graph, &s["graph"]).unwrap_or_else(|e| panic!("{}: {e}", s["name"]));
    }
}

#[test]
fn pieces_follow_the_path_through_wakers() {
    // NET1: 0 runs, blocks; the chain 1 → 2 → 3 over the network wakes it.
    let doc = common::read_json("kernel/graph-scenarios.json");
    let s = doc["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "GRAPH_NET1")
        .unwrap();
    let graph = common::load_graph(&s["graph"]);
    let path = critical_path_of(
        &graph,
        graph.head(graph.worker_of(0).unwrap()).unwrap(),
        None,
    );
    let got: Vec<(u64, u64, i32, &str)> = path
        .pieces
        .iter()
        .map(|p| (p.start, p.end, p.tid, p.state.name()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 1, 0, "RUNNING"),
            (1, 3, 1, "UNKNOWN"),
            (3, 4, 1, "RUNNING"),
            (4, 7, 2, "NETWORK"),
            (7, 8, 2, "RUNNING"),
            (8, 10, 3, "NETWORK"),
            (10, 11, 3, "RUNNING"),
            (11, 12, 0, "RUNNING"),
        ]
    );
    // No time lost or counted twice.
    for w in path.pieces.windows(2) {
        assert_eq!(w[0].end, w[1].start);
    }
}

#[test]
fn the_comparison_sees_differences() {
    // Where the factory's graph and its critical path differ, comparing the
    // graph itself with the expected path must fail.
    let doc = common::read_json("kernel/graph-scenarios.json");
    let mut differing = 0;
    for s in doc["scenarios"].as_array().unwrap() {
        let graph = common::load_graph(&s["graph"]);
        if s["graph"] != s["expected_critical_path_bounded"] {
            differing += 1;
            assert!(
                common::check_equal(&graph, &s["expected_critical_path_bounded"]).is_err(),
                "{}",
                s["name"]
            );
        }
    }
    assert!(differing >= 8);
}
