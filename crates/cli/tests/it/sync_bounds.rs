//! `deepspan sync`'s bounds and its Trace Compass estimator on the corpus'
//! `synctraces`: two real machines (LTTng 2.1 kernel traces, scp between
//! them), whose expected.json holds Trace Compass's transform of scp_src
//! onto scp_dest and babeltrace2's first and last event times.

use crate::common::{check, deepspan, read_json, testdata};
use serde_json::Value as J;

/// Trace Compass's line as expected.json gives it (decimal strings):
/// `t ↦ t + shift(t)`, the shift computed from the digits so that times
/// near the Unix epoch keep their ns.
struct TraceCompassLine {
    slope_minus_one: f64,
    offset_ns: f64,
}

impl TraceCompassLine {
    fn from_expected(transform: &J) -> TraceCompassLine {
        let slope = transform["slope"]
            .as_str()
            .expect("slope as a decimal string");
        let (units, digits) = slope.split_once('.').expect("a decimal point");
        let scale = 10i128.pow(digits.len() as u32);
        let units: i128 = units.parse().unwrap();
        let digits: i128 = digits.parse().unwrap();
        TraceCompassLine {
            slope_minus_one: ((units - 1) * scale + digits) as f64 / scale as f64,
            offset_ns: transform["offset_ns"].as_str().unwrap().parse().unwrap(),
        }
    }

    fn shift(&self, t: u64) -> f64 {
        self.slope_minus_one * t as f64 + self.offset_ns
    }
}

/// The shift `deepspan sync` maps time `t` of `host` by (its JSON slope
/// and offset: t ↦ t + shift).
fn shift(host: &J, t: u64) -> f64 {
    (host["slope"].as_f64().unwrap() - 1.0) * t as f64 + host["offset_ns"].as_f64().unwrap()
}

/// `deepspan sync scp_dest scp_src --estimator E --format json`: scp_src's
/// host.
fn sync_src(estimator: &str) -> J {
    let dir = testdata("kernel/ctf/synctraces");
    let out = check(
        "deepspan sync of synctraces",
        deepspan()
            .arg("sync")
            .arg(dir.join("scp_dest"))
            .arg(dir.join("scp_src"))
            .args(["--estimator", estimator, "--format", "json"])
            .output()
            .unwrap(),
    );
    let doc: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["estimator"], estimator);
    assert_eq!(doc["reference"], doc["hosts"][0]["host"], "scp_dest's host");
    doc["hosts"][1].clone()
}

#[test]
fn synctraces_bisector_is_trace_compass_and_the_bounds_contain_it() {
    let expected = read_json(&testdata("kernel/ctf/synctraces/expected.json"));
    let trace_compass =
        TraceCompassLine::from_expected(&expected["synchronization"]["transforms"]["scp_src"]);
    let observed = &expected["observed"]["scp_src"];
    let times = [
        observed["first_event_ts_ns"].as_u64().unwrap(),
        observed["last_event_ts_ns"].as_u64().unwrap(),
    ];

    let bisector = sync_src("bisector");
    assert_eq!(
        (bisector["quality"].as_str(), bisector["matched"].as_u64()),
        (Some("accurate"), Some(46)),
        "Trace Compass matches 46 segments"
    );
    for t in times {
        let apart = shift(&bisector, t) - trace_compass.shift(t);
        assert!(
            apart.abs() < 1_000.0,
            "at {t}: {apart} ns from Trace Compass's"
        );
    }

    let most_room = sync_src("most-room");
    // The bounds are judged over the trace's first and last events.
    assert_eq!(
        [
            most_room["first_ns"].as_u64(),
            most_room["last_ns"].as_u64()
        ],
        times.map(Some)
    );
    assert_eq!(most_room["bounds"], "enclosed");
    let max_error = most_room["max_error_ns"].as_f64().unwrap();
    for (t, range) in times.iter().zip(["error_at_first_ns", "error_at_last_ns"]) {
        let off = trace_compass.shift(*t) - shift(&most_room, *t);
        let (low, high) = (
            most_room[range][0].as_f64().unwrap(),
            most_room[range][1].as_f64().unwrap(),
        );
        assert!(
            low <= off && off <= high,
            "at {t}: Trace Compass {off} ns off, bounds [{low}, {high}]"
        );
        assert!(off.abs() <= max_error, "{off} vs {max_error}");
    }
    // The two estimators share the bounds: the lines that fit.
    for field in ["slope_min", "slope_max"] {
        assert_eq!(bisector[field], most_room[field], "{field}");
    }
    let (slope_min, slope_max) = (
        most_room["slope_min"].as_f64().unwrap(),
        most_room["slope_max"].as_f64().unwrap(),
    );
    let trace_compass_slope = 1.0 + trace_compass.slope_minus_one;
    assert!(slope_min < trace_compass_slope && trace_compass_slope < slope_max);
}
