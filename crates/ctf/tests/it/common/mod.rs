//! Shared by the integration tests: paths to the test corpus, running
//! external tools, a parser for babeltrace2's `sink.text.pretty` output,
//! small traces cut from the corpus, and the synthetic trace (`synthetic`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use deepspan_ctf::CtfEvent;
use deepspan_model::Value;

pub mod synthetic;

pub fn corpus(rel: &str) -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata/kernel/ctf"
    ))
    .join(rel)
}

/// Whether an external tool exists; when it does not, the test fails with a
/// clear message unless DEEPSPAN_ALLOW_MISSING_TOOLS=1 (then it is skipped).
pub fn tool_available(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok();
    if !found {
        if std::env::var("DEEPSPAN_ALLOW_MISSING_TOOLS").as_deref() == Ok("1") {
            eprintln!("SKIPPED: `{tool}` not found (DEEPSPAN_ALLOW_MISSING_TOOLS=1)");
        } else {
            panic!(
                "`{tool}` is needed as a test oracle but was not found: install it (Debian: apt-get install {tool}) \
                 or set DEEPSPAN_ALLOW_MISSING_TOOLS=1 to skip"
            );
        }
    }
    found
}

/// A value as babeltrace2 prints it, normalized so that our values compare
/// directly: enumerations are their integer, structs inside arrays are
/// arrays of their members.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
pub enum Norm {
    Int(i128),
    Float(String),
    Str(String),
    Array(Vec<Norm>),
}

/// One event of babeltrace2 pretty output.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
pub struct BtEvent {
    pub ts: u64,
    pub name: String,
    /// cpu_id from `stream.packet.context`, when printed.
    pub cpu: Option<u64>,
    /// Stream event context then event context, flattened.
    pub context: Vec<(String, Norm)>,
    pub fields: Vec<(String, Norm)>,
}

#[derive(Debug)]
enum Bt {
    Int(i128),
    Float(String),
    Str(String),
    Struct(Vec<(String, Bt)>),
    Array(Vec<Bt>),
    /// babeltrace2 prints a variant as `{ value }`, without the option name.
    Variant(Box<Bt>),
}

struct P<'a> {
    s: &'a [u8],
    i: usize,
}

impl P<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i] == b' ' {
            self.i += 1;
        }
    }
    fn eat(&mut self, t: &str) -> bool {
        self.ws();
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, t: &str) {
        assert!(
            self.eat(t),
            "expected {t:?} at {:?}",
            String::from_utf8_lossy(&self.s[self.i..])
        );
    }
    fn ident(&mut self) -> String {
        self.ws();
        let st = self.i;
        while self.i < self.s.len() && !matches!(self.s[self.i], b' ' | b'=' | b',' | b'}') {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[st..self.i]).into_owned()
    }
    fn string(&mut self) -> String {
        self.expect("\"");
        let mut out = Vec::new();
        loop {
            let c = self.s[self.i];
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = self.s[self.i];
                    self.i += 1;
                    out.push(match e {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        b'v' => 11,
                        b'f' => 12,
                        b'a' => 7,
                        b'b' => 8,
                        other => other,
                    });
                }
                c => out.push(c),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    fn value(&mut self) -> Bt {
        self.ws();
        match self.s[self.i] {
            b'{' => {
                self.i += 1;
                let mut members = Vec::new();
                if self.eat("}") {
                    return Bt::Struct(members);
                }
                self.ws();
                if matches!(
                    self.s[self.i],
                    b'{' | b'"' | b'[' | b'(' | b'-' | b'0'..=b'9'
                ) {
                    let v = self.value();
                    self.expect("}");
                    return Bt::Variant(Box::new(v));
                }
                loop {
                    let name = self.ident();
                    self.expect("=");
                    members.push((name, self.value()));
                    if self.eat("}") {
                        return Bt::Struct(members);
                    }
                    self.expect(",");
                }
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                if self.eat("]") {
                    return Bt::Array(items);
                }
                loop {
                    self.expect("[");
                    while self.s[self.i] != b']' {
                        self.i += 1;
                    }
                    self.expect("]");
                    self.expect("=");
                    items.push(self.value());
                    if self.eat("]") {
                        return Bt::Array(items);
                    }
                    self.expect(",");
                }
            }
            b'(' => {
                // ( "label", ... : container = N )
                self.i += 1;
                loop {
                    self.ws();
                    if self.s[self.i] == b'"' {
                        self.string();
                    } else if self.s[self.i] == b':' {
                        break;
                    } else {
                        self.i += 1;
                    }
                }
                self.expect(":");
                self.expect("container");
                self.expect("=");
                let v = self.value();
                self.expect(")");
                v
            }
            b'"' => Bt::Str(self.string()),
            _ => {
                let st = self.i;
                while self.i < self.s.len()
                    && !matches!(self.s[self.i], b' ' | b',' | b'}' | b']' | b')')
                {
                    self.i += 1;
                }
                let tok = std::str::from_utf8(&self.s[st..self.i]).unwrap();
                parse_number(tok)
            }
        }
    }
}

fn parse_number(tok: &str) -> Bt {
    let (neg, t) = match tok.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, tok),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i128::from_str_radix(h, 16).ok()
    } else if let Some(b) = t.strip_prefix("0b") {
        i128::from_str_radix(b, 2).ok()
    } else if t.len() > 1 && t.starts_with('0') && t.bytes().all(|c| c.is_ascii_digit()) {
        i128::from_str_radix(&t[1..], 8).ok()
    } else {
        t.parse::<i128>().ok()
    };
    match v {
        Some(v) => Bt::Int(if neg { -v } else { v }),
        None => Bt::Float(format!("{:.6e}", tok.parse::<f64>().unwrap_or(f64::NAN))),
    }
}

fn flatten(prefix: &str, members: Vec<(String, Bt)>, out: &mut Vec<(String, Norm)>) {
    for (name, v) in members {
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}.{name}")
        };
        match v {
            Bt::Struct(m) => flatten(&path, m, out),
            Bt::Variant(inner) => match *inner {
                Bt::Struct(m) => flatten(&path, m, out),
                other => out.push((path, norm_bt(other))),
            },
            other => out.push((path, norm_bt(other))),
        }
    }
}

fn norm_bt(v: Bt) -> Norm {
    match v {
        Bt::Int(i) => Norm::Int(i),
        Bt::Float(f) => Norm::Float(f),
        Bt::Str(s) => Norm::Str(s),
        Bt::Struct(m) => Norm::Array(m.into_iter().map(|(_, v)| norm_bt(v)).collect()),
        Bt::Array(a) => Norm::Array(a.into_iter().map(norm_bt).collect()),
        Bt::Variant(v) => norm_bt(*v),
    }
}

pub fn norm(v: &Value) -> Norm {
    match v {
        Value::Int(i) => Norm::Int(*i as i128),
        Value::UInt(u) => Norm::Int(*u as i128),
        Value::Float(f) => Norm::Float(format!("{f:.6e}")),
        Value::Str(s) => Norm::Str(s.clone()),
        Value::Bytes(b) => Norm::Str(String::from_utf8_lossy(b).into_owned()),
        Value::Array(a) => Norm::Array(a.iter().map(norm).collect()),
    }
}

/// Parses one line of `babeltrace2 --clock-seconds --no-delta
/// --names=payload,context,scope` output.
pub fn parse_pretty_line(line: &str) -> BtEvent {
    let close = line.find("] ").expect("timestamp");
    let (secs, frac) = line[1..close].split_once('.').expect("seconds.ns");
    let ts = secs.parse::<u64>().unwrap() * 1_000_000_000 + frac.parse::<u64>().unwrap();
    let rest = &line[close + 2..];
    let scope_at = [": stream.", ": event."]
        .iter()
        .filter_map(|m| rest.find(m))
        .min();
    let (head, mut body) = match scope_at {
        Some(i) => (&rest[..i], &rest[i + 2..]),
        None => (rest.trim_end_matches(':'), ""),
    };
    let name = head.rsplit(' ').next().unwrap().to_string();
    let mut ev = BtEvent {
        ts,
        name,
        cpu: None,
        context: Vec::new(),
        fields: Vec::new(),
    };
    while !body.is_empty() {
        let (scope, after) = body.split_once(" = ").expect("scope = value");
        let mut p = P {
            s: after.as_bytes(),
            i: 0,
        };
        let Bt::Struct(members) = p.value() else {
            panic!("scope is not a struct: {line}")
        };
        let mut flat = Vec::new();
        flatten("", members, &mut flat);
        match scope {
            "stream.packet.context" => {
                ev.cpu = flat
                    .iter()
                    .find(|(n, _)| n == "cpu_id")
                    .map(|(_, v)| match v {
                        Norm::Int(i) => *i as u64,
                        _ => panic!("cpu_id"),
                    })
            }
            "stream.event.context" | "event.context" => ev.context.extend(flat),
            "event.fields" => ev.fields = flat,
            other => panic!("unknown scope {other} in {line}"),
        }
        body = after[p.i..].trim_start_matches(", ");
    }
    ev
}

/// babeltrace2's view of a trace folder.
pub fn babeltrace_events(dir: &Path) -> Vec<BtEvent> {
    let out = Command::new("babeltrace2")
        .args([
            "--clock-seconds",
            "--no-delta",
            "--names=payload,context,scope",
        ])
        .arg(dir)
        .output()
        .expect("run babeltrace2");
    assert!(
        out.status.success(),
        "babeltrace2 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(parse_pretty_line)
        .collect()
}

/// Our view of an event, in the same normalized form.
pub fn our_event(e: &CtfEvent) -> BtEvent {
    let cpu = e
        .packet_context()
        .iter()
        .find(|(n, _)| &**n == "cpu_id")
        .map(|(_, v)| match v {
            Value::UInt(u) => *u,
            Value::Int(i) => *i as u64,
            _ => panic!("cpu_id"),
        });
    BtEvent {
        ts: e.ts(),
        name: e.name().to_string(),
        cpu,
        context: e
            .context()
            .iter()
            .map(|(n, v)| (n.to_string(), norm(v)))
            .collect(),
        fields: e
            .fields()
            .iter()
            .map(|(n, v)| (n.to_string(), norm(v)))
            .collect(),
    }
}

/// babeltrace2 prints signed integers of base 16/8/2 as their unsigned bit
/// pattern of the field's size, which the text does not say: a negative
/// value of ours matches such a pattern of any integer size.
fn int_eq(ours: i128, theirs: i128) -> bool {
    ours == theirs
        || (ours < 0
            && theirs > 0
            && [8u32, 16, 32, 64]
                .iter()
                .any(|k| ours.rem_euclid(1i128 << k) == theirs))
}

fn norm_eq(a: &Norm, b: &Norm) -> bool {
    match (a, b) {
        (Norm::Int(x), Norm::Int(y)) => int_eq(*x, *y),
        // babeltrace2 2.0.4 recycles event objects and does not clear a
        // string field when the decoded string is empty: it prints an older
        // string instead (bug446190 has two such sys_open events, whose bytes
        // hold an immediate NUL).
        (Norm::Str(x), Norm::Str(_)) if x.is_empty() => true,
        // `%g` prints integral floats without a dot.
        (Norm::Float(f), Norm::Int(i)) => f.parse::<f64>().ok() == Some(*i as f64),
        (Norm::Array(x), Norm::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| norm_eq(a, b))
        }
        (x, y) => x == y,
    }
}

fn fields_eq(a: &[(String, Norm)], b: &[(String, Norm)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((n, x), (m, y))| n == m && norm_eq(x, y))
}

/// Compares two event lists that must be equal up to the order of events
/// with the same timestamp (the merge tie-break is implementation-defined).
pub fn assert_same_events(ours: &[BtEvent], theirs: &[BtEvent], what: &str) {
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{what}: event count differs from babeltrace2"
    );
    for (i, pair) in ours.windows(2).enumerate() {
        assert!(
            pair[0].ts <= pair[1].ts,
            "{what}: our event {} goes back in time",
            i + 1
        );
    }
    let key = |e: &BtEvent| (e.ts, e.name.clone(), e.cpu);
    let mut a: Vec<&BtEvent> = ours.iter().collect();
    let mut b: Vec<&BtEvent> = theirs.iter().collect();
    a.sort_by_key(|e| key(e));
    b.sort_by_key(|e| key(e));
    let mut i = 0;
    while i < a.len() {
        let k = key(a[i]);
        let j = a[i..]
            .iter()
            .position(|e| key(e) != k)
            .map_or(a.len(), |p| i + p);
        let mut pool: Vec<&BtEvent> = b[i..j].to_vec();
        for e in &a[i..j] {
            assert!(
                pool.iter().all(|t| key(t) == k),
                "{what}: babeltrace2 has no event like ours: {e:?}"
            );
            let found = pool
                .iter()
                .position(|t| fields_eq(&e.fields, &t.fields) && fields_eq(&e.context, &t.context));
            match found {
                Some(p) => {
                    pool.swap_remove(p);
                }
                None => panic!(
                    "{what}: event differs from babeltrace2's\n ours:   {e:?}\n theirs: {:?}",
                    pool[0]
                ),
            }
        }
        i = j;
    }
}

/// A small valid trace cut from a real one: its metadata file and the first
/// packet of its first stream file, shortened to `events` events (the
/// packet's size fields rewritten to match). For mutation tests and fuzz
/// seeds.
pub fn small_trace(dir: &Path, events: usize) -> (Vec<u8>, Vec<u8>) {
    let metadata = std::fs::read(dir.join("metadata")).unwrap();
    let trace = deepspan_ctf::CtfTrace::open(dir).unwrap();
    let mut first_file: Option<PathBuf> = None;
    let mut starts = Vec::new();
    let mut sizes = (0u64, 0u64);
    for e in trace.events() {
        let e = e.unwrap();
        let (file, offset) = e.source();
        let file = file.to_path_buf();
        let size = |n: &str| match e.packet_context().iter().find(|(k, _)| &**k == n) {
            Some((_, Value::UInt(v))) => *v,
            _ => panic!("no {n}"),
        };
        if first_file.is_none() {
            sizes = (size("content_size"), size("packet_size"));
            first_file = Some(file.clone());
        }
        if Some(&file) == first_file.as_ref() && offset < sizes.1 / 8 {
            starts.push(offset);
        }
    }
    starts.sort();
    let file = std::fs::read(first_file.unwrap()).unwrap();
    let cut = starts.get(events).copied().unwrap_or(sizes.0 / 8) as usize;
    let mut stream = file[..cut].to_vec();
    for old in [sizes.0, sizes.1] {
        let bits = cut as u64 * 8;
        for (from, to) in [
            (old.to_le_bytes(), bits.to_le_bytes()),
            (old.to_be_bytes(), bits.to_be_bytes()),
        ] {
            if let Some(p) = stream[..256.min(stream.len())]
                .windows(8)
                .position(|w| w == from)
            {
                stream[p..p + 8].copy_from_slice(&to);
                break;
            }
        }
    }
    (metadata, stream)
}
