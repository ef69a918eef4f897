//! Wakes blocking queries when the applied server state changes.
//!
//! A `tokio::sync::watch` channel would do the job, but `watch` spreads its waiters over eight
//! queues chosen by tokio's thread-local generator, and that generator is seeded from a
//! process-wide counter. The order in which waiters wake would then depend on what else the
//! process had run before, and a simulated run would not replay byte for byte. One
//! [`Notify`] wakes its waiters in the order they registered, which the simulation controls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

/// A change counter with waiters. Cheap to clone; clones share the counter.
#[derive(Clone, Default)]
pub struct Changes {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    count: AtomicU64,
    notify: Notify,
}

impl Changes {
    /// How many changes there have been. Read it before checking the condition a caller waits
    /// for, then hand it to [`Changes::changed_since`], so a change in between is not missed.
    pub fn count(&self) -> u64 {
        self.inner.count.load(Ordering::SeqCst)
    }

    /// Records a change and wakes every waiter.
    pub fn bump(&self) {
        self.inner.count.fetch_add(1, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Waits until there has been a change after `seen` (a value of [`Changes::count`]);
    /// `false` when `deadline` came first.
    pub async fn changed_since(&self, seen: u64, deadline: Instant) -> bool {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            // Registered before the counter is read: a bump after the read still wakes us.
            notified.as_mut().enable();
            if self.count() > seen {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, notified).await.is_err() {
                return self.count() > seen;
            }
        }
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiter_sees_a_change_made_after_it_read_the_count() {
        let changes = Changes::default();
        let seen = changes.count();
        let waiter = {
            let changes = changes.clone();
            tokio::spawn(async move {
                changes
                    .changed_since(seen, Instant::now() + Duration::from_secs(5))
                    .await
            })
        };
        tokio::task::yield_now().await;
        changes.bump();
        assert!(waiter.await.expect("waiter"));
    }

    #[tokio::test]
    async fn a_change_before_the_wait_returns_at_once() {
        let changes = Changes::default();
        let seen = changes.count();
        changes.bump();
        assert!(changes.changed_since(seen, Instant::now()).await);
    }

    #[tokio::test]
    async fn no_change_times_out() {
        let changes = Changes::default();
        let seen = changes.count();
        assert!(
            !changes
                .changed_since(seen, Instant::now() + Duration::from_millis(20))
                .await
        );
    }
}
