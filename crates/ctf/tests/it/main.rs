//! Integration tests of deepspan-ctf, one binary: decoding the CTF corpus
//! (shared/testdata/kernel/ctf) against babeltrace2 and upstream dumps,
//! the typed model mapping, a hand-built synthetic trace, malformed and
//! truncated input.
//!
//! Needs babeltrace2 (the oracle; installed by `make check`'s set-up).
//! `ust_jaeger` records a real LTTng-UST trace (lttng-tools,
//! liblttng-ust-dev, a C compiler): marked `#[ignore = "system: …"]`, it
//! runs only under `make test` (`--include-ignored`).

mod common;

mod babeltrace_oracle;
mod malformed;
mod model_mapping;
mod rotation_expect;
mod synthetic;
mod truncated;
mod ust_jaeger;
