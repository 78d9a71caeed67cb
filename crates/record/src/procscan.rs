//! A small /proc scan: each process's pid, comm, command line and listening
//! TCP ports, so that spans without deepspan fields can be matched to a
//! process by service name or port (`RUN/processes.json`).
//!
//! [`crate::record`] scans when it starts, then every second for 10 s, then
//! at 16, 32, 64 … s, and once more when it ends, each scan adding to what
//! the earlier ones found (so services the traced command starts, late
//! ones too, are seen); [`crate::FlightRecorder::snapshot`] scans once, as
//! it writes its window.

use std::collections::{BTreeMap, HashMap};
use std::fs;

use serde::{Deserialize, Serialize};

/// One process as the scan saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEntry {
    pub pid: i32,
    pub comm: String,
    /// Arguments joined by spaces.
    pub cmdline: String,
    /// TCP ports (IPv4 and IPv6) it held a listening socket on.
    #[serde(default)]
    pub listening_ports: Vec<u16>,
}

/// Processes seen by one or more scans, by pid (a later scan adds ports and
/// processes; a pid reused by another command keeps its first entry).
#[derive(Clone, Debug, Default)]
pub struct ProcessScan {
    pub processes: BTreeMap<i32, ProcessEntry>,
}

impl ProcessScan {
    /// Scans /proc now and merges what it finds.
    pub fn scan(&mut self) {
        let listening = listening_inodes();
        let Ok(procs) = fs::read_dir("/proc") else {
            return;
        };
        for entry in procs.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            let Ok(comm) = fs::read_to_string(dir.join("comm")) else {
                continue;
            };
            let cmdline = fs::read(dir.join("cmdline")).unwrap_or_default();
            let cmdline = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(String::from_utf8_lossy)
                .collect::<Vec<_>>();
            let mut ports: Vec<u16> = Vec::new();
            if !listening.is_empty() {
                for fd in fs::read_dir(dir.join("fd")).into_iter().flatten().flatten() {
                    let Ok(target) = fs::read_link(fd.path()) else {
                        continue;
                    };
                    let target = target.to_string_lossy();
                    let inode = target
                        .strip_prefix("socket:[")
                        .and_then(|t| t.strip_suffix(']'));
                    if let Some(port) = inode
                        .and_then(|i| i.parse::<u64>().ok())
                        .and_then(|i| listening.get(&i))
                    {
                        ports.push(*port);
                    }
                }
            }
            ports.sort_unstable();
            ports.dedup();
            let e = self.processes.entry(pid).or_insert_with(|| ProcessEntry {
                pid,
                comm: comm.trim_end_matches('\n').to_string(),
                cmdline: cmdline.join(" "),
                listening_ports: Vec::new(),
            });
            for p in ports {
                if !e.listening_ports.contains(&p) {
                    e.listening_ports.push(p);
                }
            }
        }
    }

    /// The scan as `processes.json` holds it.
    pub fn to_json(&self) -> Vec<u8> {
        let list: Vec<&ProcessEntry> = self.processes.values().collect();
        serde_json::to_vec_pretty(&list).unwrap_or_default()
    }
}

/// Socket inode → port of the listening TCP sockets (/proc/net/tcp, tcp6).
fn listening_inodes() -> HashMap<u64, u16> {
    let mut out = HashMap::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        out.extend(text.lines().skip(1).filter_map(parse_listening));
    }
    out
}

/// `(inode, port)` of one /proc/net/tcp line in state LISTEN (0A).
fn parse_listening(line: &str) -> Option<(u64, u16)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if f.get(3) != Some(&"0A") {
        return None;
    }
    let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
    Some((f.get(9)?.parse().ok()?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines_give_inode_and_port() {
        let listen = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41234 1 0000000000000000 100 0 0 10 0";
        assert_eq!(parse_listening(listen), Some((41234, 8080)));
        let established =
            "   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 41235 1";
        assert_eq!(parse_listening(established), None);
    }

    #[test]
    fn a_scan_finds_this_process_and_its_listening_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut scan = ProcessScan::default();
        scan.scan();
        let me = &scan.processes[&(std::process::id() as i32)];
        assert!(me.listening_ports.contains(&port), "{me:?}");
        assert!(!me.cmdline.is_empty());
    }
}
