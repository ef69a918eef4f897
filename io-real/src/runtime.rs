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
/// otherwise escape the seed), and a generator seeded per run on a thread that
/// [`simulate_on_this_thread`] marked (the turmoil lane).
#[cfg(not(madsim))]
pub use simulated::RuntimeRng;
#[cfg(madsim)]
pub type RuntimeRng = madsim::rand::GlobalRng;

pub fn runtime_rng() -> RuntimeRng {
    #[cfg(not(madsim))]
    {
        simulated::rng()
    }
    #[cfg(madsim)]
    {
        madsim::rand::thread_rng()
    }
}

#[cfg(not(madsim))]
pub(crate) use simulated::wall_clock_millis as simulated_wall_clock_millis;
#[cfg(not(madsim))]
pub use simulated::{in_simulation, simulate_on_this_thread, stop_simulating_on_this_thread};

/// Deterministic simulation of the production stack on one thread (turmoil runs every host of
/// a simulated network on the thread that drives it). On a marked thread the driver's random
/// draws come from one generator seeded per run, its wall clock is the simulation's, and work
/// that production hands to another OS thread (snapshot encoding, large list reads) runs in
/// place, so nothing depends on how the OS schedules threads. Unmarked threads, which is every
/// thread of a real agent, behave as production always has.
#[cfg(not(madsim))]
mod simulated {
    use std::cell::{Cell, RefCell};

    use rand::rngs::StdRng;
    use rand::{RngCore, SeedableRng};

    thread_local! {
        static RNG: RefCell<Option<StdRng>> = const { RefCell::new(None) };
        static WALL_CLOCK: Cell<Option<fn() -> u64>> = const { Cell::new(None) };
    }

    /// Marks the calling thread as running a deterministic simulation: random draws from a
    /// generator seeded with `seed`, wall-clock milliseconds from `wall_clock`.
    pub fn simulate_on_this_thread(seed: u64, wall_clock: fn() -> u64) {
        RNG.with(|rng| *rng.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
        WALL_CLOCK.with(|clock| clock.set(Some(wall_clock)));
    }

    pub fn stop_simulating_on_this_thread() {
        RNG.with(|rng| *rng.borrow_mut() = None);
        WALL_CLOCK.with(|clock| clock.set(None));
    }

    pub fn in_simulation() -> bool {
        WALL_CLOCK.with(Cell::get).is_some()
    }

    /// The simulation's wall clock, on a marked thread.
    pub(crate) fn wall_clock_millis() -> Option<u64> {
        WALL_CLOCK.with(Cell::get).map(|clock| clock())
    }

    /// The OS-seeded thread generator, or the run's seeded one on a marked thread.
    pub enum RuntimeRng {
        Os(rand::rngs::ThreadRng),
        Simulated,
    }

    pub(super) fn rng() -> RuntimeRng {
        if RNG.with(|rng| rng.borrow().is_some()) {
            RuntimeRng::Simulated
        } else {
            RuntimeRng::Os(rand::thread_rng())
        }
    }

    impl RuntimeRng {
        fn with<R>(&mut self, draw: impl FnOnce(&mut dyn RngCore) -> R) -> R {
            match self {
                RuntimeRng::Os(rng) => draw(rng),
                RuntimeRng::Simulated => RNG.with(|rng| match rng.borrow_mut().as_mut() {
                    Some(rng) => draw(rng),
                    // The simulation ended while this generator was held: draw as production.
                    None => draw(&mut rand::thread_rng()),
                }),
            }
        }
    }

    impl RngCore for RuntimeRng {
        fn next_u32(&mut self) -> u32 {
            self.with(|rng| rng.next_u32())
        }

        fn next_u64(&mut self) -> u64 {
            self.with(|rng| rng.next_u64())
        }

        fn fill_bytes(&mut self, dest: &mut [u8]) {
            self.with(|rng| rng.fill_bytes(dest))
        }

        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
            self.with(|rng| rng.try_fill_bytes(dest))
        }
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

/// A version-4 UUID's text from 128 bits of the runtime's generator: the OS-seeded one in
/// production (node and ACL token secrets), the run's seeded one in a simulation.
pub fn random_uuid() -> String {
    let high: u64 = (random::<u64>() & !0xf000) | 0x4000;
    let low: u64 = (random::<u64>() & !(0b11 << 62)) | (0b10 << 62);
    let hex = format!("{high:016x}{low:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
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
        if in_simulation() {
            return Some(work());
        }
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

/// Runs blocking work on tokio's blocking pool, or in place in a simulation (madsim's, and
/// the turmoil lane's: see `simulate_on_this_thread`). `None` when the work panicked.
pub async fn blocking<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    #[cfg(not(madsim))]
    {
        if in_simulation() {
            return Some(work());
        }
        tokio::task::spawn_blocking(work).await.ok()
    }
    #[cfg(madsim)]
    {
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

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_are_random_version_4() {
        let (a, b) = (super::random_uuid(), super::random_uuid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
