//! A CSI conformance check of our own, written from the CSI spec (v1.9): table-driven cases,
//! each run only when the plugin advertises what it needs, against any plugin's socket. It
//! holds `drover-csi-fake` to the spec in every configuration of its flags, and a plugin
//! author can point it at theirs: `cargo run --bin drover-csi-check -- unix:///path/csi.sock`.
//!
//! Every case makes its own volumes and snapshots (names prefixed with the run's id) and
//! removes them after, pass or fail. Node cases stage and publish under `work_dir`.

mod cases;

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use drover_proto::csi::v1 as csi;

use crate::csi::CsiClient;

/// What one case needs the plugin to advertise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    Nothing,
    Controller,
    /// A controller RPC capability.
    Rpc(csi::controller_service_capability::rpc::Type),
    /// A node RPC capability.
    NodeRpc(csi::node_service_capability::rpc::Type),
    Topology,
    /// The node's id, from the node service's `NodeGetInfo` (not asked with
    /// `--controller-only`): a case that publishes to this node needs it.
    NodeId,
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Need::Nothing => f.write_str("nothing"),
            Need::Controller => f.write_str("CONTROLLER_SERVICE"),
            Need::Rpc(kind) => f.write_str(kind.as_str_name()),
            Need::NodeRpc(kind) => write!(f, "node {}", kind.as_str_name()),
            Need::Topology => f.write_str("VOLUME_ACCESSIBILITY_CONSTRAINTS"),
            Need::NodeId => f.write_str("the node service's NodeGetInfo"),
        }
    }
}

/// What the plugin advertises.
#[derive(Clone, Debug, Default)]
pub struct Advertised {
    pub controller_service: bool,
    pub topology_constraints: bool,
    pub controller: BTreeSet<i32>,
    pub node: BTreeSet<i32>,
    pub node_id: String,
    pub node_topology: Option<csi::Topology>,
}

impl Advertised {
    fn has(&self, need: Need) -> bool {
        match need {
            Need::Nothing => true,
            Need::Controller => self.controller_service,
            Need::Rpc(kind) => self.controller_service && self.controller.contains(&(kind as i32)),
            Need::NodeRpc(kind) => self.node.contains(&(kind as i32)),
            Need::Topology => self.topology_constraints && self.node_topology.is_some(),
            Need::NodeId => !self.node_id.is_empty(),
        }
    }
}

/// One case's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail(String),
    /// The plugin does not advertise what the case needs.
    Skip(String),
}

#[derive(Clone, Debug)]
pub struct CaseResult {
    pub name: &'static str,
    pub verdict: Verdict,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub plugin: String,
    pub results: Vec<CaseResult>,
}

impl Report {
    pub fn count(&self, wanted: fn(&Verdict) -> bool) -> usize {
        self.results.iter().filter(|result| wanted(&result.verdict)).count()
    }

    pub fn passed(&self) -> bool {
        self.count(|verdict| matches!(verdict, Verdict::Fail(_))) == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "CSI conformance of {}", self.plugin)?;
        for result in &self.results {
            match &result.verdict {
                Verdict::Pass => writeln!(f, "PASS  {}", result.name)?,
                Verdict::Fail(why) => writeln!(f, "FAIL  {}: {why}", result.name)?,
                Verdict::Skip(why) => writeln!(f, "SKIP  {} ({why})", result.name)?,
            }
        }
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.count(|verdict| *verdict == Verdict::Pass),
            self.count(|verdict| matches!(verdict, Verdict::Fail(_))),
            self.count(|verdict| matches!(verdict, Verdict::Skip(_))),
        )
    }
}

type CaseFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// One row of the table: a name, what it needs, and the check.
pub(crate) struct Case {
    pub name: &'static str,
    pub needs: &'static [Need],
    pub run: for<'a> fn(&'a Check) -> CaseFuture<'a>,
}

/// A run against one plugin.
pub struct Check {
    pub(crate) client: CsiClient,
    pub(crate) advertised: Advertised,
    /// Prefix of every name this run makes.
    pub(crate) prefix: String,
    pub(crate) work_dir: PathBuf,
    /// Cases that touch the node service (mounts) run only when true.
    pub(crate) node: bool,
}

/// How long one call may take before the case fails.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl Check {
    /// Connects to the plugin at `endpoint` ("unix:///path" or a path) and reads what it
    /// advertises.
    pub async fn connect(endpoint: &str, work_dir: PathBuf, node: bool) -> Result<Check, String> {
        let client = CsiClient::connect(endpoint, CALL_TIMEOUT)
            .await
            .map_err(|error| error.to_string())?;
        let mut advertised = Advertised::default();
        let capabilities = client
            .identity()
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await
            .map_err(|status| format!("GetPluginCapabilities: {status}"))?
            .into_inner();
        use csi::plugin_capability::service::Type as Service;
        for capability in capabilities.capabilities {
            if let Some(csi::plugin_capability::Type::Service(service)) = capability.r#type {
                match Service::try_from(service.r#type) {
                    Ok(Service::ControllerService) => advertised.controller_service = true,
                    Ok(Service::VolumeAccessibilityConstraints) => advertised.topology_constraints = true,
                    _ => {}
                }
            }
        }
        if advertised.controller_service {
            let answer = client
                .controller()
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
                .map_err(|status| format!("ControllerGetCapabilities: {status}"))?
                .into_inner();
            for capability in answer.capabilities {
                if let Some(csi::controller_service_capability::Type::Rpc(rpc)) = capability.r#type {
                    advertised.controller.insert(rpc.r#type);
                }
            }
        }
        if node {
            let answer = client
                .node()
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                .await
                .map_err(|status| format!("NodeGetCapabilities: {status}"))?
                .into_inner();
            for capability in answer.capabilities {
                if let Some(csi::node_service_capability::Type::Rpc(rpc)) = capability.r#type {
                    advertised.node.insert(rpc.r#type);
                }
            }
            let info = client
                .node()
                .node_get_info(csi::NodeGetInfoRequest {})
                .await
                .map_err(|status| format!("NodeGetInfo: {status}"))?
                .into_inner();
            advertised.node_id = info.node_id;
            advertised.node_topology = info.accessible_topology;
        }
        let prefix = format!("drover-check-{}", &drover_io_real::runtime::random_uuid()[..8]);
        std::fs::create_dir_all(&work_dir).map_err(|error| format!("work dir {}: {error}", work_dir.display()))?;
        Ok(Check {
            client,
            advertised,
            prefix,
            work_dir,
            node,
        })
    }

    /// Runs every case the plugin advertises what it needs for.
    pub async fn run(&self) -> Report {
        let plugin = match self
            .client
            .identity()
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await
        {
            Ok(info) => {
                let info = info.into_inner();
                format!(
                    "{} {} at {}",
                    info.name,
                    info.vendor_version,
                    self.client.socket().display()
                )
            }
            Err(status) => format!("the plugin at {} ({status})", self.client.socket().display()),
        };
        let mut report = Report {
            plugin,
            results: Vec::new(),
        };
        for case in cases::cases() {
            let missing = case.needs.iter().find(|need| !self.advertised.has(**need));
            let node_case = case.name.starts_with("Node");
            let verdict = match missing {
                _ if node_case && !self.node => Verdict::Skip("node cases not asked for".into()),
                Some(need) => Verdict::Skip(format!("not advertised: {need}")),
                None => match (case.run)(self).await {
                    Ok(()) => Verdict::Pass,
                    Err(why) => Verdict::Fail(why),
                },
            };
            report.results.push(CaseResult {
                name: case.name,
                verdict,
            });
        }
        report
    }

    /// A name of this run's.
    pub(crate) fn name(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix)
    }
}

/// Removes the empty directories at and below `dir`, deepest first, and returns what is left:
/// files and directories that are not empty (a mount a case could not undo keeps its
/// directory busy), never deleted, only named. Links are not followed. `keep_root` leaves
/// `dir` itself (a `--work-dir` the operator gave).
pub fn remove_empty_dirs(dir: &Path, keep_root: bool) -> Vec<PathBuf> {
    fn walk(dir: &Path, left: &mut Vec<PathBuf>) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return false;
        };
        let mut empty = true;
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_dir());
            if !(is_dir && walk(&path, left) && std::fs::remove_dir(&path).is_ok()) {
                if !is_dir || left.last().is_none_or(|last| !last.starts_with(&path)) {
                    left.push(path);
                }
                empty = false;
            }
        }
        empty
    }
    let mut left = Vec::new();
    let empty = walk(dir, &mut left);
    if empty && !keep_root {
        let _ = std::fs::remove_dir(dir);
    }
    left.sort();
    left
}

#[cfg(test)]
mod work_dir_tests {
    use super::*;

    #[test]
    fn empty_directories_go_and_whatever_holds_something_is_named() {
        let root = tempfile::tempdir().unwrap();
        let work = root.path().join("work");
        std::fs::create_dir_all(work.join("a/b/c")).unwrap();
        std::fs::create_dir_all(work.join("d")).unwrap();
        std::fs::write(work.join("d/file"), "x").unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir_all(outside.join("kept")).unwrap();
        std::os::unix::fs::symlink(&outside, work.join("link")).unwrap();
        let left = remove_empty_dirs(&work, false);
        assert_eq!(left, [work.join("d/file"), work.join("link")]);
        assert!(!work.join("a").exists(), "empty dirs removed");
        assert!(outside.join("kept").exists(), "a link is not followed");
        assert!(work.exists(), "not empty: kept");
        std::fs::remove_file(work.join("d/file")).unwrap();
        std::fs::remove_file(work.join("link")).unwrap();
        assert!(remove_empty_dirs(&work, true).is_empty());
        assert!(work.exists(), "an operator's work dir stays");
        assert!(remove_empty_dirs(&work, false).is_empty());
        assert!(!work.exists(), "our own goes once empty");
    }
}
