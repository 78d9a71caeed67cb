//! Compiles the recorder's eBPF programs (`src/bpf/NAME.bpf.c`: the TCP
//! headers of `record --tcp-keys`, the CFS throttling of every recording)
//! with clang into `OUT_DIR/NAME.bpf.o`, which the crate embeds.
//!
//! Without clang (or libbpf's headers) the crate still builds, with a
//! warning: `--tcp-keys` says at run time what to install, and recordings
//! go without throttling intervals (the analysis then infers throttling
//! from idle CPUs, as it does for CTF traces).

use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: [&str; 2] = ["tcp_keys", "cfs_throttle"];

fn main() {
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rustc-check-cfg=cfg(deepspan_bpf)");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=src/bpf/ring.h");
    for program in PROGRAMS {
        println!("cargo:rerun-if-changed=src/bpf/{program}.bpf.c");
    }
    match PROGRAMS
        .iter()
        .try_for_each(|program| compile(program, &out_dir))
    {
        Ok(()) => println!("cargo:rustc-cfg=deepspan_bpf"),
        Err(why) => println!(
            "cargo:warning=the recorder's eBPF programs are left out: {why}; install clang and \
             libbpf-dev (scripts/setup.sh build does)"
        ),
    }
}

/// Compiles `src/bpf/{program}.bpf.c` with the first clang that works, or
/// says why none did.
fn compile(program: &str, out_dir: &std::path::Path) -> Result<(), String> {
    let source = format!("src/bpf/{program}.bpf.c");
    let out = out_dir.join(format!("{program}.bpf.o"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    // Debian keeps <asm/types.h> under the multiarch include folder.
    let multiarch = format!("{arch}-linux-gnu");
    let candidates: Vec<String> = match std::env::var("CLANG") {
        Ok(clang) => vec![clang],
        Err(_) => [
            "clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14",
        ]
        .map(String::from)
        .to_vec(),
    };
    let mut failures = Vec::new();
    for clang in &candidates {
        let result = Command::new(clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg(format!("-I/usr/include/{multiarch}"))
            .args(["-c", &source, "-o"])
            .arg(&out)
            .output();
        match result {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => failures.push(format!(
                "{clang}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failures.push(format!("{clang}: {e}")),
        }
    }
    Err(if failures.is_empty() {
        "no clang found".to_string()
    } else {
        format!("cannot compile {source}: {}", failures.join("; "))
    })
}
