//! Polling until a condition holds, with a limit.

use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it returns `Some` or `limit` passes.
pub fn wait_for<T>(limit: Duration, check: impl FnMut() -> Option<T>) -> Option<T> {
    wait_for_every(limit, Duration::from_millis(50), check)
}

/// [`wait_for`], checking every `step` (benches measure to a few milliseconds).
pub fn wait_for_every<T>(limit: Duration, step: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(step);
    }
}
