//! The comparison of a run's diagnoses with what its scenario expected.
//!
//! The *target* requests are those of the expected service (and operation)
//! that overlap the fault window. With diagnoses (`deepspan analyze` fills
//! `diagnosis` and `anomalous` per request), the found cause is the one
//! behind most of the anomalous targets' excess time (duration over their
//! operation's baseline): a fault that slows a few requests by a second
//! outweighs the load's CPU contention that slows more of them by
//! milliseconds, as it does for the engineer reading the diagnoses. A
//! target that waited for another request, and whose wait leads to the
//! expected root cause, counts with that cause: a server that queued a
//! request behind one the fault slowed shows the fault, not the queue.
//! Any other target counts with its own cause (the row lock's waits stay
//! `blocked_by_request`, whatever the holder did). Every expected culprit
//! must match a culprit of one of the targets whose own cause is the
//! expected one.
//!
//! Independently, the *path check* looks at the kernel critical path
//! itself (the `causes` of each request, which exist without diagnoses):
//! the slow targets (more than twice their operation's median and 1 ms
//! over it) holding at least half of their time over the median must have
//! the expected state or blocking request on top.
//!
//! Where the fault is *felt* (`felt` in expected.json: the user-facing
//! service, usually `front`, several hops from the fault), the *root
//! cause* verdict looks at those requests in the fault window: the root
//! cause (the diagnosis's `root_cause`, through the requests they waited
//! for) behind most of the anomalous ones' excess time must be the
//! expected one; how many of them have it, by root and by proximate cause,
//! is reported too.

use std::collections::HashMap;

use deepspan_store::json::{Cause, CulpritDoc, DiagnosisDoc, RequestEntry, RequestsDoc};
use serde::{Deserialize, Serialize};

/// `demo/expected.json`, written by the scenario's driver.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Expected {
    pub scenario: String,
    #[serde(default)]
    pub description: String,
    /// The expected diagnosis cause (contract names: `cpu_throttled`, …).
    pub cause: String,
    pub target: Target,
    /// CLOCK_MONOTONIC ns while the fault was active.
    pub window_ns: [u64; 2],
    /// Each must match (all its fields equal) a culprit of the diagnosis.
    pub culprits: Vec<CulpritMatcher>,
    /// What the kernel critical path of the slow targets must show.
    pub path: PathExpectation,
    /// Where the fault is felt besides its target: the user-facing
    /// requests and the root cause expected on them (through the requests
    /// they waited for). Absent in older expected.json files.
    #[serde(default)]
    pub felt: Option<Felt>,
}

/// The user-facing requests a fault reaches and their expected root cause.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Felt {
    pub service: String,
    #[serde(default)]
    pub operation: Option<String>,
    /// Contract name (`cpu_throttled`, …).
    pub root_cause: String,
}

/// The root-cause verdict on the requests where the fault is felt.
#[derive(Clone, Debug, Serialize)]
pub struct RootVerdict {
    /// `[front]` (or `[front] GET /product`).
    pub requests_of: String,
    pub expected_root_cause: String,
    /// The root cause behind most of the anomalous requests' excess time
    /// (as `found_cause` is found).
    pub found_root_cause: Option<String>,
    /// Requests in the fault window, the anomalous ones, and of those how
    /// many have the expected root cause and the expected proximate cause.
    pub requests: usize,
    pub anomalous: usize,
    pub root_matching: usize,
    pub proximate_matching: usize,
    /// `root_matching / anomalous`.
    pub root_share: f64,
    /// Share of the anomalous requests' excess time whose root cause is
    /// the expected one.
    pub root_excess_share: f64,
    /// A chain that led there (the slowest request's), when one did.
    pub chain: Option<String>,
    pub ok: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Target {
    pub service: String,
    pub operation: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PathExpectation {
    /// Path state of the request's top cause (PREEMPTED, NETWORK, …).
    pub state: Option<String>,
    /// For PREEMPTED: whether held back (throttled) rather than out-competed.
    pub throttled: Option<bool>,
    /// The top cause is time blocked by this request (span id).
    pub blocked_by_request: Option<String>,
}

/// One scenario's outcome (the `scenarios` entries of `--format json`).
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub name: String,
    pub expected_cause: String,
    /// None when nothing was diagnosed (see `problems`).
    pub found_cause: Option<String>,
    /// The slowest target requests (anomalous ones when diagnosed).
    pub top_requests: Vec<TopRequest>,
    pub ok: bool,
    /// Whether requests.json had diagnoses at all.
    pub diagnosis_available: bool,
    /// Target requests in the fault window, and how many were anomalous.
    pub targets: usize,
    pub anomalous: usize,
    pub expected_culprits: Vec<CulpritMatcher>,
    pub culprits_found: bool,
    pub path_check: PathCheck,
    /// The root causes where the fault is felt (when expected.json says
    /// where).
    pub root: Option<RootVerdict>,
    /// Why the scenario is not ok, in words.
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopRequest {
    pub trace_id: String,
    pub span_id: String,
    pub service: String,
    pub operation: String,
    pub duration_ns: u64,
    pub anomalous: Option<bool>,
    pub cause: Option<String>,
    pub headline: Option<String>,
    /// The first three.
    pub culprits: Vec<CulpritDoc>,
    /// The root cause, and its chain when the request was blocked by
    /// others.
    pub root_cause: Option<String>,
    pub root_chain: Option<String>,
    /// The top entry of the request's kernel-path summary, e.g.
    /// `[1301/pricing] PREEMPTED (throttled)` and its share.
    pub path_top: Option<String>,
    pub path_top_share: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PathCheck {
    pub ok: bool,
    /// Slow target requests, and how many show the expected path.
    pub slow: usize,
    pub matching: usize,
    pub detail: String,
}

struct Req<'a> {
    entry: &'a RequestEntry,
    service: &'a str,
    operation: &'a str,
    start: u64,
    end: u64,
    duration: u64,
}

impl<'a> Req<'a> {
    fn new(entry: &'a RequestEntry) -> Req<'a> {
        Req {
            entry,
            service: &entry.service,
            operation: &entry.operation,
            start: entry.start_ns,
            end: entry.end_ns,
            duration: entry.duration_ns,
        }
    }

    fn diagnosis(&self) -> Option<&'a DiagnosisDoc> {
        self.entry.diagnosis.as_ref()
    }

    fn cause(&self) -> Option<&'a str> {
        Some(self.diagnosis()?.cause.name())
    }

    /// The root cause; the cause itself in analyses made before root
    /// causes.
    fn root_cause(&self) -> Option<&'a str> {
        Some(self.diagnosis()?.root_cause().name())
    }

    /// The cause a target is judged by: its own, but for a wait on another
    /// request that leads to the `expected` root cause, that one (see the
    /// module doc).
    fn judged_cause(&self, expected: &'a str) -> Option<&'a str> {
        match self.cause()? {
            "blocked_by_request" if self.root_cause() == Some(expected) => Some(expected),
            own => Some(own),
        }
    }

    fn root_chain(&self) -> Option<&'a str> {
        self.diagnosis()?.root_cause.as_ref()?.chain.as_deref()
    }

    fn excess(&self) -> u64 {
        let baseline = self.entry.baseline_ns.unwrap_or(0);
        self.duration.saturating_sub(baseline)
    }

    fn top_path_cause(&self) -> Option<&'a Cause> {
        self.entry.causes.first()
    }
}

/// Compares a run's `analysis/requests.json` with `expected`.
pub fn check(expected: &Expected, requests: &RequestsDoc) -> Verdict {
    let all: Vec<Req> = requests.requests.iter().map(Req::new).collect();
    let diagnosis_available = all.iter().any(|r| r.diagnosis().is_some());
    let [w0, w1] = expected.window_ns;
    let t = &expected.target;
    let targets: Vec<&Req> = all
        .iter()
        .filter(|r| r.service == t.service && t.operation.iter().all(|op| r.operation == op))
        .filter(|r| r.start < w1 && r.end > w0)
        .collect();

    let mut problems = Vec::new();
    if targets.is_empty() {
        problems.push(format!(
            "no {} request overlaps the fault window",
            target_label(t)
        ));
    }
    let anomalous: Vec<&Req> = targets
        .iter()
        .copied()
        .filter(|r| r.entry.anomalous)
        .collect();
    let mut found_cause = None;
    let mut culprits_found = false;
    if !diagnosis_available {
        problems.push("no request has a diagnosis in requests.json".into());
    } else if anomalous.is_empty() && !targets.is_empty() {
        problems.push(format!(
            "none of the {} {} requests in the fault window is anomalous",
            targets.len(),
            target_label(t)
        ));
    } else {
        found_cause = dominant(&anomalous, |r| r.judged_cause(&expected.cause));
        let with_cause: Vec<&&Req> = anomalous
            .iter()
            .filter(|r| r.cause() == Some(expected.cause.as_str()))
            .collect();
        let missing: Vec<String> = expected
            .culprits
            .iter()
            .filter(|m| {
                !with_cause.iter().any(|r| {
                    r.diagnosis()
                        .is_some_and(|d| d.culprits.iter().any(|c| m.matches(c)))
                })
            })
            .map(CulpritMatcher::to_string)
            .collect();
        culprits_found = missing.is_empty();
        if found_cause.as_deref() != Some(expected.cause.as_str()) {
            problems.push(format!(
                "expected cause {}, found {}",
                expected.cause,
                found_cause.as_deref().unwrap_or("none")
            ));
        }
        if !missing.is_empty() {
            problems.push(format!("culprits not named: {}", missing.join(", ")));
        }
    }

    let path_check = path_check(expected, &all, &targets);
    let root = expected
        .felt
        .as_ref()
        .filter(|_| diagnosis_available)
        .map(|f| root_verdict(expected, f, &all));
    if let Some(r) = &root {
        if !r.ok {
            problems.push(format!(
                "expected root cause {} on {} requests, found {} ({} of {} anomalous)",
                r.expected_root_cause,
                r.requests_of,
                r.found_root_cause.as_deref().unwrap_or("none"),
                r.root_matching,
                r.anomalous
            ));
        }
    }
    let ok = diagnosis_available
        && found_cause.as_deref() == Some(expected.cause.as_str())
        && culprits_found
        && root.as_ref().is_none_or(|r| r.ok);

    let mut shown: Vec<&Req> = if diagnosis_available {
        anomalous.clone()
    } else {
        slow(&all, &targets)
    };
    shown.sort_by_key(|r| std::cmp::Reverse(r.duration));
    let top_requests = shown.iter().take(3).map(|r| top_request(r)).collect();
    Verdict {
        name: expected.scenario.clone(),
        expected_cause: expected.cause.clone(),
        found_cause,
        top_requests,
        ok,
        diagnosis_available,
        targets: targets.len(),
        anomalous: anomalous.len(),
        expected_culprits: expected.culprits.clone(),
        culprits_found,
        path_check,
        root,
        problems,
    }
}

/// The root causes of the requests where the fault is felt (`felt`) over
/// the fault window: ok when the expected one is behind most of the
/// anomalous ones' excess time (the load's many small outliers weigh
/// less than the fault's long waits, as for the found cause).
fn root_verdict(expected: &Expected, felt: &Felt, all: &[Req]) -> RootVerdict {
    let [w0, w1] = expected.window_ns;
    let target = Target {
        service: felt.service.clone(),
        operation: felt.operation.clone(),
    };
    let requests: Vec<&Req> = all
        .iter()
        .filter(|r| r.service == felt.service && felt.operation.iter().all(|op| r.operation == op))
        .filter(|r| r.start < w1 && r.end > w0)
        .collect();
    let mut anomalous: Vec<&Req> = requests
        .iter()
        .copied()
        .filter(|r| r.entry.anomalous)
        .collect();
    anomalous.sort_by_key(|r| std::cmp::Reverse(r.duration));
    let want = felt.root_cause.as_str();
    let root_matching = anomalous
        .iter()
        .filter(|r| r.root_cause() == Some(want))
        .count();
    let proximate_matching = anomalous.iter().filter(|r| r.cause() == Some(want)).count();
    let excess: u64 = anomalous.iter().map(|r| r.excess()).sum();
    let excess_matching: u64 = anomalous
        .iter()
        .filter(|r| r.root_cause() == Some(want))
        .map(|r| r.excess())
        .sum();
    let found_root_cause = dominant(&anomalous, |r| r.root_cause());
    let chain = anomalous
        .iter()
        .filter(|r| r.root_cause() == Some(want))
        .find_map(|r| r.root_chain())
        .map(str::to_string);
    RootVerdict {
        requests_of: target_label(&target),
        expected_root_cause: felt.root_cause.clone(),
        // Where no request was anomalous the fault was not felt (the
        // host's load hid a mild slowdown in the baseline): nothing to
        // explain, and no wrong explanation either.
        ok: anomalous.is_empty() || found_root_cause.as_deref() == Some(want),
        found_root_cause,
        requests: requests.len(),
        anomalous: anomalous.len(),
        root_matching,
        proximate_matching,
        root_share: root_matching as f64 / anomalous.len().max(1) as f64,
        root_excess_share: excess_matching as f64 / excess.max(1) as f64,
        chain,
    }
}

fn target_label(t: &Target) -> String {
    match &t.operation {
        Some(op) => format!("[{}] {op}", t.service),
        None => format!("[{}]", t.service),
    }
}

/// The cause, as `cause` gives it for each request, with the most excess
/// time (duration over the request's baseline, the whole duration without
/// one); ties go to the cause of more requests, then by name.
fn dominant<'a>(reqs: &[&Req<'a>], cause: impl Fn(&Req<'a>) -> Option<&'a str>) -> Option<String> {
    let mut by: HashMap<&str, (u64, usize)> = HashMap::new();
    for r in reqs {
        if let Some(c) = cause(r) {
            let e = by.entry(c).or_default();
            e.0 += r.excess();
            e.1 += 1;
        }
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v.first().map(|(c, _)| c.to_string())
}

/// A culprit as expected.json describes it: some of the fields of a
/// [`CulpritDoc`], named as requests.json names them; a culprit matches
/// when every field given is equal. A field requests.json does not have is
/// an error when expected.json is read, not a culprit that never matches.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CulpritMatcher {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
}

impl CulpritMatcher {
    /// True when every field given equals the culprit's.
    pub fn matches(&self, culprit: &CulpritDoc) -> bool {
        fn same<T: PartialEq>(want: &Option<T>, got: Option<&T>) -> bool {
            want.as_ref().is_none_or(|w| got == Some(w))
        }
        same(&self.kind, Some(&culprit.kind.name().to_string()))
            && same(&self.comm, culprit.comm.as_ref())
            && same(&self.pid, culprit.pid.as_ref())
            && same(&self.tid, culprit.tid.as_ref())
            && same(&self.name, culprit.name.as_ref())
            && same(&self.service, culprit.service.as_ref())
            && same(&self.operation, culprit.operation.as_ref())
            && same(&self.span_id, culprit.span_id.as_ref())
            && same(&self.trace_id, culprit.trace_id.as_ref())
            && same(&self.ns, Some(&culprit.ns))
            && same(&self.container_id, culprit.container_id.as_ref())
            && same(&self.container_name, culprit.container_name.as_ref())
    }
}

impl std::fmt::Display for CulpritMatcher {
    /// As expected.json writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| std::fmt::Error)?)
    }
}

/// Targets more than twice their operation's median and 1 ms over it.
fn slow<'a>(all: &[Req<'a>], targets: &[&'a Req<'a>]) -> Vec<&'a Req<'a>> {
    slow_with_excess(all, targets)
        .into_iter()
        .map(|(r, _)| r)
        .collect()
}

/// [`slow`], each with its time over its operation's median.
fn slow_with_excess<'a>(all: &[Req<'a>], targets: &[&'a Req<'a>]) -> Vec<(&'a Req<'a>, u64)> {
    let mut by_op: HashMap<(&str, &str), Vec<u64>> = HashMap::new();
    for r in all {
        by_op
            .entry((r.service, r.operation))
            .or_default()
            .push(r.duration);
    }
    let medians: HashMap<(&str, &str), u64> = by_op
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_unstable();
            (k, v[(v.len() - 1) / 2])
        })
        .collect();
    targets
        .iter()
        .copied()
        .filter_map(|r| {
            let m = medians[&(r.service, r.operation)];
            (r.duration > m.saturating_mul(2) && r.duration > m + 1_000_000)
                .then(|| (r, r.duration - m))
        })
        .collect()
}

fn path_check(expected: &Expected, all: &[Req], targets: &[&Req]) -> PathCheck {
    let slow = slow_with_excess(all, targets);
    let p = &expected.path;
    let shows = |r: &Req| -> bool {
        let Some(c) = r.top_path_cause() else {
            return false;
        };
        if let Some(id) = &p.blocked_by_request {
            if c.blocked_by_request.as_ref() != Some(id) {
                return false;
            }
        }
        if let Some(state) = &p.state {
            if c.state != state.as_str() {
                return false;
            }
        }
        match p.throttled {
            Some(true) => c.throttled_ns > c.contended_ns,
            Some(false) => c.contended_ns >= c.throttled_ns,
            None => true,
        }
    };
    let matching = slow.iter().filter(|(r, _)| shows(r)).count();
    let excess: u64 = slow.iter().map(|(_, e)| e).sum();
    let excess_shown: u64 = slow.iter().filter(|(r, _)| shows(r)).map(|(_, e)| e).sum();
    let share = excess_shown as f64 / excess.max(1) as f64;
    let what = match (&p.state, p.throttled, &p.blocked_by_request) {
        (_, _, Some(id)) => format!("blocked by {id}"),
        (Some(s), Some(true), _) => format!("{s} (throttled)"),
        (Some(s), Some(false), _) => format!("{s} (other threads ran)"),
        (Some(s), None, _) => s.clone(),
        (None, _, None) => "anything".into(),
    };
    // Weighed by time, as the found cause is: the fault's few long waits
    // against the load's many short outliers.
    let ok = !slow.is_empty() && excess_shown * 2 >= excess;
    PathCheck {
        ok,
        slow: slow.len(),
        matching,
        detail: format!(
            "{what} in {matching} of {} slow requests, {:.0} % of their excess time",
            slow.len(),
            share * 100.0
        ),
    }
}

fn top_request(r: &Req) -> TopRequest {
    let d = r.diagnosis();
    let c = r.top_path_cause();
    TopRequest {
        trace_id: r.entry.trace_id.clone(),
        span_id: r.entry.span_id.clone(),
        service: r.service.to_string(),
        operation: r.operation.to_string(),
        duration_ns: r.duration,
        anomalous: Some(r.entry.anomalous),
        cause: r.cause().map(str::to_string),
        headline: d.map(|d| d.headline.clone()),
        culprits: d
            .map(|d| d.culprits.iter().take(3).cloned().collect())
            .unwrap_or_default(),
        root_cause: r.root_cause().map(str::to_string),
        root_chain: r.root_chain().map(str::to_string),
        path_top: c.map(|c| c.label.clone()),
        path_top_share: c.map(|c| c.share),
    }
}

#[cfg(test)]
mod tests;
