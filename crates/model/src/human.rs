//! Durations, shares and diagnosis evidence as people read them: one rule
//! for every output (`analyze`, `report`, the demo's table, the UI server).
//! The web UI's `ui/src/units.ts` follows the same rule; both are tested
//! against `docs/format-vectors.json`.
//!
//! A duration takes the largest unit it reaches (ns, µs, ms, s) with three
//! significant digits at most: two decimals below 10 of the unit, one
//! above (`2.91 ms`, `237.3 µs`, `1.88 s`); nanoseconds are whole. A share
//! is a percentage with one decimal (`99.5 %`).

/// `850 ns`, `9.88 µs`, `237.3 µs`, `2.91 ms`, `1.88 s`.
pub fn duration(ns: u64) -> String {
    if ns < 1_000 {
        return format!("{ns} ns");
    }
    let (value, unit) = if ns < 1_000_000 {
        (ns as f64 / 1e3, "µs")
    } else if ns < 1_000_000_000 {
        (ns as f64 / 1e6, "ms")
    } else {
        (ns as f64 / 1e9, "s")
    };
    if value < 10.0 {
        format!("{value:.2} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

/// A fraction as a percentage: `0.995` → `99.5 %`.
pub fn share(fraction: f64) -> String {
    format!("{:.1} %", fraction * 100.0)
}

/// One item of a diagnosis's evidence, by its key's suffix: `*_ns` (and
/// `ns`) a duration, `*share` and `*_ratio` a share, `futex_uaddr` an
/// address; other values whole, or with two decimals.
pub fn evidence(key: &str, value: f64) -> String {
    let text = if key == "ns" || key.ends_with("_ns") {
        duration(value.max(0.0) as u64)
    } else if key.ends_with("share") || key.ends_with("_ratio") {
        share(value)
    } else if key == "futex_uaddr" {
        format!("{:#x}", value as u64)
    } else if value.fract() == 0.0 {
        format!("{value}")
    } else {
        format!("{value:.2}")
    };
    format!("{key}={text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule's examples, shared with the web UI.
    fn vectors() -> serde_json::Value {
        let text = include_str!("../../../docs/format-vectors.json");
        serde_json::from_str(text).expect("docs/format-vectors.json is JSON")
    }

    #[test]
    fn durations_follow_the_shared_vectors() {
        for v in vectors()["durations"].as_array().unwrap() {
            assert_eq!(duration(v[0].as_u64().unwrap()), v[1], "{v}");
        }
    }

    #[test]
    fn shares_follow_the_shared_vectors() {
        for v in vectors()["shares"].as_array().unwrap() {
            assert_eq!(share(v[0].as_f64().unwrap()), v[1], "{v}");
        }
    }

    #[test]
    fn evidence_follows_the_shared_vectors() {
        for v in vectors()["evidence"].as_array().unwrap() {
            let key = v[0].as_str().unwrap();
            assert_eq!(evidence(key, v[1].as_f64().unwrap()), v[2], "{v}");
        }
    }
}
