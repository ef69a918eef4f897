//! `drover-csi-fake`: the project's own CSI v1.9 plugin, hostpath-like, for tests and the demo.
//!
//! Serves Identity, Controller and Node on a unix socket (`--endpoint` or `CSI_ENDPOINT`).
//! Volumes are directories under `--state-dir`; staging and publishing are real bind mounts
//! (root needed). Every RPC a flag advertises behaves as the CSI spec says (idempotency,
//! ALREADY_EXISTS, NOT_FOUND, capacity ranges, pagination): `drover-csi-check` holds it to that.
//!
//! Capabilities beyond the base (CREATE_DELETE_VOLUME, the node's publish/unpublish):
//! `--stage-unstage`, `--attach-detach`, `--list-volumes`, `--get-capacity`, `--snapshots`
//! (CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS), `--clone`, `--expand` (controller and node
//! EXPAND_VOLUME, online), `--volume-stats` (GET_VOLUME_STATS, VOLUME_CONDITION),
//! `--get-volume` (GET_VOLUME, VOLUME_CONDITION), `--max-volumes-per-node N`, `--topology
//! KEY=VALUE` (VOLUME_ACCESSIBILITY_CONSTRAINTS), or `--all`.
//!
//! Fault switches name CSI calls by their RPC name: `--fail NodePublishVolume`, `--hang
//! NodeStageVolume`, `--slow ControllerPublishVolume=2000`, `--crash NodeUnpublishVolume`
//! (the process exits when the call arrives).

mod authority;
mod controller;
mod node;
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use drover_proto::csi::v1 as csi;
use drover_proto::csi::v1::controller_server::ControllerServer;
use drover_proto::csi::v1::identity_server::{Identity, IdentityServer};
use drover_proto::csi::v1::node_server::NodeServer;
use tonic::{Request, Response, Status};

#[derive(Debug, Parser, Clone)]
#[command(
    name = "drover-csi-fake",
    about = "A hostpath-like CSI v1.9 plugin with fault switches"
)]
struct Args {
    /// Unix socket to serve on ("unix:///path" or a path); defaults to $CSI_ENDPOINT.
    #[arg(long)]
    endpoint: Option<String>,
    /// Where volumes, snapshots and the plugin's records live.
    #[arg(long, default_value = "/tmp/drover-csi-fake")]
    state_dir: PathBuf,
    /// The node id reported by NodeGetInfo (and the node ControllerPublish knows).
    #[arg(long, default_value = "fake-node")]
    node_id: String,
    /// Other node ids ControllerPublishVolume accepts.
    #[arg(long, value_name = "ID")]
    known_node: Vec<String>,
    #[arg(long)]
    stage_unstage: bool,
    #[arg(long)]
    attach_detach: bool,
    #[arg(long)]
    list_volumes: bool,
    #[arg(long)]
    get_capacity: bool,
    #[arg(long)]
    snapshots: bool,
    #[arg(long)]
    clone: bool,
    #[arg(long)]
    expand: bool,
    #[arg(long)]
    volume_stats: bool,
    #[arg(long)]
    get_volume: bool,
    /// Every optional capability at once.
    #[arg(long)]
    all: bool,
    /// NodeGetInfo's max_volumes_per_node; ControllerPublishVolume refuses more (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_volumes_per_node: i64,
    /// This node's topology segment (repeat for more keys).
    #[arg(long, value_name = "KEY=VALUE")]
    topology: Vec<String>,
    /// The storage the plugin has, in bytes (GetCapacity; creations beyond it are refused).
    #[arg(long, default_value_t = 100 << 30)]
    capacity_bytes: i64,
    /// The largest volume it makes, in bytes.
    #[arg(long, default_value_t = 10 << 30)]
    max_volume_bytes: i64,
    /// Accept volumes that were never created (as volumes registered out of band): an unknown
    /// id exists on first use, which departs from the spec's NOT_FOUND on purpose.
    #[arg(long)]
    auto_create: bool,
    #[arg(long, value_name = "CALL")]
    fail: Vec<String>,
    #[arg(long, value_name = "CALL")]
    hang: Vec<String>,
    #[arg(long, value_name = "CALL=MS")]
    slow: Vec<String>,
    #[arg(long, value_name = "CALL")]
    crash: Vec<String>,
    /// Planted spec violations, to prove a conformance check catches them:
    /// `create-conflict-ok`, `token-ignored`, `delete-missing-not-found`.
    #[arg(long, value_name = "BUG", hide = true)]
    bug: Vec<String>,
}

/// What the plugin advertises, from its flags.
#[derive(Clone, Debug, Default)]
struct Features {
    stage_unstage: bool,
    attach_detach: bool,
    list_volumes: bool,
    get_capacity: bool,
    snapshots: bool,
    clone: bool,
    expand: bool,
    volume_stats: bool,
    get_volume: bool,
    /// Segments of this node; empty: no topology.
    topology: BTreeMap<String, String>,
    /// Planted spec violations (`--bug`).
    bugs: BTreeSet<String>,
}

struct Faults {
    fail: BTreeSet<String>,
    hang: BTreeSet<String>,
    slow: BTreeMap<String, u64>,
    crash: BTreeSet<String>,
}

struct Plugin {
    args: Args,
    features: Features,
    faults: Faults,
    store: store::Store,
}

/// The three CSI services share one plugin.
#[derive(Clone)]
struct Shared(Arc<Plugin>);

impl std::ops::Deref for Shared {
    type Target = Plugin;

    fn deref(&self) -> &Plugin {
        &self.0
    }
}

fn invalid(message: &str) -> Status {
    Status::invalid_argument(message)
}

/// A volume or snapshot id this plugin can hold: it names a directory.
fn check_id(what: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(invalid(&format!("{what} is required")));
    }
    if id.contains('/') || id.contains("..") || id.chars().any(char::is_control) || id.len() > 128 {
        return Err(invalid(&format!(
            "{what} must be at most 128 characters without path separators, \"..\" or control characters"
        )));
    }
    Ok(())
}

impl Plugin {
    /// Applies the fault switches for `call`.
    async fn enter(&self, call: &str) -> Result<(), Status> {
        eprintln!("drover-csi-fake: {call}");
        if self.faults.crash.contains(call) {
            eprintln!("drover-csi-fake: crashing on {call}");
            std::process::exit(3);
        }
        if let Some(ms) = self.faults.slow.get(call) {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        if self.faults.hang.contains(call) {
            std::future::pending::<()>().await;
        }
        if self.faults.fail.contains(call) {
            return Err(Status::internal(format!("injected failure in {call}")));
        }
        Ok(())
    }
}

/// A page of `items` (sorted) from `starting_token` (the index to start at, as text), at most
/// `max_entries` long (0: all): the page and the next token (empty at the end). A token this
/// plugin did not hand out is ABORTED, as the spec says (`lenient`: the planted bug that
/// starts over instead).
fn page<T: Clone>(
    items: &[T],
    max_entries: i32,
    starting_token: &str,
    lenient: bool,
) -> Result<(Vec<T>, String), Status> {
    if max_entries < 0 {
        return Err(invalid("max_entries must not be negative"));
    }
    let start = if starting_token.is_empty() {
        0
    } else {
        match starting_token.parse::<usize>() {
            Ok(start) if start <= items.len() => start,
            _ if lenient => 0,
            _ => return Err(Status::aborted(format!("invalid starting_token {starting_token:?}"))),
        }
    };
    let end = if max_entries == 0 {
        items.len()
    } else {
        (start + max_entries as usize).min(items.len())
    };
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((items[start..end].to_vec(), next))
}

#[tonic::async_trait]
impl Identity for Shared {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.enter("GetPluginInfo").await?;
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: "drover.csi.fake".into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        self.enter("GetPluginCapabilities").await?;
        use csi::plugin_capability::service::Type;
        let service = |kind: Type| csi::PluginCapability {
            r#type: Some(csi::plugin_capability::Type::Service(csi::plugin_capability::Service {
                r#type: kind as i32,
            })),
        };
        let mut capabilities = vec![service(Type::ControllerService)];
        if !self.features.topology.is_empty() {
            capabilities.push(service(Type::VolumeAccessibilityConstraints));
        }
        if self.features.expand {
            use csi::plugin_capability::volume_expansion::Type as Expansion;
            capabilities.push(csi::PluginCapability {
                r#type: Some(csi::plugin_capability::Type::VolumeExpansion(
                    csi::plugin_capability::VolumeExpansion {
                        r#type: Expansion::Online as i32,
                    },
                )),
            });
        }
        Ok(Response::new(csi::GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        self.enter("Probe").await?;
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

fn socket_path(args: &Args) -> anyhow::Result<PathBuf> {
    let endpoint = args
        .endpoint
        .clone()
        .or_else(|| std::env::var("CSI_ENDPOINT").ok())
        .ok_or_else(|| anyhow::anyhow!("no endpoint: pass --endpoint or set CSI_ENDPOINT"))?;
    Ok(PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(&endpoint)))
}

fn features(args: &Args) -> anyhow::Result<Features> {
    let all = args.all;
    let topology = args
        .topology
        .iter()
        .map(|spec| {
            let (key, value) = spec
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--topology wants KEY=VALUE, got {spec:?}"))?;
            Ok((key.to_string(), value.to_string()))
        })
        .collect::<anyhow::Result<BTreeMap<String, String>>>()?;
    Ok(Features {
        stage_unstage: args.stage_unstage || all,
        attach_detach: args.attach_detach || all,
        list_volumes: args.list_volumes || all,
        get_capacity: args.get_capacity || all,
        snapshots: args.snapshots || all,
        clone: args.clone || all,
        expand: args.expand || all,
        volume_stats: args.volume_stats || all,
        get_volume: args.get_volume || all,
        topology,
        bugs: args.bug.iter().cloned().collect(),
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let socket = socket_path(&args)?;
    let slow = args
        .slow
        .iter()
        .map(|spec| {
            let (call, ms) = spec
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--slow wants CALL=MS, got {spec:?}"))?;
            Ok((call.to_string(), ms.parse()?))
        })
        .collect::<anyhow::Result<BTreeMap<String, u64>>>()?;
    let plugin = Shared(Arc::new(Plugin {
        features: features(&args)?,
        faults: Faults {
            fail: args.fail.iter().cloned().collect(),
            hang: args.hang.iter().cloned().collect(),
            slow,
            crash: args.crash.iter().cloned().collect(),
        },
        store: store::Store::open(&args.state_dir)?,
        args,
    }));
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // A stale socket from an earlier run would make bind fail.
    let _ = std::fs::remove_file(&socket);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::UnixListener::bind(&socket)?;
        eprintln!("drover-csi-fake: serving on {}", socket.display());
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(plugin.clone()))
            .add_service(ControllerServer::new(plugin.clone()))
            .add_service(NodeServer::new(plugin))
            .serve_with_incoming(tokio_stream::StreamExt::map(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                |accepted| accepted.map(authority::shim),
            ))
            .await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_their_tokens_and_refuse_made_up_ones() {
        let items: Vec<u32> = (0..5).collect();
        assert_eq!(page(&items, 2, "", false).unwrap(), (vec![0, 1], "2".to_string()));
        assert_eq!(page(&items, 2, "4", false).unwrap(), (vec![4], String::new()));
        assert_eq!(page(&items, 0, "", false).unwrap().0.len(), 5);
        assert_eq!(page(&items, 1, "9", false).unwrap_err().code(), tonic::Code::Aborted);
        assert_eq!(page(&items, 1, "x", false).unwrap_err().code(), tonic::Code::Aborted);
        assert_eq!(page(&items, 1, "x", true).unwrap().0, vec![0]);
        assert_eq!(
            page(&items, -1, "", false).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
