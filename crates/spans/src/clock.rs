//! Wall clock → CLOCK_MONOTONIC, for spans that carry only wall-clock times.
//!
//! The recorder samples (CLOCK_REALTIME, CLOCK_MONOTONIC) pairs during a run
//! (`manifest.json` → `"clock_samples": [[realtime_ns, mono_ns], ...]`).
//! Between two samples the mapping is the straight line through them; before
//! the first or after the last, the nearest segment is extended (with one
//! sample: a constant offset). NTP slewing bends the real relation between
//! samples; the bend is measured, not assumed, as the *leave-one-out
//! residual*: each interior sample is predicted from its two neighbours and
//! compared with what was read. [`ClockMap::precision_ns`] is the largest
//! such residual, but never below [`SAMPLE_READ_UNCERTAINTY_NS`] (the two
//! clocks of one pair are read one after the other, and the pair does not
//! say how far apart). Spans with the deepspan SDK fields need no mapping:
//! [`ClockMap::span_mono`] uses them as they are and says the times are exact.

use std::path::Path;

use crate::error::Error;
use crate::model::Span;

/// Floor of the stated precision: the unknown delay between reading
/// CLOCK_REALTIME and CLOCK_MONOTONIC for one sample (a few hundred ns on a
/// quiet machine, more under load; 1 µs is the design's stated precision
/// for mapped spans).
pub const SAMPLE_READ_UNCERTAINTY_NS: u64 = 1_000;

/// Piecewise-linear wall → monotonic mapping built from clock samples.
#[derive(Clone, Debug)]
pub struct ClockMap {
    /// (realtime_ns, mono_ns), mono increasing, realtime non-decreasing.
    samples: Vec<(u64, u64)>,
    precision_ns: u64,
    /// Samples left out and why (duplicates, realtime stepping backwards).
    pub notes: Vec<String>,
}

/// A span's times on the monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonoTimes {
    pub start_ns: u64,
    pub end_ns: u64,
    /// True when both come from the span's deepspan fields (no mapping).
    pub exact: bool,
    /// Bound on the error of mapped times (0 when exact).
    pub precision_ns: u64,
}

impl ClockMap {
    /// Builds the map from (realtime_ns, mono_ns) pairs in any order. Fails
    /// only when no usable sample remains.
    pub fn new(pairs: &[(u64, u64)]) -> Result<ClockMap, Error> {
        let mut v: Vec<(u64, u64)> = pairs.to_vec();
        v.sort_by_key(|p| p.1);
        let mut notes = Vec::new();
        let mut samples: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (rt, mono) in v {
            match samples.last() {
                Some(&(_, lmono)) if mono == lmono => notes.push(format!("sample ({rt}, {mono}) repeats a monotonic time; left out")),
                Some(&(lrt, _)) if rt < lrt => notes.push(format!(
                    "sample ({rt}, {mono}): CLOCK_REALTIME went back {} ns (a clock step); left out, so wall times around it map by the neighbouring samples",
                    lrt - rt
                )),
                _ => samples.push((rt, mono)),
            }
        }
        if samples.is_empty() {
            return Err(Error::invalid(
                "clock samples",
                "clock_samples",
                "clock_samples",
                "no usable (realtime_ns, mono_ns) sample",
            ));
        }
        let mut residual = 0u64;
        for w in samples.windows(3) {
            let predicted = interpolate(w[0], w[2], w[1].0);
            residual = residual.max(predicted.abs_diff(w[1].1));
        }
        Ok(ClockMap {
            samples,
            precision_ns: residual.max(SAMPLE_READ_UNCERTAINTY_NS),
            notes,
        })
    }

    /// Reads `clock_samples` from a run's `manifest.json`.
    pub fn from_manifest(run_dir: &Path) -> Result<ClockMap, Error> {
        let path = deepspan_run::Run::new(run_dir).manifest();
        let text = std::fs::read(&path)
            .map_err(|e| Error::io(&path, "cannot read the run manifest", e))?;
        let name = path.display().to_string();
        let doc: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            Error::invalid(
                &name,
                "manifest",
                format!("line {} column {}", e.line(), e.column()),
                e.to_string(),
            )
        })?;
        let arr = doc
            .get("clock_samples")
            .and_then(|v| v.as_array())
            .ok_or_else(|| {
                Error::invalid(
                    &name,
                    "manifest",
                    "clock_samples",
                    "missing, or not an array of [realtime_ns, mono_ns]",
                )
            })?;
        let mut pairs = Vec::with_capacity(arr.len());
        for (i, p) in arr.iter().enumerate() {
            let pair = p
                .as_array()
                .filter(|a| a.len() == 2)
                .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)));
            pairs.push(pair.ok_or_else(|| {
                Error::invalid(
                    &name,
                    "manifest",
                    format!("clock_samples[{i}]"),
                    format!(
                        "expected [realtime_ns, mono_ns] as two non-negative integers, got {p}"
                    ),
                )
            })?);
        }
        let mut map = ClockMap::new(&pairs).map_err(|e| match e {
            Error::Invalid { reason, .. } => {
                Error::invalid(&name, "manifest", "clock_samples", reason)
            }
            other => other,
        })?;
        map.notes
            .iter_mut()
            .for_each(|n| *n = format!("{name}: {n}"));
        Ok(map)
    }

    /// Bound on the mapping error inside the sampled range, in ns.
    pub fn precision_ns(&self) -> u64 {
        self.precision_ns
    }

    /// The wall-clock range the samples cover; outside it the error grows
    /// with the clocks' relative drift (NTP keeps it under 500 ppm).
    pub fn covered_realtime(&self) -> (u64, u64) {
        (self.samples[0].0, self.samples[self.samples.len() - 1].0)
    }

    /// The same mapping with `delta_ns` added to every mapped time: the
    /// correction that the kernel trace itself measured (spans placed on
    /// threads must start and end while their thread runs).
    pub fn corrected(&self, delta_ns: i64) -> ClockMap {
        let mut map = self.clone();
        for s in &mut map.samples {
            s.1 = (s.1 as i128 + delta_ns as i128).max(0) as u64;
        }
        map
    }

    /// Maps a wall-clock time (ns since the epoch) to CLOCK_MONOTONIC ns.
    pub fn wall_to_mono(&self, wall_ns: u64) -> u64 {
        let s = &self.samples;
        if s.len() == 1 {
            return (wall_ns as i128 - s[0].0 as i128 + s[0].1 as i128).max(0) as u64;
        }
        // Segment whose start is the last sample at or before wall_ns, clamped to the end segments.
        let i = s.partition_point(|p| p.0 <= wall_ns).clamp(1, s.len() - 1);
        interpolate(s[i - 1], s[i], wall_ns)
    }

    /// Maps a CLOCK_MONOTONIC time back to wall-clock ns (the inverse of
    /// [`ClockMap::wall_to_mono`] where realtime did not stand still).
    pub fn mono_to_wall(&self, mono_ns: u64) -> u64 {
        let s = &self.samples;
        if s.len() == 1 {
            return (mono_ns as i128 - s[0].1 as i128 + s[0].0 as i128).max(0) as u64;
        }
        let i = s.partition_point(|p| p.1 <= mono_ns).clamp(1, s.len() - 1);
        let swap = |p: (u64, u64)| (p.1, p.0);
        interpolate(swap(s[i - 1]), swap(s[i]), mono_ns)
    }

    /// A span's monotonic start/end: its deepspan fields when present
    /// (exact), else its wall times mapped.
    pub fn span_mono(&self, span: &Span) -> MonoTimes {
        span_mono_exact(span).unwrap_or_else(|| MonoTimes {
            start_ns: self.wall_to_mono(span.start_ns),
            end_ns: self
                .wall_to_mono(span.end_ns)
                .max(self.wall_to_mono(span.start_ns)),
            exact: false,
            precision_ns: self.precision_ns,
        })
    }
}

/// The span's monotonic times from its deepspan fields alone, if it has both.
pub fn span_mono_exact(span: &Span) -> Option<MonoTimes> {
    match (span.sync.mono_start_ns, span.sync.mono_end_ns) {
        (Some(s), Some(e)) => Some(MonoTimes {
            start_ns: s,
            end_ns: e,
            exact: true,
            precision_ns: 0,
        }),
        _ => None,
    }
}

fn interpolate(a: (u64, u64), b: (u64, u64), x: u64) -> u64 {
    let (x0, y0, x1, y1) = (a.0 as i128, a.1 as i128, b.0 as i128, b.1 as i128);
    let y = if x1 == x0 {
        y0 + (x as i128 - x0)
    } else {
        y0 + (x as i128 - x0) * (y1 - y0) / (x1 - x0)
    };
    y.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mono_to_wall_inverts_wall_to_mono() {
        let map = ClockMap::new(&[
            (1_000_000_000, 10),
            (2_000_000_100, 1_000_000_010),
            (3_000_000_100, 2_000_000_010),
        ])
        .unwrap();
        for wall in [
            1_000_000_000u64,
            1_500_000_000,
            2_000_000_100,
            2_999_999_999,
            3_500_000_000,
        ] {
            let mono = map.wall_to_mono(wall);
            assert!(
                map.mono_to_wall(mono).abs_diff(wall) <= 1,
                "{wall} -> {mono} -> {}",
                map.mono_to_wall(mono)
            );
        }
        let one = ClockMap::new(&[(5_000, 7)]).unwrap();
        assert_eq!(one.mono_to_wall(one.wall_to_mono(9_000)), 9_000);
    }
}
