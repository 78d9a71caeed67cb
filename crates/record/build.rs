//! Compiles the recorder's eBPF programs (`src/bpf/NAME.bpf.c`: the TCP
//! headers of `record --tcp-keys`, the socket calls, and what every
//! recording takes at each context switch: CPU throttling, sleeps in system
//! calls, switches out of idle) with clang into `OUT_DIR/NAME.bpf.o`,
//! which the crate embeds.
//!
//! Without clang (or libbpf's headers) the crate still builds, with a
//! warning: `--tcp-keys` says at run time what to install, and recordings
//! go without throttling intervals (the analysis then infers throttling
//! from idle CPUs, as it does for CTF traces) and without blocked system
//! calls or socket calls.
//!
//! The sleeps in system calls are read from x86_64 registers: other
//! architectures compile the context-switch program without that part
//! (`cfg(deepspan_bpf_syscalls)` is set on x86_64 only), and record
//! without it.

use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: [&str; 3] = ["tcp_keys", "socket_calls", "sched_switch"];

fn main() {
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rustc-check-cfg=cfg(deepspan_bpf)");
    println!("cargo:rustc-check-cfg=cfg(deepspan_bpf_syscalls)");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=src/bpf/ring.h");
    for program in PROGRAMS {
        println!("cargo:rerun-if-changed=src/bpf/{program}.bpf.c");
    }
    match PROGRAMS
        .iter()
        .try_for_each(|program| compile(program, &out_dir))
    {
        Ok(()) => {
            println!("cargo:rustc-cfg=deepspan_bpf");
            if target_arch() == "x86_64" {
                println!("cargo:rustc-cfg=deepspan_bpf_syscalls");
            }
        }
        Err(why) => println!(
            "cargo:warning=the recorder's eBPF programs are left out: {why}; install clang and \
             libbpf-dev (scripts/setup.sh build does)"
        ),
    }
}

fn target_arch() -> String {
    std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into())
}

/// libbpf's name for an architecture (`__TARGET_ARCH_x86`), which
/// <bpf/bpf_tracing.h> and the programs test.
fn libbpf_arch(arch: &str) -> &str {
    match arch {
        "x86_64" | "x86" => "x86",
        "aarch64" => "arm64",
        "powerpc64" => "powerpc",
        "riscv64" => "riscv",
        "loongarch64" => "loongarch",
        other => other,
    }
}

/// Compiles `src/bpf/{program}.bpf.c` with the first clang that works, or
/// says why none did.
fn compile(program: &str, out_dir: &std::path::Path) -> Result<(), String> {
    let source = format!("src/bpf/{program}.bpf.c");
    let out = out_dir.join(format!("{program}.bpf.o"));
    let arch = target_arch();
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
            .arg(format!("-D__TARGET_ARCH_{}", libbpf_arch(&arch)))
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
