//! Compiles `record --tcp-keys`'s eBPF program (`src/bpf/tcp_keys.bpf.c`)
//! with clang into `OUT_DIR/tcp_keys.bpf.o`, which the crate embeds.
//!
//! Without clang (or libbpf's headers) the crate still builds, with a
//! warning, and `--tcp-keys` says at run time what to install: the rest of
//! the recorder does not need the program.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "src/bpf/tcp_keys.bpf.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rustc-check-cfg=cfg(deepspan_tcp_keys)");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("tcp_keys.bpf.o");
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
            .args(["-c", source, "-o"])
            .arg(&out)
            .output();
        match result {
            Ok(o) if o.status.success() => {
                println!("cargo:rustc-cfg=deepspan_tcp_keys");
                return;
            }
            Ok(o) => failures.push(format!(
                "{clang}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failures.push(format!("{clang}: {e}")),
        }
    }
    let why = if failures.is_empty() {
        "no clang found".to_string()
    } else {
        failures.join("; ")
    };
    println!(
        "cargo:warning=record --tcp-keys disabled: cannot compile its eBPF program ({why}); install clang \
         and libbpf-dev (scripts/setup.sh build does)"
    );
}
