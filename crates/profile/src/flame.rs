//! The stacks of [`crate::add_request`] merged into a tree for a flame
//! graph: one node per distinct frame under its parent, its wall time the
//! sum of the stacks through it, and how much of that was on the CPU, so a
//! viewer can tell on-CPU code from off-CPU waits.

use std::collections::HashMap;

use serde::Serialize;

use crate::attribute::{StackSink, StackValue};
use crate::symbols::Frame;

/// One frame of the flame graph, with everything above it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FlameNode {
    pub name: String,
    /// Where the function came from (an ELF path, `[kernel]`, a perf map);
    /// empty for deepspan's own frames (request, thread, `[off-CPU: …]`).
    pub module: String,
    /// True when all of the node's time was on the CPU (code frames,
    /// `[on-CPU]`); false for off-CPU frames and for frames holding both
    /// (the request, its threads): `on_cpu_ns` tells those apart.
    pub on_cpu: bool,
    /// Wall time of the stacks through this node.
    pub value_ns: u64,
    /// The part of `value_ns` on the CPU.
    pub on_cpu_ns: u64,
    /// CPU samples through this node.
    pub samples: u64,
    /// Largest first (then by name), so the order does not depend on the
    /// order the stacks came in.
    pub children: Vec<FlameNode>,
}

/// Builds a flame tree one stack at a time ([`StackSink`]).
#[derive(Default)]
pub struct FlameTree {
    /// Node 0 is the root, above every stack's first frame.
    nodes: Vec<Building>,
    /// (parent, frame) → child.
    index: HashMap<(usize, Frame), usize>,
}

struct Building {
    frame: Frame,
    value_ns: u64,
    on_cpu_ns: u64,
    samples: u64,
    children: Vec<usize>,
}

impl FlameTree {
    pub fn new() -> FlameTree {
        FlameTree {
            nodes: vec![Building {
                frame: Frame {
                    function: "all".into(),
                    module: String::new(),
                },
                value_ns: 0,
                on_cpu_ns: 0,
                samples: 0,
                children: Vec::new(),
            }],
            index: HashMap::new(),
        }
    }

    /// The tree, its root named `all` above the stacks' first frames.
    pub fn finish(self) -> FlameNode {
        self.node(0)
    }

    fn node(&self, i: usize) -> FlameNode {
        let b = &self.nodes[i];
        let mut children: Vec<FlameNode> = b.children.iter().map(|&c| self.node(c)).collect();
        children.sort_by(|x, y| {
            y.value_ns
                .cmp(&x.value_ns)
                .then_with(|| x.name.cmp(&y.name))
        });
        FlameNode {
            name: b.frame.function.clone(),
            module: b.frame.module.clone(),
            on_cpu: b.value_ns > 0 && b.on_cpu_ns == b.value_ns,
            value_ns: b.value_ns,
            on_cpu_ns: b.on_cpu_ns,
            samples: b.samples,
            children,
        }
    }

    fn count(&mut self, i: usize, value: &StackValue) {
        let n = &mut self.nodes[i];
        n.value_ns += value.wall_ns;
        n.samples += value.samples;
        if value.off_cpu_state.is_none() {
            n.on_cpu_ns += value.wall_ns;
        }
    }
}

impl StackSink for FlameTree {
    fn add_stack(&mut self, root_first: &[Frame], value: StackValue) {
        let mut at = 0;
        self.count(at, &value);
        for frame in root_first {
            let key = (at, frame.clone());
            at = match self.index.get(&key) {
                Some(&child) => child,
                None => {
                    let child = self.nodes.len();
                    self.nodes.push(Building {
                        frame: frame.clone(),
                        value_ns: 0,
                        on_cpu_ns: 0,
                        samples: 0,
                        children: Vec::new(),
                    });
                    self.nodes[at].children.push(child);
                    self.index.insert(key, child);
                    child
                }
            };
            self.count(at, &value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::{add_request, PathPiece, SampleIndex};
    use crate::samples::{Sample, PERF_CONTEXT_USER};
    use crate::symbols::Symbols;

    fn find<'a>(node: &'a FlameNode, name: &str) -> Option<&'a FlameNode> {
        if node.name == name {
            return Some(node);
        }
        node.children.iter().find_map(|c| find(c, name))
    }

    /// Every node's time is the sum of its children's plus what ends there.
    fn check_sums(node: &FlameNode) {
        let children: u64 = node.children.iter().map(|c| c.value_ns).sum();
        assert!(
            children <= node.value_ns,
            "{}: children {children} > {}",
            node.name,
            node.value_ns
        );
        let on: u64 = node.children.iter().map(|c| c.on_cpu_ns).sum();
        assert!(on <= node.on_cpu_ns, "{}", node.name);
        node.children.iter().for_each(check_sums);
    }

    #[test]
    fn tree_of_a_request_adds_up_to_its_path_with_on_and_off_cpu_marked() {
        let dir = tempfile::tempdir().unwrap();
        let mut symbols = Symbols::open(dir.path());
        // Two user frames each; the leaf differs between the samples.
        let sample = |t: u64, leaf: u64| Sample {
            time_ns: t,
            pid: 1,
            tid: 5,
            cpu: 0,
            callchain: vec![PERF_CONTEXT_USER, leaf, 0x1000],
        };
        let index = SampleIndex::new(vec![
            sample(100, 0x2000),
            sample(150, 0x2000),
            sample(600, 0x3000),
        ]);
        let piece = |start, end, state: &str| PathPiece {
            start_ns: start,
            end_ns: end,
            state: state.into(),
            tid: Some(5),
            comm: Some("w".into()),
            ..PathPiece::default()
        };
        let path = vec![
            piece(0, 200, "RUNNING"),
            PathPiece {
                syscall: Some("read".into()),
                ..piece(200, 500, "BLOCK_DEVICE")
            },
            piece(500, 700, "RUNNING"),
            PathPiece {
                blocked_by_request: Some("[db] SELECT".into()),
                ..piece(700, 1000, "BLOCKED")
            },
        ];
        let mut tree = FlameTree::new();
        let totals = add_request(&mut tree, "[svc] GET /x", &path, &index, &mut symbols);
        let all = tree.finish();
        check_sums(&all);

        // The whole path, once at the root and once at the request.
        assert_eq!(all.value_ns, 1000);
        assert_eq!(all.children.len(), 1);
        let request = &all.children[0];
        assert_eq!(request.name, "[svc] GET /x");
        assert_eq!(request.value_ns, 1000);
        assert_eq!(request.on_cpu_ns, totals.on_cpu_ns);
        assert_eq!(request.on_cpu_ns, 400);
        assert_eq!(request.samples, 3);
        assert!(!request.on_cpu, "the request holds off-CPU time too");

        let thread = find(&all, "w/5").unwrap();
        assert_eq!((thread.value_ns, thread.on_cpu_ns), (1000, 400));

        let on = find(&all, "[on-CPU]").unwrap();
        assert!(on.on_cpu);
        assert_eq!((on.value_ns, on.samples), (400, 3));
        // The shared caller merged into one node over both leaves, largest first.
        assert_eq!(on.children.len(), 1);
        let caller = &on.children[0];
        assert!(caller.on_cpu);
        assert_eq!(caller.value_ns, 400);
        let leaves: Vec<(u64, u64)> = caller
            .children
            .iter()
            .map(|c| (c.value_ns, c.samples))
            .collect();
        assert_eq!(leaves, vec![(267, 2), (133, 1)]);

        let disk = find(&all, "[off-CPU: BLOCK_DEVICE]").unwrap();
        assert!(!disk.on_cpu);
        assert_eq!((disk.value_ns, disk.on_cpu_ns, disk.samples), (300, 0, 0));
        assert_eq!(disk.children[0].name, "syscall: read");
        let blocked = find(&all, "[off-CPU: blocked by request [db] SELECT: BLOCKED]").unwrap();
        assert_eq!((blocked.value_ns, blocked.on_cpu), (300, false));
    }

    #[test]
    fn stacks_merge_by_frame_and_module() {
        let mut tree = FlameTree::new();
        let f = |name: &str, module: &str| Frame {
            function: name.into(),
            module: module.into(),
        };
        let on = |ns| StackValue {
            samples: 1,
            wall_ns: ns,
            off_cpu_state: None,
        };
        tree.add_stack(&[f("a", ""), f("b", "x.so")], on(10));
        tree.add_stack(&[f("a", ""), f("b", "y.so")], on(30));
        tree.add_stack(&[f("a", ""), f("b", "x.so")], on(5));
        tree.add_stack(
            &[f("a", ""), f("[off-CPU: TIMER]", "")],
            StackValue {
                samples: 0,
                wall_ns: 7,
                off_cpu_state: Some("TIMER"),
            },
        );
        let all = tree.finish();
        let a = &all.children[0];
        assert_eq!((a.value_ns, a.on_cpu_ns, a.samples), (52, 45, 3));
        let children: Vec<(&str, &str, u64, bool)> = a
            .children
            .iter()
            .map(|c| (c.name.as_str(), c.module.as_str(), c.value_ns, c.on_cpu))
            .collect();
        assert_eq!(
            children,
            vec![
                ("b", "y.so", 30, true),
                ("b", "x.so", 15, true),
                ("[off-CPU: TIMER]", "", 7, false)
            ]
        );
        let json = serde_json::to_value(&all).unwrap();
        assert_eq!(json["children"][0]["children"][2]["on_cpu"], false);
        assert_eq!(json["children"][0]["value_ns"], 52);
    }
}
