//! deepspan's criterion benchmarks, in `benches/`; this library is empty.
//!
//! They live in a crate of their own, outside the workspace's default
//! members, because criterion's dependencies turn on features of shared
//! crates (serde's `alloc`, num-traits' `default`). A `cargo test` that
//! built criterion would resolve those crates differently from `cargo build`
//! and compile serde and every workspace crate above it a second time.
