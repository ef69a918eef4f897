//! The event stream's buffer (Nomad's event broker): every applied entry's events
//! (`drover_core::fsm::events`), kept for the last [`BUFFER_ENTRIES`] entries that had any,
//! so a subscriber can start from a recent index; `/v1/event/stream` follows it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use drover_core::fsm::events::Event;
use tokio::sync::watch;

/// How many entries' events are kept (Nomad's `event_buffer_size` default is 100).
pub const BUFFER_ENTRIES: usize = 100;

/// The events of one applied entry.
#[derive(Debug)]
pub struct Batch {
    pub index: u64,
    pub events: Vec<Event>,
}

pub struct EventBroker {
    batches: Mutex<VecDeque<Arc<Batch>>>,
    capacity: usize,
    /// The index of the newest batch (0: none yet).
    newest: watch::Sender<u64>,
}

impl EventBroker {
    pub fn new(capacity: usize) -> Arc<EventBroker> {
        Arc::new(EventBroker {
            batches: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity: capacity.max(1),
            newest: watch::channel(0).0,
        })
    }

    /// Keeps the events of the entry applied at `index` (nothing when there are none).
    pub fn publish(&self, index: u64, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        {
            let mut batches = self.batches.lock().expect("event buffer lock");
            if batches.len() == self.capacity {
                batches.pop_front();
            }
            batches.push_back(Arc::new(Batch { index, events }));
        }
        self.newest.send_replace(index);
    }

    /// The kept batches at or after `index`, oldest first.
    pub fn since(&self, index: u64) -> Vec<Arc<Batch>> {
        let batches = self.batches.lock().expect("event buffer lock");
        batches.iter().filter(|batch| batch.index >= index).cloned().collect()
    }

    /// Changes whenever a batch is kept.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.newest.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_core::fsm::events::Payload;

    fn event() -> Event {
        Event {
            kind: "NodeRegistration",
            payload: Payload::Node(Box::default()),
        }
    }

    #[test]
    fn the_buffer_keeps_the_newest_entries_and_answers_from_an_index() {
        let broker = EventBroker::new(3);
        let mut newest = broker.subscribe();
        broker.publish(1, vec![event()]);
        broker.publish(2, Vec::new());
        for index in 3..=6 {
            broker.publish(index, vec![event()]);
        }
        let kept: Vec<u64> = broker.since(0).iter().map(|batch| batch.index).collect();
        assert_eq!(
            kept,
            vec![4, 5, 6],
            "the oldest went; an entry without events was never kept"
        );
        let from: Vec<u64> = broker.since(5).iter().map(|batch| batch.index).collect();
        assert_eq!(from, vec![5, 6]);
        assert!(newest.has_changed().unwrap());
        assert_eq!(*newest.borrow_and_update(), 6);
    }
}
