//! Oracle from Trace Compass' distributed critical path test
//! (`DistributedCriticalPathTest`): two-host stub traces whose hosts
//! exchange messages (`packet_sent` / `packet_received` with a message id),
//! received in a softirq (the kernel worker) or in a threaded interrupt.
//! Each case's execution graph (workers `<host file>/<tid>`, NETWORK edges
//! from a send to the thread the reception woke) and critical paths must
//! equal the expected ones under Trace Compass' graph equality.

use crate::common;

use deepspan_analysis::{critical_path_of, distributed_graph, KernelModel, StateBuilder};
use serde_json::Value;

fn model_of(stub: &str) -> KernelModel {
    let items = common::stub::read(&common::testdata(&format!(
        "kernel/distributed-stubs/{stub}"
    )));
    let mut b = StateBuilder::new().open_ended();
    common::stub::feed(&mut b, &items);
    b.finish()
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|s| s.as_str().expect("string"))
        .collect()
}

#[test]
fn distributed_execution_graphs_and_critical_paths_match_trace_compass() {
    let doc = common::read_json("kernel/distributed-stubs/expected-graphs.json");
    let cases = doc["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let test = case["test"].as_str().expect("test");
        let traces = strs(&case["traces"]);
        let models: Vec<KernelModel> = traces.iter().map(|t| model_of(t)).collect();
        let graph = distributed_graph(&models.iter().collect::<Vec<_>>());
        // Hosts are numbered in the order the case lists its traces.
        let host_of = |worker: &str| {
            let file = worker.rsplit_once('/').expect("host/tid").0;
            traces
                .iter()
                .position(|t| *t == file)
                .expect("a host of the case") as u32
        };
        assert_eq!(
            graph.workers().len() as u64,
            case["expected_worker_count"].as_u64().expect("count"),
            "{test}: workers\n{}",
            common::describe(&graph)
        );
        common::check_equal_on(&graph, &case["expected_execution_graph"], &host_of)
            .unwrap_or_else(|e| panic!("{test}: {e}\nactual:\n{}", common::describe(&graph)));
        let paths = case["critical_paths"].as_array().expect("critical paths");
        assert!(!paths.is_empty());
        for path in paths {
            let start = path["start_worker"].as_str().expect("start_worker");
            let worker = graph
                .worker_of_on(host_of(start), common::worker_tid(start))
                .unwrap_or_else(|| panic!("{test}: no worker {start}"));
            let head = graph.head(worker).expect("a vertex");
            let actual = critical_path_of(&graph, head, None).graph;
            common::check_equal_on(&actual, &path["expected"], &host_of).unwrap_or_else(|e| {
                panic!(
                    "{test}: critical path of {start}: {e}\nactual:\n{}",
                    common::describe(&actual)
                )
            });
        }
    }
}

#[test]
fn a_host_is_absorbed_once_and_only_from_a_one_host_graph() {
    let client = model_of("simple_network_client.xml");
    let mut joined = deepspan_analysis::Graph::new();
    assert_eq!(joined.absorb(client.graph(), 3), Some(0));
    let rows = joined.workers().len();
    assert!(joined.workers().iter().all(|w| w.host() == 3));
    assert_eq!(joined.absorb(client.graph(), 3), None);
    let mut again = deepspan_analysis::Graph::new();
    assert_eq!(
        again.absorb(&joined, 0),
        None,
        "a graph of host 3 is not a one-host graph"
    );
    assert_eq!(joined.workers().len(), rows);
    // Without the other host, the client's messages stay unlinked.
    let alone = distributed_graph(&[&client]);
    assert_eq!(
        alone
            .vertical_edges()
            .filter(|e| e.kind == deepspan_analysis::EdgeType::Network)
            .count(),
        0
    );
    assert_eq!(client.network_ends().sent.len(), 1);
    assert_eq!(client.network_ends().received.len(), 1);
}
