//! Helpers shared by the modules of this test binary.

use std::sync::{Mutex, MutexGuard};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The one lock of this binary: every test that records the kernel takes it
/// for its whole run. Such a test creates a tracefs instance, records
/// system-wide (or a workload it stages) and judges what the kernel handed
/// out, so two at once on the machine's two CPUs would be each other's
/// noise. A test that failed while holding it does not fail the others
/// (poison ignored).
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}
