//! Addresses to function names at analysis time, from what the recording
//! kept (`RUN/profile/`): kernel frames through the saved kallsyms, user
//! frames through the process's saved mappings into the ELF file and
//! offset they came from (blazesym reads the symbols and DWARF), JIT code
//! through the runtime's perf map.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::MaybeDefault;

use crate::samples::unpack_kallsyms;
use deepspan_run::profile::{perf_map, MAPS_DIR};

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    /// The file, `[vdso]`-like names, or empty for anonymous memory.
    path: String,
}

/// A frame's name, and where it came from (module) when known.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub module: String,
}

/// Resolves a run's sampled addresses; caches every answer.
pub struct Symbols {
    dir: PathBuf,
    symbolizer: Symbolizer,
    /// Unpacked kallsyms (blazesym reads a file); None without one.
    kallsyms: Option<tempfile::TempPath>,
    maps: HashMap<i32, Vec<Mapping>>,
    perf_maps: HashMap<i32, Vec<(u64, u64, String)>>,
    cache: HashMap<(i32, u64, bool), Frame>,
}

impl Symbols {
    pub fn open(profile_dir: &Path) -> Symbols {
        let kallsyms = tempfile::NamedTempFile::new()
            .ok()
            .map(tempfile::NamedTempFile::into_temp_path)
            .filter(|t| unpack_kallsyms(profile_dir, t).is_ok());
        Symbols {
            dir: profile_dir.to_path_buf(),
            symbolizer: Symbolizer::new(),
            kallsyms,
            maps: HashMap::new(),
            perf_maps: HashMap::new(),
            cache: HashMap::new(),
        }
    }

    /// The frame at `addr` of process `pid` (`kernel`: a kernel address).
    pub fn frame(&mut self, pid: i32, addr: u64, kernel: bool) -> Frame {
        let key = (if kernel { 0 } else { pid }, addr, kernel);
        if let Some(f) = self.cache.get(&key) {
            return f.clone();
        }
        let f = if kernel {
            self.kernel_frame(addr)
        } else {
            self.user_frame(pid, addr)
        };
        self.cache.insert(key, f.clone());
        f
    }

    fn kernel_frame(&mut self, addr: u64) -> Frame {
        let unknown = || Frame {
            function: format!("0x{addr:x}"),
            module: "[kernel]".into(),
        };
        let Some(kallsyms) = &self.kallsyms else {
            return unknown();
        };
        let kernel = Kernel {
            kallsyms: MaybeDefault::Some(kallsyms.to_path_buf()),
            vmlinux: MaybeDefault::None,
            kaslr_offset: Some(0),
            ..Kernel::default()
        };
        match self
            .symbolizer
            .symbolize_single(&Source::Kernel(kernel), Input::AbsAddr(addr))
        {
            Ok(Symbolized::Sym(sym)) => Frame {
                function: sym.name.into_owned(),
                module: sym
                    .module
                    .map_or_else(|| "[kernel]".into(), |m| m.to_string_lossy().into_owned()),
            },
            _ => unknown(),
        }
    }

    fn user_frame(&mut self, pid: i32, addr: u64) -> Frame {
        let dir = self.dir.clone();
        let maps = self.maps.entry(pid).or_insert_with(|| read_maps(&dir, pid));
        // The last mapping listed wins: MMAP2 records come after the /proc copy.
        let Some(m) = maps
            .iter()
            .rev()
            .find(|m| m.start <= addr && addr < m.end)
            .cloned()
        else {
            return self.jit_frame(pid, addr).unwrap_or_else(|| Frame {
                function: format!("0x{addr:x}"),
                module: "[unknown]".into(),
            });
        };
        if m.path.is_empty() || m.path.starts_with('[') || m.path.starts_with("//anon") {
            return self.jit_frame(pid, addr).unwrap_or_else(|| Frame {
                function: format!("0x{addr:x}"),
                module: if m.path.is_empty() {
                    "[anon]".into()
                } else {
                    m.path.clone()
                },
            });
        }
        let offset = addr - m.start + m.file_offset;
        let elf = Elf::new(PathBuf::from(m.path.trim_end_matches(" (deleted)")));
        let module = Path::new(&m.path)
            .file_name()
            .map_or(m.path.clone(), |n| n.to_string_lossy().into_owned());
        match self
            .symbolizer
            .symbolize_single(&Source::Elf(elf), Input::FileOffset(offset))
        {
            Ok(Symbolized::Sym(sym)) => Frame {
                function: sym.name.into_owned(),
                module,
            },
            _ => Frame {
                function: format!("{module}+0x{offset:x}"),
                module,
            },
        }
    }

    fn jit_frame(&mut self, pid: i32, addr: u64) -> Option<Frame> {
        let dir = self.dir.clone();
        let map = self
            .perf_maps
            .entry(pid)
            .or_insert_with(|| read_perf_map(&dir, pid));
        let i = map
            .partition_point(|(start, _, _)| *start <= addr)
            .checked_sub(1)?;
        let (start, size, name) = &map[i];
        (addr < start.saturating_add(*size)).then(|| Frame {
            function: name.clone(),
            module: "[jit]".into(),
        })
    }
}

fn read_maps(dir: &Path, pid: i32) -> Vec<Mapping> {
    let Ok(text) = std::fs::read_to_string(dir.join(MAPS_DIR).join(pid.to_string())) else {
        return Vec::new();
    };
    text.lines().filter_map(parse_maps_line).collect()
}

/// `start-end perms offset dev inode [path]`, as in /proc/PID/maps.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, char::is_whitespace);
    let (start, end) = fields.next()?.split_once('-')?;
    let _perms = fields.next()?;
    let offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim().to_string();
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path,
    })
}

/// `START SIZE name` lines (hex), sorted by start.
fn read_perf_map(dir: &Path, pid: i32) -> Vec<(u64, u64, String)> {
    let Ok(text) = std::fs::read_to_string(dir.join(perf_map(pid))) else {
        return Vec::new();
    };
    let mut entries: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let start = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
            Some((start, size, f.next()?.trim().to_string()))
        })
        .collect();
    entries.sort_by_key(|e| e.0);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_and_perf_maps_parse() {
        let m = parse_maps_line(
            "55d0c0a00000-55d0c0a21000 r-xp 00002000 08:01 1234    /usr/bin/python3.11",
        )
        .unwrap();
        assert_eq!(
            m,
            Mapping {
                start: 0x55d0c0a00000,
                end: 0x55d0c0a21000,
                file_offset: 0x2000,
                path: "/usr/bin/python3.11".into()
            }
        );
        let anon = parse_maps_line("7f0000000000-7f0000001000 r-xp 00000000 00:00 0").unwrap();
        assert_eq!(anon.path, "");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("perf-9.map"),
            "7f10 20 py::hot:/x.py\n7f00 10 py::cold:/x.py\n",
        )
        .unwrap();
        let mut s = Symbols::open(dir.path());
        assert_eq!(s.frame(9, 0x7f15, false).function, "py::hot:/x.py");
        assert_eq!(s.frame(9, 0x7f05, false).function, "py::cold:/x.py");
        assert_eq!(s.frame(9, 0x7f45, false).function, "0x7f45");
    }
}
