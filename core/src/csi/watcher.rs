//! The volume watcher (reference §3.6) and the CSI garbage-collection core jobs (§3.8):
//! leader-only decisions about *when* to release claims. The release itself is the
//! unpublish walk of [`crate::rpc::RpcEndpoints`].
//!
//! The watcher rescans the volumes table whenever its index moves and keeps one worker per
//! volume with past claims. A worker makes a pass (re-driving every past claim not already
//! being released) when its token bucket allows — 1 per second, burst 3 — and again a second
//! later for as long as past claims remain, so failed releases are retried. Leadership lost
//! drops every worker; a new leader rebuilds them from the stored claims and resumes each
//! release from its last checkpoint.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use crate::fsm::{ServerState, Table};
use crate::structs::CsiVolumeClaim;
use crate::time::Instant;

/// Nomad's volume watcher limiter: 1 pass per second, burst 3.
const PASS_INTERVAL: Duration = Duration::from_secs(1);
const BURST: u32 = 3;

pub use crate::config::GcConfig;

#[derive(Clone, Debug)]
struct Worker {
    tokens: u32,
    refilled_at: Instant,
    next_pass: Instant,
}

/// What the watcher and GC want done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatcherAction {
    Unpublish {
        namespace: String,
        volume_id: String,
        claim: CsiVolumeClaim,
    },
    /// Claim GC: bump a volume's index so its release is looked at again.
    ClaimGc {
        namespace: String,
        volume_id: String,
    },
    DeletePlugin {
        plugin_id: String,
    },
}

#[derive(Debug)]
pub struct VolumeWatcher {
    enabled: bool,
    gc: GcConfig,
    seen_index: Option<u64>,
    workers: BTreeMap<(String, String), Worker>,
    claim_gc_at: Option<Instant>,
    plugin_gc_at: Option<Instant>,
}

impl VolumeWatcher {
    pub fn new(gc: GcConfig) -> Self {
        VolumeWatcher {
            enabled: false,
            gc,
            seen_index: None,
            workers: BTreeMap::new(),
            claim_gc_at: None,
            plugin_gc_at: None,
        }
    }

    /// Started on leadership gained, stopped (and emptied) on leadership lost.
    pub fn set_enabled(&mut self, now: Instant, enabled: bool) {
        if enabled == self.enabled {
            return;
        }
        self.enabled = enabled;
        self.workers.clear();
        self.seen_index = None;
        self.claim_gc_at = enabled.then_some(now + self.gc.claim_gc_interval);
        self.plugin_gc_at = enabled.then_some(now + self.gc.plugin_gc_interval);
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Rescans on table changes and runs due passes and GC jobs. `releasing` says whether a
    /// claim's release is already under way.
    pub fn run(
        &mut self,
        now: Instant,
        state: &ServerState,
        releasing: &BTreeSet<(String, String, String)>,
    ) -> Vec<WatcherAction> {
        let mut actions = Vec::new();
        if !self.enabled {
            return actions;
        }
        let index = state.table_index(Table::CsiVolumes);
        if self.seen_index != Some(index) {
            self.seen_index = Some(index);
            self.rescan(now, state);
        }
        let due: Vec<(String, String)> = self
            .workers
            .iter()
            .filter(|(_, worker)| worker.next_pass <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            let Some(volume) = state.volume(&key.0, &key.1) else {
                self.workers.remove(&key);
                continue;
            };
            if volume.past_claims.is_empty() {
                self.workers.remove(&key);
                continue;
            }
            let worker = self.workers.get_mut(&key).expect("present");
            let refills =
                (now.saturating_duration_since(worker.refilled_at).as_millis() / PASS_INTERVAL.as_millis()) as u32;
            if refills > 0 {
                worker.tokens = (worker.tokens + refills).min(BURST);
                worker.refilled_at = now;
            }
            if worker.tokens == 0 {
                worker.next_pass = worker.refilled_at + PASS_INTERVAL;
                continue;
            }
            worker.tokens -= 1;
            worker.next_pass = now + PASS_INTERVAL;
            for claim in volume.past_claims.values() {
                let claim_key = (key.0.clone(), key.1.clone(), claim.allocation_id.clone());
                if !releasing.contains(&claim_key) {
                    actions.push(WatcherAction::Unpublish {
                        namespace: key.0.clone(),
                        volume_id: key.1.clone(),
                        claim: claim.clone(),
                    });
                }
            }
        }
        actions.extend(self.run_gc(now, state));
        actions
    }

    fn rescan(&mut self, now: Instant, state: &ServerState) {
        let mut live = BTreeSet::new();
        for (namespace, id) in state.volume_keys() {
            let Some(volume) = state.volume(namespace, id) else {
                continue;
            };
            if volume.past_claims.is_empty() {
                continue;
            }
            let key = (namespace.clone(), id.clone());
            live.insert(key.clone());
            let worker = self.workers.entry(key).or_insert(Worker {
                tokens: BURST,
                refilled_at: now,
                next_pass: now,
            });
            // A change to the volume deserves a prompt look (still rate limited).
            worker.next_pass = worker.next_pass.min(now);
        }
        self.workers.retain(|key, _| live.contains(key));
    }

    fn run_gc(&mut self, now: Instant, state: &ServerState) -> Vec<WatcherAction> {
        let mut actions = Vec::new();
        let cluster_now_ms = state.last_applied_time_ms();
        if self.claim_gc_at.is_some_and(|at| at <= now) {
            self.claim_gc_at = Some(now + self.gc.claim_gc_interval);
            let threshold_ms = self.gc.claim_gc_threshold.as_millis() as u64;
            for (namespace, id) in state.volume_keys() {
                let Some(volume) = state.volume(namespace, id) else {
                    continue;
                };
                if !volume.past_claims.is_empty()
                    && cluster_now_ms.saturating_sub(volume.modify_time_ms) >= threshold_ms
                {
                    actions.push(WatcherAction::ClaimGc {
                        namespace: namespace.clone(),
                        volume_id: id.clone(),
                    });
                }
            }
        }
        if self.plugin_gc_at.is_some_and(|at| at <= now) {
            self.plugin_gc_at = Some(now + self.gc.plugin_gc_interval);
            let threshold_ms = self.gc.plugin_gc_threshold.as_millis() as u64;
            for plugin in state.plugins() {
                if plugin.is_empty() && cluster_now_ms.saturating_sub(plugin.modify_time_ms) >= threshold_ms {
                    actions.push(WatcherAction::DeletePlugin {
                        plugin_id: plugin.id.clone(),
                    });
                }
            }
        }
        actions
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.enabled {
            return None;
        }
        [
            self.workers.values().map(|worker| worker.next_pass).min(),
            self.claim_gc_at,
            self.plugin_gc_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}
