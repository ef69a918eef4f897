//! What the docker driver decides about containers and images, so that nothing it starts
//! outlives its allocation and no image is removed under a task (issue 57 §3, §6). The driver
//! lists, pulls and removes; these say what to list for, what to remove and when.
//!
//! - [`orphans`]: which labelled containers belong to no task of this client (left by a client
//!   killed between create and record, or by an allocation collected while the client was
//!   away). A container younger than the grace is spared: its task may be starting now.
//! - [`ImageGc`]: images in use by tasks (a start holds its image from the pull on), released
//!   when a task is destroyed, and due for removal once unused for `image_delay` (Nomad's
//!   `gc { image_delay = "3m" }`). An image a task takes again before then is kept.
//! - [`after_broken_wait`]: what a wait that broke (a daemon stopped, restarted or hung)
//!   means for the task: wait again until the engine answers, unless the container is gone.
//! - [`pull_failure`]: whether a failed pull is worth a restart (a daemon that timed out or
//!   went away) or final (no such image, refused credentials), as Nomad marks the error
//!   recoverable or not.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use crate::Instant;

/// Nomad's labels on every container it starts, read back after a restart.
pub const LABEL_ALLOC_ID: &str = "com.hashicorp.nomad.alloc_id";
pub const LABEL_TASK_NAME: &str = "com.hashicorp.nomad.task_name";

pub use crate::driverspec::docker_plugin::{CREATION_GRACE, IMAGE_DELAY};

/// Drover's own label: the client whose container it is (its allocation directory), so that
/// clients sharing one Engine never take each other's containers for orphans.
pub const LABEL_CLIENT: &str = "io.drover.client";

/// A container as the engine lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    /// Its labels (`com.hashicorp.nomad.*` on the ones Drover started).
    pub labels: BTreeMap<String, String>,
    /// When the engine created it, on the client's clock.
    pub created: Instant,
}

/// The containers to remove: those labelled as this client's (`client`, its [`LABEL_CLIENT`])
/// and with an allocation, but belonging to no task it tracks (`tracked`: allocation and
/// task), created at least `grace` before `now`. Containers without Drover's labels, or
/// another client's, are never touched. In id order.
pub fn orphans(
    listed: &[Listed],
    client: &str,
    tracked: &BTreeSet<(String, String)>,
    now: Instant,
    grace: Duration,
) -> Vec<String> {
    let mut found: Vec<String> = listed
        .iter()
        .filter(|container| {
            let Some(alloc) = container.labels.get(LABEL_ALLOC_ID) else {
                return false;
            };
            if container.labels.get(LABEL_CLIENT).map(String::as_str) != Some(client) {
                return false;
            }
            let task = container.labels.get(LABEL_TASK_NAME).cloned().unwrap_or_default();
            !tracked.contains(&(alloc.clone(), task)) && now.saturating_duration_since(container.created) >= grace
        })
        .map(|container| container.id.clone())
        .collect();
    found.sort();
    found
}

/// Which tasks use which images, and since when an unused image has been unused.
#[derive(Clone, Debug, Default)]
pub struct ImageGc {
    /// Image to the tasks (allocation, task) holding it.
    users: BTreeMap<String, BTreeSet<(String, String)>>,
    /// Images no task holds, with when the last one let go.
    idle_since: BTreeMap<String, Instant>,
}

impl ImageGc {
    /// A task takes `image` (from before its pull: the image cannot go while it starts).
    pub fn acquire(&mut self, image: &str, alloc: &str, task: &str) {
        self.idle_since.remove(image);
        self.users
            .entry(image.into())
            .or_default()
            .insert((alloc.into(), task.into()));
    }

    /// The task is destroyed: it no longer holds `image`. The image's idle time starts when
    /// the last holder lets go.
    pub fn release(&mut self, image: &str, alloc: &str, task: &str, now: Instant) {
        let Some(holders) = self.users.get_mut(image) else {
            return;
        };
        holders.remove(&(alloc.to_string(), task.to_string()));
        if holders.is_empty() {
            self.users.remove(image);
            self.idle_since.insert(image.into(), now);
        }
    }

    /// The images unused for at least `delay` at `now`, forgotten as they are handed out (the
    /// driver removes them; one it cannot remove is the engine's to keep). In name order.
    pub fn due(&mut self, now: Instant, delay: Duration) -> Vec<String> {
        let due: Vec<String> = self
            .idle_since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= delay)
            .map(|(image, _)| image.clone())
            .collect();
        for image in &due {
            self.idle_since.remove(image);
        }
        due
    }

    /// When the next image falls due, if any is idle.
    pub fn next_due(&self, delay: Duration) -> Option<Instant> {
        self.idle_since.values().min().map(|since| *since + delay)
    }

    /// Whether a task holds `image` now.
    pub fn in_use(&self, image: &str) -> bool {
        self.users.contains_key(image)
    }
}

/// Why a pull failed, as the engine's answer says it (its status code, never its text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PullFailure {
    /// The registry has no such image or tag (404).
    NotFound,
    /// The registry refused the credentials (401/403).
    Unauthorized,
    /// The pull outlasted `image_pull_timeout`.
    Timeout,
    /// The engine could not be reached, or failed (5xx).
    Daemon,
}

/// Whether a start that failed its pull is worth restarting under the task's restart policy
/// (`true`), or fails the task for good: a missing image or refused credentials will not be
/// there on the next attempt either.
pub fn pull_failure(failure: PullFailure) -> bool {
    match failure {
        PullFailure::NotFound | PullFailure::Unauthorized => false,
        PullFailure::Timeout | PullFailure::Daemon => true,
    }
}

/// What the driver does when its wait on a container ended without the container's exit: the
/// daemon stopped, restarted or hung under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokenWait {
    /// The engine no longer knows the container: it is gone, with no status to read.
    Gone,
    /// Ask again after this pause: a daemon that comes back answers for the container (and
    /// one stopped with its daemon is read as exited then).
    WaitAgain(Duration),
    /// Stop watching the container (only the regression switch `abandon_broken_waits` does
    /// this: its task is then reported running for as long as the client lives).
    Abandon,
}

/// The first pause before a broken wait is asked again, and the longest.
pub const WAIT_RETRY_FIRST: Duration = Duration::from_millis(200);
pub const WAIT_RETRY_MAX: Duration = Duration::from_secs(5);

/// What follows the `attempt`th (from 0) broken wait on a container: `not_found` when the
/// engine answered that it has no such container. A daemon that went away is waited out,
/// the pause doubling from 200 ms to at most 5 s, however long it stays away: the task's
/// container may be running still (a hung daemon), and only the engine can say it is not.
pub fn after_broken_wait(not_found: bool, attempt: u32, faults: &crate::config::ClientFaults) -> BrokenWait {
    if not_found {
        return BrokenWait::Gone;
    }
    if faults.abandon_broken_waits {
        return BrokenWait::Abandon;
    }
    let pause = WAIT_RETRY_FIRST.saturating_mul(1u32 << attempt.min(16));
    BrokenWait::WaitAgain(pause.min(WAIT_RETRY_MAX))
}

/// What a container engine says it is, when it answers: its version, its runtimes and
/// whether it is podman's compatible API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineFacts {
    pub version: Option<String>,
    pub runtimes: Vec<String>,
    pub podman: bool,
}

/// Nomad's text for a driver whose daemon does not answer.
pub const ENGINE_UNREACHABLE: &str = "Failed to connect to docker daemon";

/// The driver's fingerprint from what the engine answered (`None`: it did not) and whether it
/// had answered before: a daemon never reached leaves the driver undetected; one that stopped
/// answering makes it unhealthy, so feasibility stops placing docker tasks on the node. Returns
/// (detected, healthy, description, Nomad's `driver.docker.*` attributes).
pub fn fingerprint(
    facts: Option<&EngineFacts>,
    answered_before: bool,
    plugin: &crate::driverspec::docker_plugin::DockerPluginConfig,
) -> (bool, bool, &'static str, BTreeMap<String, String>) {
    let Some(facts) = facts else {
        return (answered_before, false, ENGINE_UNREACHABLE, BTreeMap::new());
    };
    let mut attributes = BTreeMap::new();
    attributes.insert("driver.docker".into(), "true".into());
    if let Some(version) = &facts.version {
        attributes.insert("driver.docker.version".into(), version.clone());
    }
    if plugin.allow_privileged {
        attributes.insert("driver.docker.privileged.enabled".into(), "true".into());
    }
    if plugin.volumes_enabled {
        attributes.insert("driver.docker.volumes.enabled".into(), "true".into());
    }
    if !facts.runtimes.is_empty() {
        let runtimes: BTreeSet<&String> = facts.runtimes.iter().collect();
        let names: Vec<&str> = runtimes.into_iter().map(String::as_str).collect();
        attributes.insert("driver.docker.runtimes".into(), names.join(","));
    }
    if facts.podman {
        attributes.insert("driver.docker.engine".into(), "podman".into());
    }
    (true, true, "Healthy", attributes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_wait_is_asked_again_until_the_engine_says_the_container_is_gone() {
        let faults = crate::config::ClientFaults::default();
        let pauses: Vec<BrokenWait> = (0..7)
            .map(|attempt| after_broken_wait(false, attempt, &faults))
            .collect();
        let ms = |ms| BrokenWait::WaitAgain(Duration::from_millis(ms));
        assert_eq!(
            pauses,
            [ms(200), ms(400), ms(800), ms(1600), ms(3200), ms(5000), ms(5000)]
        );
        assert_eq!(after_broken_wait(false, 1_000, &faults), ms(5000));
        assert_eq!(after_broken_wait(true, 0, &faults), BrokenWait::Gone);
        let abandon = crate::config::ClientFaults {
            abandon_broken_waits: true,
            ..Default::default()
        };
        assert_eq!(after_broken_wait(false, 0, &abandon), BrokenWait::Abandon);
        assert_eq!(after_broken_wait(true, 0, &abandon), BrokenWait::Gone);
    }

    fn listed(id: &str, alloc: Option<&str>, task: &str, created_s: u64) -> Listed {
        let mut labels = BTreeMap::new();
        if let Some(alloc) = alloc {
            labels.insert(LABEL_ALLOC_ID.to_string(), alloc.to_string());
            labels.insert(LABEL_TASK_NAME.to_string(), task.to_string());
            labels.insert(LABEL_CLIENT.to_string(), "/data/alloc".to_string());
        }
        Listed {
            id: id.into(),
            labels,
            created: Instant::from_millis(created_s * 1000),
        }
    }

    #[test]
    fn only_old_labelled_containers_of_no_tracked_task_are_orphans() {
        let containers = [
            listed("c-tracked", Some("a1"), "web", 0),
            listed("c-gone", Some("a0"), "web", 0),
            listed("c-young", Some("a9"), "web", 590),
            listed("c-foreign", None, "", 0),
            listed("c-other-task", Some("a1"), "sidecar", 0),
            Listed {
                id: "c-other-client".into(),
                labels: BTreeMap::from([
                    (LABEL_ALLOC_ID.to_string(), "a7".to_string()),
                    (LABEL_TASK_NAME.to_string(), "web".to_string()),
                    (LABEL_CLIENT.to_string(), "/elsewhere/alloc".to_string()),
                ]),
                created: Instant::ZERO,
            },
        ];
        let tracked = BTreeSet::from([("a1".to_string(), "web".to_string())]);
        let now = Instant::from_millis(600_000);
        assert_eq!(
            orphans(&containers, "/data/alloc", &tracked, now, CREATION_GRACE),
            ["c-gone", "c-other-task"]
        );
    }

    #[test]
    fn an_image_is_due_only_once_unused_for_the_delay() {
        let mut gc = ImageGc::default();
        let at = |s: u64| Instant::from_millis(s * 1000);
        gc.acquire("busybox:1", "a1", "t");
        gc.acquire("busybox:1", "a2", "t");
        gc.release("busybox:1", "a1", "t", at(10));
        assert!(gc.in_use("busybox:1"));
        assert_eq!(gc.next_due(IMAGE_DELAY), None);
        gc.release("busybox:1", "a2", "t", at(20));
        assert_eq!(gc.next_due(IMAGE_DELAY), Some(at(200)));
        assert!(gc.due(at(199), IMAGE_DELAY).is_empty());
        // Taken again before the delay: kept, and the clock starts over when let go.
        gc.acquire("busybox:1", "a3", "t");
        assert!(gc.due(at(500), IMAGE_DELAY).is_empty());
        gc.release("busybox:1", "a3", "t", at(600));
        assert_eq!(gc.due(at(780), IMAGE_DELAY), ["busybox:1"]);
        assert!(gc.due(at(10_000), IMAGE_DELAY).is_empty());
    }

    #[test]
    fn a_missing_image_or_refused_credentials_are_final() {
        assert!(!pull_failure(PullFailure::NotFound));
        assert!(!pull_failure(PullFailure::Unauthorized));
        assert!(pull_failure(PullFailure::Timeout));
        assert!(pull_failure(PullFailure::Daemon));
    }

    #[test]
    fn an_engine_never_reached_is_undetected_one_gone_unhealthy_one_answering_attributed() {
        use crate::driverspec::docker_plugin::DockerPluginConfig;
        let plugin = DockerPluginConfig {
            allow_privileged: true,
            ..DockerPluginConfig::default()
        };
        assert_eq!(
            fingerprint(None, false, &plugin),
            (false, false, ENGINE_UNREACHABLE, BTreeMap::new())
        );
        assert!(fingerprint(None, true, &plugin).0);
        let facts = EngineFacts {
            version: Some("20.10.24".into()),
            runtimes: vec!["runc".into(), "io.containerd.runc.v2".into()],
            podman: false,
        };
        let (detected, healthy, description, attributes) = fingerprint(Some(&facts), false, &plugin);
        assert!(detected && healthy);
        assert_eq!(description, "Healthy");
        assert_eq!(attributes["driver.docker.version"], "20.10.24");
        assert_eq!(attributes["driver.docker.runtimes"], "io.containerd.runc.v2,runc");
        assert_eq!(attributes["driver.docker.privileged.enabled"], "true");
        assert!(!attributes.contains_key("driver.docker.engine"));
    }
}
