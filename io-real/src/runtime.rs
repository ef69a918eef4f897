//! The openraft [`AsyncRuntime`] Drover runs Raft on.
//!
//! It is written against `tokio` as the workspace names it, which is madsim's shim: plain tokio
//! in production and madsim's deterministic executor under `--cfg madsim`. The only types
//! whose names differ between the two (the instant and the timeout future) are defined here, so
//! one runtime serves both worlds.

use std::fmt;
use std::future::Future;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend};

#[derive(Debug, Default, PartialEq, Eq)]
pub struct DroverRuntime;

/// The runtime's random generator: the OS-seeded thread generator in production, the
/// simulator's seeded global generator under madsim (where `getrandom`'s raw syscall would
/// otherwise escape the seed).
#[cfg(not(madsim))]
pub type RuntimeRng = rand::rngs::ThreadRng;
#[cfg(madsim)]
pub type RuntimeRng = madsim::rand::GlobalRng;

pub fn runtime_rng() -> RuntimeRng {
    #[cfg(not(madsim))]
    {
        rand::thread_rng()
    }
    #[cfg(madsim)]
    {
        madsim::rand::thread_rng()
    }
}

/// A random value from the runtime's generator (see [`RuntimeRng`]).
pub fn random<T>() -> T
where
    rand::distributions::Standard: rand::distributions::Distribution<T>,
{
    use rand::Rng;
    runtime_rng().r#gen()
}

/// `tokio::time::Instant` (madsim's virtual instant under simulation) as an openraft instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RaftInstant(pub tokio::time::Instant);

impl openraft::Instant for RaftInstant {
    fn now() -> Self {
        RaftInstant(tokio::time::Instant::now())
    }
}

impl Add<Duration> for RaftInstant {
    type Output = RaftInstant;
    fn add(self, rhs: Duration) -> RaftInstant {
        RaftInstant(self.0 + rhs)
    }
}

impl AddAssign<Duration> for RaftInstant {
    fn add_assign(&mut self, rhs: Duration) {
        self.0 += rhs;
    }
}

impl Sub<Duration> for RaftInstant {
    type Output = RaftInstant;
    fn sub(self, rhs: Duration) -> RaftInstant {
        RaftInstant(self.0 - rhs)
    }
}

impl Sub<RaftInstant> for RaftInstant {
    type Output = Duration;
    fn sub(self, rhs: RaftInstant) -> Duration {
        self.0.saturating_duration_since(rhs.0)
    }
}

impl SubAssign<Duration> for RaftInstant {
    fn sub_assign(&mut self, rhs: Duration) {
        self.0 -= rhs;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// A future with a deadline, built from the runtime's `Sleep` so it works in both worlds.
pub struct Timeout<T> {
    future: Pin<Box<T>>,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl<R, T: Future<Output = R>> Future for Timeout<T> {
    type Output = Result<R, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(value) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(value));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

pub struct OneshotSender<T>(tokio::sync::oneshot::Sender<T>);

impl<T> fmt::Debug for OneshotSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OneshotSender")
    }
}

impl<T: OptionalSend> openraft::async_runtime::AsyncOneshotSendExt<T> for OneshotSender<T> {
    fn send(self, value: T) -> Result<(), T> {
        self.0.send(value)
    }
}

impl AsyncRuntime for DroverRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = RaftInstant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<T>;
    type ThreadLocalRng = RuntimeRng;
    type OneshotSender<T: OptionalSend> = OneshotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline.0)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        Timeout {
            future: Box::pin(future),
            sleep: Box::pin(tokio::time::sleep(duration)),
        }
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        Timeout {
            future: Box::pin(future),
            sleep: Box::pin(tokio::time::sleep_until(deadline.0)),
        }
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        runtime_rng()
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (OneshotSender(tx), rx)
    }
}

/// Runs CPU-heavy work that nothing waits on urgently (encoding a Raft snapshot: seconds of CPU
/// on a large state) off the runtime's workers, on its own thread at a lower CPU priority
/// (nice +10), so Raft heartbeats, applies and API requests keep their cores while it runs.
/// Under madsim it runs in place, deterministically. `None` when the thread could not start or
/// the work panicked.
pub async fn background<R: Send + 'static>(name: &str, work: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    #[cfg(not(madsim))]
    {
        let (done, result) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                lower_this_threads_priority();
                let _ = done.send(work());
            })
            .ok()?;
        result.await.ok()
    }
    #[cfg(madsim)]
    {
        // The simulator has no blocking pool: the work runs in place, in virtual no time.
        let _ = name;
        Some(work())
    }
}

/// Linux keeps a nice value per thread: this lowers the calling thread's only.
#[cfg(not(madsim))]
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id; a failure only leaves the
    // priority as it was.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}
