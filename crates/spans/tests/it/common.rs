//! Test support shared by the modules.

use std::path::PathBuf;

/// A file of the public span test data, `shared/testdata/spans/<rel>`.
pub fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata/spans"
    ))
    .join(rel)
}
