//! pprof output: the `profile.proto` messages (github.com/google/pprof,
//! proto/profile.proto) as prost structs, and a builder that interns
//! strings, functions and locations. Written gzip-compressed, as
//! `go tool pprof` and Pyroscope read it.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use crate::attribute::{StackSink, StackValue};
use crate::symbols::Frame;

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// The value columns of deepspan's profiles: samples, and wall time in ns
/// (on-CPU pieces' time shared among their samples, off-CPU pieces whole).
pub const SAMPLE_TYPES: [(&str, &str); 2] = [("samples", "count"), ("wall", "nanoseconds")];

/// Builds a [`Profile`] one stack at a time.
pub struct PprofBuilder {
    profile: Profile,
    strings: HashMap<String, i64>,
    /// One location per frame: deepspan frames have no addresses of their own.
    locations: HashMap<Frame, u64>,
}

impl PprofBuilder {
    pub fn new(time_nanos: i64, duration_nanos: i64) -> PprofBuilder {
        let mut b = PprofBuilder {
            profile: Profile {
                time_nanos,
                duration_nanos,
                default_sample_type: 1,
                ..Profile::default()
            },
            strings: HashMap::new(),
            locations: HashMap::new(),
        };
        b.string("");
        for (ty, unit) in SAMPLE_TYPES {
            let value_type = ValueType {
                r#type: b.string(ty),
                unit: b.string(unit),
            };
            b.profile.sample_type.push(value_type);
        }
        b
    }

    pub fn comment(&mut self, text: &str) {
        let s = self.string(text);
        self.profile.comment.push(s);
    }

    /// One stack (root first) with its values in [`SAMPLE_TYPES`] order and
    /// string labels.
    pub fn add(&mut self, root_first: &[Frame], values: [i64; 2], labels: &[(&str, &str)]) {
        let location_id = root_first.iter().rev().map(|f| self.location(f)).collect();
        let label = labels
            .iter()
            .map(|(k, v)| Label {
                key: self.string(k),
                str: self.string(v),
                num: 0,
            })
            .collect();
        self.profile.sample.push(Sample {
            location_id,
            value: values.to_vec(),
            label,
        });
    }

    pub fn finish(self) -> Profile {
        self.profile
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn location(&mut self, f: &Frame) -> u64 {
        if let Some(&id) = self.locations.get(f) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let name = self.string(&f.function);
        let filename = self.string(&f.module);
        self.profile.function.push(Function {
            id,
            name,
            system_name: name,
            filename,
        });
        self.profile.location.push(Location {
            id,
            line: vec![Line { function_id: id }],
        });
        self.locations.insert(f.clone(), id);
        id
    }
}

impl StackSink for PprofBuilder {
    /// Labelled `cpu=on|off`, and `state=STATE` when off the CPU.
    fn add_stack(&mut self, root_first: &[Frame], value: StackValue) {
        let values = [value.samples as i64, value.wall_ns as i64];
        match value.off_cpu_state {
            Some(state) => self.add(root_first, values, &[("cpu", "off"), ("state", state)]),
            None => self.add(root_first, values, &[("cpu", "on")]),
        }
    }
}

/// The profile as gzip-compressed protobuf.
pub fn encode_gzip(profile: &Profile) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())
        .expect("writing to a Vec cannot fail");
    gz.finish().expect("writing to a Vec cannot fail")
}
