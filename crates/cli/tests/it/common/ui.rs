//! `deepspan ui RUN` as a test sees it: started on a free port, asked with
//! raw HTTP GETs (the path goes on the wire exactly as given, so that no
//! client normalizes `..` or `%2e%2e` first).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};

use serde_json::Value;

use super::deepspan;

/// A running `deepspan ui`, stopped when dropped.
pub struct Server {
    pub addr: String,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `deepspan ui RUN --port 0` and reads the address it serves on.
pub fn serve(run: &Path) -> Server {
    let mut child = deepspan()
        .arg("ui")
        .arg(run)
        .args(["--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start deepspan ui");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read the URL");
    let addr = line
        .trim()
        .strip_prefix("http://")
        .and_then(|s| s.strip_suffix('/'))
        .unwrap_or_else(|| panic!("deepspan ui printed {line:?}, not its URL"))
        .to_string();
    assert!(
        addr.starts_with("127.0.0.1:"),
        "serves {addr}, not on 127.0.0.1 by default"
    );
    Server { child, addr }
}

/// A raw GET: the path goes on the wire exactly as given. (status, body)
pub fn get(s: &Server, path: &str) -> (u16, String) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        s.addr
    )
    .unwrap();
    let mut buf = Vec::new();
    c.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    // Bodies are small here; undo chunked encoding if used.
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(&body)
    } else {
        body
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// A GET that must answer 200 with JSON.
pub fn json(s: &Server, path: &str) -> Value {
    let (status, body) = get(s, path);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
}
