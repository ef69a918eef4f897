//! Volumes created and deleted through the cluster while it fails (`volume create`,
//! `volume delete`), as an operator does: an operation that errs or times out is run again,
//! the same one, until it succeeds. Once quiet, the plugin's storage must hold exactly the
//! volumes the cluster has registered ([`created_volumes`]): a retry after a crash between
//! `ControllerCreateVolume` and the Raft commit finds the volume the first attempt made.
//!
//! The churn runs beside the scenario's steps, in the gaps the runner leaves between them
//! (it borrows the cluster only while the steps wait). An operation cut off by a step is
//! simply run again after it, like a CLI call whose answer never came.

use std::time::Duration;

use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::AccessMode;
use drover_io_sim::cluster::SimCluster;
use drover_io_sim::invariants::created_volumes;
use drover_io_sim::trace::Recorder;
use rand::{Rng, SeedableRng};
use rand_chacha_03::ChaCha8Rng;
use tokio::time::Instant;

use crate::real_clients::{PLUGIN_ID, request, volume};

/// At most this many scratch volumes exist at once.
const LIVE_MAX: usize = 3;
/// How long after a refused or failed operation it is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(300);

#[derive(Clone, Debug)]
enum Op {
    Create(String),
    Delete(String),
}

pub struct Churn {
    rng: ChaCha8Rng,
    /// The next scratch volume's number.
    next: u32,
    /// Scratch volumes created (acknowledged) and not yet deleted.
    live: Vec<String>,
    /// The operation under way (retried until it succeeds).
    pending: Option<Op>,
    next_at: Instant,
    created: u32,
    deleted: u32,
    attempts: u32,
}

impl Churn {
    pub fn new(seed: u64, start: Instant) -> Self {
        Churn {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x63_6875_726e),
            next: 0,
            live: Vec::new(),
            pending: None,
            next_at: start + Duration::from_secs(2),
            created: 0,
            deleted: 0,
            attempts: 0,
        }
    }

    /// Creates and deletes scratch volumes until `until`; an operation under way then is
    /// left to be run again at the next call.
    pub async fn run_until(&mut self, cluster: &SimCluster, until: Instant) {
        while Instant::now() < until {
            if self.pending.is_none() {
                if self.next_at >= until {
                    tokio::time::sleep_until(until).await;
                    return;
                }
                tokio::time::sleep_until(self.next_at).await;
                self.pending = Some(self.choose());
            }
            let Some(op) = self.pending.clone() else { continue };
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.attempt(cluster, &op)).await {
                Ok(true) => {
                    self.done(cluster.recorder(), op);
                    self.next_at = Instant::now() + Duration::from_millis(self.rng.gen_range(200..1_500));
                }
                Ok(false) => tokio::time::sleep_until((Instant::now() + RETRY_AFTER).min(until)).await,
                Err(_) => return,
            }
        }
    }

    /// Finishes the operation under way (the cluster is quiet now), by `deadline`.
    pub async fn finish(&mut self, cluster: &SimCluster, recorder: &Recorder, deadline: Instant) {
        while let Some(op) = self.pending.clone() {
            if Instant::now() >= deadline {
                recorder.violate(
                    "a volume create or delete succeeds once the cluster is quiet",
                    format!("{op:?} still failing after {} attempts", self.attempts),
                );
                return;
            }
            if self.attempt(cluster, &op).await {
                self.done(recorder, op);
            } else {
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
        recorder.note(format!(
            "volume churn: {} created, {} deleted, {} left, in {} attempts",
            self.created,
            self.deleted,
            self.live.len(),
            self.attempts
        ));
    }

    fn choose(&mut self) -> Op {
        let create = self.live.is_empty() || (self.live.len() < LIVE_MAX && self.rng.gen_bool(0.6));
        if create {
            self.next += 1;
            Op::Create(format!("scratch-{}", self.next))
        } else {
            let pick = self.rng.gen_range(0..self.live.len());
            Op::Delete(self.live[pick].clone())
        }
    }

    /// One try of `op`: whether it succeeded.
    async fn attempt(&mut self, cluster: &SimCluster, op: &Op) -> bool {
        self.attempts += 1;
        match op {
            Op::Create(id) => {
                let create = ServerRequest::VolumeCreate {
                    volumes: vec![volume(id, AccessMode::SingleNodeWriter)],
                };
                matches!(request(cluster, create, 1).await, ServerReply::Done { .. })
            }
            Op::Delete(id) => {
                let delete = ServerRequest::VolumeDelete {
                    namespace: "default".into(),
                    volume_id: id.clone(),
                    secrets: Default::default(),
                };
                match request(cluster, delete, 1).await {
                    ServerReply::Done { .. } => true,
                    // An earlier attempt deleted it and its answer was lost.
                    ServerReply::Error(error) => error.message == format!("volume not found: {id}"),
                    _ => false,
                }
            }
        }
    }

    fn done(&mut self, recorder: &Recorder, op: Op) {
        self.pending = None;
        match op {
            Op::Create(id) => {
                recorder.note(format!("volume {id} created"));
                self.created += 1;
                self.live.push(id);
            }
            Op::Delete(id) => {
                recorder.note(format!("volume {id} deleted"));
                self.deleted += 1;
                self.live.retain(|live| *live != id);
            }
        }
    }
}

/// The storage check, once the creates and deletes are over.
pub fn check_storage(cluster: &SimCluster, recorder: &Recorder, leader: u64) {
    recorder.checked(created_volumes::NAME, 1);
    let Some(state) = crate::real_clients::leader_state(cluster, leader) else {
        recorder.violate(created_volumes::NAME, "the leader's state cannot be read".into());
        return;
    };
    let storage = cluster.storage().volumes();
    match created_volumes::one_volume_per_create(&storage, &state, PLUGIN_ID) {
        Ok(()) => recorder.note(format!(
            "the plugin holds {} volumes, each a registered volume ({} made in all)",
            storage.len(),
            cluster.storage().made()
        )),
        Err(why) => recorder.violate(created_volumes::NAME, why),
    }
}
