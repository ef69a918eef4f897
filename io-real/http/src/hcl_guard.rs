//! HCL from a request is parsed off the runtime, under a deadline, at the lowest CPU priority.
//!
//! hcl-rs can take minutes on a few dozen hostile lines (`job "x" { meta { patts = "2= "/srv/ {`
//! repeated, a known fuzz finding in `io-real/http/fuzz/known/`): parsed inline on a runtime worker,
//! two such `POST /v1/jobs/parse` requests starved a 3-server cluster's leader until it lost
//! leadership (issue 54). A parse cannot be interrupted, so each runs on a thread of its own at
//! nice 19 (it takes only CPU that Raft, heartbeats and the API leave), the request is answered
//! once [`PARSE_DEADLINE`] passes, and at most [`MAX_PARSES`] parses run at once, those past their
//! deadline included: the next is refused at once rather than queued.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;

use super::ApiError;

/// What a parse may take before its request is answered with an error: a jobspec of
/// thousands of lines parses in milliseconds.
pub const PARSE_DEADLINE: Duration = Duration::from_secs(5);

/// Parses running at once, within or past their deadline.
pub const MAX_PARSES: usize = 4;

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Why a guarded parse gave no answer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("{what} took longer than {}s to parse and was abandoned", .deadline.as_secs_f64())]
    Deadline { what: &'static str, deadline: Duration },
    #[error("too many {what} parses in progress ({limit}); try again later")]
    Busy { what: &'static str, limit: usize },
    #[error("the {what} parser failed")]
    Panicked { what: &'static str },
}

impl From<GuardError> for ApiError {
    fn from(error: GuardError) -> Self {
        let status = match error {
            GuardError::Deadline { .. } => StatusCode::BAD_REQUEST,
            GuardError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GuardError::Panicked { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, error.to_string())
    }
}

/// Runs `parse` (of `what`, named in errors) under [`PARSE_DEADLINE`] and [`MAX_PARSES`].
pub async fn parse<T: Send + 'static>(
    what: &'static str,
    parse: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GuardError> {
    parse_within(what, PARSE_DEADLINE, MAX_PARSES, &RUNNING, parse).await
}

/// [`parse`] with its limits and counter given (the tests' own).
async fn parse_within<T: Send + 'static>(
    what: &'static str,
    deadline: Duration,
    limit: usize,
    running: &'static AtomicUsize,
    parse: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GuardError> {
    if running
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
            (now < limit).then_some(now + 1)
        })
        .is_err()
    {
        return Err(GuardError::Busy { what, limit });
    }
    let slot = Slot(running);
    // A deterministic simulation runs every host on one thread: the parse runs in place (a
    // thread of its own would finish at a moment set by the OS, not by the seed).
    if drover_io_real::runtime::in_simulation() {
        let parsed = parse();
        drop(slot);
        return Ok(parsed);
    }
    let (done, answered) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("hcl-parse".into()).spawn(move || {
        lowest_priority();
        let parsed = parse();
        answer(slot, parsed, |parsed| {
            let _ = done.send(parsed);
        });
    });
    if spawned.is_err() {
        // The slot went with the closure that was never run.
        return Err(GuardError::Busy { what, limit });
    }
    match tokio::time::timeout(deadline, answered).await {
        Ok(Ok(parsed)) => Ok(parsed),
        // The parse panicked: the slot was freed as its thread unwound.
        Ok(Err(_)) => Err(GuardError::Panicked { what }),
        Err(_) => Err(GuardError::Deadline { what, deadline }),
    }
}

/// Frees the parse's place, then hands its answer on (a panic frees the place as the thread
/// unwinds). Freed after the answer, the caller's next parse could find the place still
/// taken for as long as the parse's thread, at nice 19, waited for the CPU again on a busy
/// machine: a CI run answered sequential parses with 503 "too many job spec parses in
/// progress".
fn answer<T>(slot: Slot, parsed: T, deliver: impl FnOnce(T)) {
    drop(slot);
    deliver(parsed);
}

/// Frees its place among the running parses when the parse's thread ends.
struct Slot(&'static AtomicUsize);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Nice 19 for the calling thread (Linux sets a thread's priority by its id).
fn lowest_priority() {
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline no parse here comes near, however loaded the machine: a parse thread runs at
    /// nice 19, and beside a busy simulation a panic's unwinding alone once took over five
    /// seconds. Only the deadline test bets on time, and it bets that a parse blocked on a
    /// channel does not finish.
    const AMPLE: Duration = Duration::from_secs(300);

    /// Waits (as long as [`AMPLE`]) for every parse thread to end and free its slot, which it
    /// does just after answering.
    fn until_idle(running: &AtomicUsize) {
        for _ in 0..30_000 {
            if running.load(Ordering::SeqCst) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(running.load(Ordering::SeqCst), 0);
    }

    /// A parse's place is free by the time its answer is delivered, so the caller's next
    /// parse never finds it taken by the one that just answered.
    #[test]
    fn a_parse_frees_its_place_before_it_answers() {
        static RUNNING: AtomicUsize = AtomicUsize::new(1);
        let mut delivered = None;
        answer(Slot(&RUNNING), 42, |parsed| {
            delivered = Some((parsed, RUNNING.load(Ordering::SeqCst)));
        });
        assert_eq!(
            delivered,
            Some((42, 0)),
            "the place was still taken when the answer went"
        );
    }

    #[tokio::test]
    async fn a_parse_answers_within_its_deadline_and_its_slot_is_freed() {
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        let parsed = parse_within("job", AMPLE, 1, &RUNNING, || 42).await;
        assert_eq!(parsed, Ok(42));
        until_idle(&RUNNING);
    }

    #[tokio::test]
    async fn a_slow_parse_is_abandoned_at_its_deadline_and_holds_its_slot_until_it_ends() {
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        let (release, released) = std::sync::mpsc::channel::<()>();
        let slow = parse_within("job", Duration::from_millis(50), 1, &RUNNING, move || {
            released.recv().ok();
            1
        })
        .await;
        assert_eq!(
            slow,
            Err(GuardError::Deadline {
                what: "job",
                deadline: Duration::from_millis(50)
            })
        );
        assert_eq!(
            slow.unwrap_err().to_string(),
            "job took longer than 0.05s to parse and was abandoned"
        );
        // Still running past its deadline: the next parse is refused at once.
        let refused = parse_within("job", AMPLE, 1, &RUNNING, || 2).await;
        assert_eq!(refused, Err(GuardError::Busy { what: "job", limit: 1 }));
        let error: ApiError = refused.unwrap_err().into();
        assert_eq!(error.0, StatusCode::SERVICE_UNAVAILABLE);
        // Once it ends, parses are taken again.
        release.send(()).unwrap();
        let mut answered = Err(GuardError::Busy { what: "job", limit: 1 });
        for _ in 0..30_000 {
            answered = parse_within("job", AMPLE, 1, &RUNNING, || 3).await;
            if answered.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(answered, Ok(3));
    }

    /// A simulation runs every host on one thread: a parse made there runs in place, so it
    /// ends at a moment the seed sets, and frees its slot.
    #[tokio::test]
    async fn in_a_simulation_a_parse_runs_in_place() {
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        let caller = std::thread::current().id();
        drover_io_real::runtime::simulate_on_this_thread(7, || 0);
        let parsed = parse_within("job", AMPLE, 1, &RUNNING, move || std::thread::current().id() == caller).await;
        drover_io_real::runtime::stop_simulating_on_this_thread();
        assert_eq!(parsed, Ok(true), "parsed on the caller's thread");
        assert_eq!(RUNNING.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_panicking_parse_is_an_error_and_frees_its_slot() {
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        let answer: Result<u8, _> = parse_within("policy", AMPLE, 1, &RUNNING, || panic!("boom")).await;
        assert_eq!(answer, Err(GuardError::Panicked { what: "policy" }));
        until_idle(&RUNNING);
    }
}
