// Shared by the importer targets (included with `include!`, as cargo-fuzz
// builds every target as its own binary).

/// Uses an import the way `deepspan spans critical-path` does, so spans that
/// parse but are inconsistent (cycles, children outside their parents,
/// duplicate ids) reach the analyses too.
fn exercise(import: deepspan_spans::Import) {
    let _ = import.warnings.len();
    let traces = deepspan_spans::group_traces(import.spans);
    for options in [
        deepspan_spans::CriticalPathOptions::default(),
        deepspan_spans::CriticalPathOptions::jaeger_ui(),
    ] {
        let _ = deepspan_spans::critical_path::critical_path_report_with(&traces, options);
    }
}
