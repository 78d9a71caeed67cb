//! The UI is built by `npm run build` in ui/ (the Makefile does it before
//! cargo). Without it the binary would serve an empty UI, so the build
//! stops here instead, saying how to fix it.

use std::path::Path;

fn main() {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ui/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    println!(
        "cargo:rerun-if-changed={}",
        dist.join("index.html").display()
    );
    println!("cargo:rerun-if-changed={}", dist.join("assets").display());
    if !dist.join("index.html").is_file() {
        panic!(
            "\n\nthe web UI is not built: {} has no index.html.\n\
             Build it first with `make ui` (or `cd ui && npm ci && npm run build`);\n\
             `make build` and `make test` do it for you.\n\n",
            dist.display()
        );
    }
}
