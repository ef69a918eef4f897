//! Simulated CSI plugins on a client node: answer `ClientCSI` calls from servers the way a
//! plugin would, and can fail, hang or be slow on command. Every effect is reported to the
//! trace as a plugin event, which the CSI invariants check.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::error::CsiCallError;
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest};
use drover_io_real::io::{BoxFuture, ClientCsi};

use crate::trace::{PluginEvent, Recorder};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginMode {
    Healthy,
    /// Every call fails at once with an internal error.
    Failing,
    /// No call is ever answered.
    Hanging,
    /// Calls are answered after the server's deadline.
    Slow,
    /// Calls of this name (`ControllerPublishVolume`, `NodeStageVolume`, ...) fail with an
    /// internal error; every other call is answered.
    FailCall(&'static str),
    /// Controller calls do their work, but the answer is lost on the way back (the plugin or
    /// its client dies right after): the caller sees an error for a volume made or deleted.
    LoseAnswers,
}

impl PluginMode {
    /// Whether a call named `call` fails at once in this mode.
    pub fn fails(self, call: &str) -> bool {
        match self {
            PluginMode::Failing => true,
            PluginMode::FailCall(name) => name == call,
            _ => false,
        }
    }
}

/// The CSI name of a controller call, for [`PluginMode::FailCall`].
fn csi_name(request: &ClientCsiRequest) -> &'static str {
    match request {
        ClientCsiRequest::ControllerAttach(_) => "ControllerPublishVolume",
        ClientCsiRequest::ControllerDetach(_) => "ControllerUnpublishVolume",
        ClientCsiRequest::ControllerValidate(_) => "ValidateVolumeCapabilities",
        ClientCsiRequest::NodeDetach(_) => "NodeUnpublishVolume",
        ClientCsiRequest::ControllerCreate(_) => "CreateVolume",
        ClientCsiRequest::ControllerDelete(_) => "DeleteVolume",
        ClientCsiRequest::ControllerCreateSnapshot(_) => "CreateSnapshot",
        ClientCsiRequest::ControllerDeleteSnapshot(_) => "DeleteSnapshot",
        ClientCsiRequest::ControllerListSnapshots(_) => "ListSnapshots",
        ClientCsiRequest::ControllerListVolumes(_) => "ListVolumes",
        ClientCsiRequest::ControllerExpand(_) => "ControllerExpandVolume",
        ClientCsiRequest::NodeExpand(_) => "NodeExpandVolume",
    }
}

const LATENCY: Duration = Duration::from_millis(2);
/// The size of a simulated volume made without a capacity range.
const SIM_VOLUME_BYTES: u64 = 1 << 30;
/// How late a slow plugin answers (past the servers' deadline).
pub(crate) const SLOW_LATENCY: Duration = Duration::from_secs(15);

/// The storage behind the plugins (one cloud's volumes, whichever node's controller asks):
/// volumes by the name they were created with, as `CreateVolume`'s idempotency requires.
#[derive(Clone, Debug, Default)]
pub struct SimStorage {
    state: Arc<Mutex<StorageState>>,
}

#[derive(Debug, Default)]
struct StorageState {
    /// name → (external id, capacity)
    volumes: BTreeMap<String, (String, u64)>,
    /// Volumes ever made (each gets the next number in its id).
    made: u64,
}

impl SimStorage {
    /// `CreateVolume`: the volume of this name, made now or before (`true` when made now);
    /// ALREADY_EXISTS when it exists with another capacity.
    fn create(&self, name: &str, capacity: u64) -> Result<(String, u64, bool), String> {
        let mut state = self.state.lock().expect("storage lock");
        if let Some((id, size)) = state.volumes.get(name) {
            if *size != capacity {
                return Err(format!(
                    "rpc error: code = AlreadyExists desc = volume {name:?} exists with capacity {size}"
                ));
            }
            return Ok((id.clone(), *size, false));
        }
        state.made += 1;
        let id = format!("sim-{name}-{}", state.made);
        state.volumes.insert(name.to_string(), (id.clone(), capacity));
        Ok((id, capacity, true))
    }

    /// `DeleteVolume`: gone, or already gone (both are OK in the spec). `true` when deleted now.
    fn delete(&self, external_id: &str) -> bool {
        let mut state = self.state.lock().expect("storage lock");
        let before = state.volumes.len();
        state.volumes.retain(|_, (id, _)| id != external_id);
        state.volumes.len() < before
    }

    /// The volumes that exist: name → external id.
    pub fn volumes(&self) -> BTreeMap<String, String> {
        let state = self.state.lock().expect("storage lock");
        state
            .volumes
            .iter()
            .map(|(name, (id, _))| (name.clone(), id.clone()))
            .collect()
    }

    /// How many volumes were ever made.
    pub fn made(&self) -> u64 {
        self.state.lock().expect("storage lock").made
    }
}

/// The scenario's handle on one node's plugins.
#[derive(Clone, Debug)]
pub struct PluginControl {
    mode: Arc<Mutex<PluginMode>>,
    storage: SimStorage,
}

impl Default for PluginControl {
    fn default() -> Self {
        PluginControl::with_storage(SimStorage::default())
    }
}

impl PluginControl {
    /// A node's plugins in front of `storage` (shared by every node of a cluster).
    pub fn with_storage(storage: SimStorage) -> Self {
        PluginControl {
            mode: Arc::new(Mutex::new(PluginMode::Healthy)),
            storage,
        }
    }

    pub fn set(&self, mode: PluginMode) {
        *self.mode.lock().expect("plugin lock") = mode;
    }

    pub fn mode(&self) -> PluginMode {
        *self.mode.lock().expect("plugin lock")
    }
}

/// One client node's plugins (a monolith plugin: controller and node halves).
#[derive(Clone)]
pub struct SimPlugins {
    node: String,
    recorder: Recorder,
    control: PluginControl,
}

impl SimPlugins {
    pub fn new(node: &str, recorder: Recorder, control: PluginControl) -> Self {
        SimPlugins {
            node: node.to_string(),
            recorder,
            control,
        }
    }
}

/// "controller-attach vol0": what a controller call does, for the trace.
fn controller_call(request: &ClientCsiRequest) -> Option<(String, String)> {
    let (kind, plugin, volume) = match request {
        ClientCsiRequest::ControllerAttach(r) => ("controller-attach", &r.plugin_id, &r.volume_id),
        ClientCsiRequest::ControllerDetach(r) => ("controller-detach", &r.plugin_id, &r.volume_id),
        ClientCsiRequest::ControllerValidate(r) => ("controller-validate", &r.plugin_id, &r.volume_id),
        ClientCsiRequest::ControllerCreate(r) => ("controller-create", &r.plugin_id, &r.name),
        ClientCsiRequest::ControllerDelete(r) => ("controller-delete", &r.plugin_id, &r.external_id),
        ClientCsiRequest::ControllerCreateSnapshot(r) => ("controller-snapshot", &r.plugin_id, &r.source_external_id),
        ClientCsiRequest::ControllerDeleteSnapshot(r) => ("controller-delete-snapshot", &r.plugin_id, &r.snapshot_id),
        ClientCsiRequest::ControllerListSnapshots(r) => ("controller-list-snapshots", &r.plugin_id, &r.plugin_id),
        ClientCsiRequest::ControllerListVolumes(r) => ("controller-list-volumes", &r.plugin_id, &r.plugin_id),
        ClientCsiRequest::ControllerExpand(r) => ("controller-expand", &r.plugin_id, &r.external_id),
        ClientCsiRequest::NodeDetach(_) | ClientCsiRequest::NodeExpand(_) => return None,
    };
    Some((plugin.clone(), format!("{kind} {volume}")))
}

impl ClientCsi for SimPlugins {
    fn call(&self, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, CsiCallError>> {
        let plugins = self.clone();
        Box::pin(async move {
            // Counted where the plugin sees it, whichever server sent it. A call that hangs or
            // whose caller gave up never ends here; the invariant ages it out.
            let controller = controller_call(&request);
            if let Some((plugin, call)) = &controller {
                plugins.recorder.record_plugin(
                    &plugins.node,
                    PluginEvent::ControllerCallStarted {
                        plugin: plugin.clone(),
                        call: call.clone(),
                    },
                );
            }
            let reply = plugins.answer(request).await;
            if let Some((plugin, call)) = controller {
                plugins
                    .recorder
                    .record_plugin(&plugins.node, PluginEvent::ControllerCallEnded { plugin, call });
            }
            reply
        })
    }
}

impl SimPlugins {
    async fn answer(&self, request: ClientCsiRequest) -> Result<ClientCsiReply, CsiCallError> {
        let mode = self.control.mode();
        match mode {
            mode if mode.fails(csi_name(&request)) => {
                tokio::time::sleep(LATENCY).await;
                return Err("rpc error: code = Internal desc = injected plugin failure".into());
            }
            PluginMode::Hanging => std::future::pending::<()>().await,
            PluginMode::Slow => tokio::time::sleep(SLOW_LATENCY).await,
            PluginMode::Healthy | PluginMode::Failing | PluginMode::FailCall(_) | PluginMode::LoseAnswers => {
                tokio::time::sleep(LATENCY).await
            }
        }
        let controller = !matches!(
            request,
            ClientCsiRequest::NodeDetach(_) | ClientCsiRequest::NodeExpand(_)
        );
        let reply = self.effect(request);
        if mode == PluginMode::LoseAnswers && controller {
            return Err("rpc error: code = Unavailable desc = error reading from server: EOF".into());
        }
        reply
    }

    /// What a call does to the plugin and its storage, recorded, and the plugin's answer.
    fn effect(&self, request: ClientCsiRequest) -> Result<ClientCsiReply, CsiCallError> {
        let (event, reply) = match request {
            ClientCsiRequest::ControllerAttach(r) => (
                Some(PluginEvent::ControllerPublished {
                    plugin: r.plugin_id,
                    volume: r.volume_id.clone(),
                    external_node: r.client_csi_node_id,
                }),
                ClientCsiReply::Attached {
                    publish_context: [("device".to_string(), format!("/dev/sim/{}", r.volume_id))].into(),
                },
            ),
            ClientCsiRequest::ControllerDetach(r) => (
                Some(PluginEvent::ControllerUnpublished {
                    plugin: r.plugin_id,
                    volume: r.volume_id,
                    external_node: r.client_csi_node_id,
                }),
                ClientCsiReply::Done,
            ),
            ClientCsiRequest::ControllerValidate(_) => (None, ClientCsiReply::Done),
            ClientCsiRequest::ControllerCreate(r) => {
                let capacity = match (r.capacity_min, r.capacity_max) {
                    (0, 0) => SIM_VOLUME_BYTES,
                    (0, max) => max.min(SIM_VOLUME_BYTES),
                    (min, _) => min,
                };
                let (external_id, capacity, made) = self.control.storage.create(&r.name, capacity)?;
                // A zonal volume: accessible from the first preferred segment, else the first
                // required one, as a cloud disk is made in one zone.
                let topologies: Vec<_> = r
                    .topology
                    .as_ref()
                    .and_then(|wanted| wanted.preferred.first().or(wanted.required.first()))
                    .cloned()
                    .into_iter()
                    .collect();
                let event = made.then(|| PluginEvent::VolumeCreated {
                    plugin: r.plugin_id.clone(),
                    name: r.name.clone(),
                    external_id: external_id.clone(),
                });
                let reply = ClientCsiReply::Created {
                    external_id,
                    capacity,
                    context: Default::default(),
                    topologies,
                };
                (event, reply)
            }
            ClientCsiRequest::ControllerDelete(r) => {
                let deleted = self.control.storage.delete(&r.external_id);
                let event = deleted.then_some(PluginEvent::VolumeDeleted {
                    plugin: r.plugin_id,
                    external_id: r.external_id,
                });
                (event, ClientCsiReply::Done)
            }
            ClientCsiRequest::NodeDetach(r) => (
                Some(PluginEvent::NodeUnpublished {
                    volume: r.volume_id,
                    alloc: r.alloc_id,
                }),
                ClientCsiReply::Done,
            ),
            ClientCsiRequest::ControllerCreateSnapshot(r) => (
                None,
                ClientCsiReply::Snapshot(drover_core::structs::CsiSnapshot {
                    id: format!("snap-{}", r.name),
                    external_source_volume_id: r.source_external_id,
                    is_ready: true,
                    name: r.name,
                    ..Default::default()
                }),
            ),
            ClientCsiRequest::ControllerDeleteSnapshot(_) => (None, ClientCsiReply::Done),
            ClientCsiRequest::ControllerListSnapshots(_) => (
                None,
                ClientCsiReply::Snapshots {
                    snapshots: Vec::new(),
                    next_token: String::new(),
                },
            ),
            ClientCsiRequest::ControllerListVolumes(_) => (
                None,
                ClientCsiReply::Volumes {
                    volumes: self
                        .control
                        .storage
                        .volumes()
                        .into_values()
                        .map(|external_id| drover_core::structs::CsiExternalVolume {
                            external_id,
                            ..Default::default()
                        })
                        .collect(),
                    next_token: String::new(),
                },
            ),
            ClientCsiRequest::ControllerExpand(r) => (
                None,
                ClientCsiReply::Expanded {
                    capacity: r.capacity_min,
                    node_expansion_required: false,
                },
            ),
            ClientCsiRequest::NodeExpand(r) => (
                None,
                ClientCsiReply::Expanded {
                    capacity: r.capacity_min,
                    node_expansion_required: false,
                },
            ),
        };
        if let Some(event) = event {
            self.recorder.record_plugin(&self.node, event);
        }
        Ok(reply)
    }
}
