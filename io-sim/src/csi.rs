//! Simulated CSI plugins on a client node: answer `ClientCSI` calls from servers the way a
//! plugin would, and can fail, hang or be slow on command. Every effect is reported to the
//! trace as a plugin event, which the CSI invariants check.

use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    }
}

const LATENCY: Duration = Duration::from_millis(2);
/// The size of a simulated volume made without a capacity range.
const SIM_VOLUME_BYTES: u64 = 1 << 30;
/// How late a slow plugin answers (past the servers' deadline).
pub(crate) const SLOW_LATENCY: Duration = Duration::from_secs(15);

/// The scenario's handle on one node's plugins.
#[derive(Clone, Debug)]
pub struct PluginControl {
    mode: Arc<Mutex<PluginMode>>,
}

impl Default for PluginControl {
    fn default() -> Self {
        PluginControl {
            mode: Arc::new(Mutex::new(PluginMode::Healthy)),
        }
    }
}

impl PluginControl {
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
        ClientCsiRequest::NodeDetach(_) => return None,
    };
    Some((plugin.clone(), format!("{kind} {volume}")))
}

impl ClientCsi for SimPlugins {
    fn call(&self, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, String>> {
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
    async fn answer(&self, request: ClientCsiRequest) -> Result<ClientCsiReply, String> {
        let plugins = self;
        {
            match plugins.control.mode() {
                mode if mode.fails(csi_name(&request)) => {
                    tokio::time::sleep(LATENCY).await;
                    return Err("rpc error: code = Internal desc = injected plugin failure".to_string());
                }
                PluginMode::Hanging => std::future::pending::<()>().await,
                PluginMode::Slow => tokio::time::sleep(SLOW_LATENCY).await,
                PluginMode::Healthy | PluginMode::Failing | PluginMode::FailCall(_) => {
                    tokio::time::sleep(LATENCY).await
                }
            }
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
                // The simulated storage names a volume after the name it was asked for, so a
                // repeated create answers the same volume, as the CSI spec requires.
                ClientCsiRequest::ControllerCreate(r) => (
                    None,
                    ClientCsiReply::Created {
                        external_id: format!("sim-{}", r.name),
                        capacity: match (r.capacity_min, r.capacity_max) {
                            (0, 0) => SIM_VOLUME_BYTES,
                            (0, max) => max.min(SIM_VOLUME_BYTES),
                            (min, _) => min,
                        },
                        context: Default::default(),
                        topologies: Vec::new(),
                    },
                ),
                ClientCsiRequest::ControllerDelete(_) => (None, ClientCsiReply::Done),
                ClientCsiRequest::NodeDetach(r) => (
                    Some(PluginEvent::NodeUnpublished {
                        volume: r.volume_id,
                        alloc: r.alloc_id,
                    }),
                    ClientCsiReply::Done,
                ),
            };
            if let Some(event) = event {
                plugins.recorder.record_plugin(&plugins.node, event);
            }
            Ok(reply)
        }
    }
}
