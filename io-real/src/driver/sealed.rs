//! Where sealed values leave a server: the core hands on variables and volume secrets sealed
//! as the state holds them (`rootkeys`), and the driver opens them in what it sends a client
//! (its `ClientCSI` calls) and in the replies to server requests (a claim's volume, the
//! variables a template reads), fetching a root key from a peer first if this server lacks it.

use drover_core::rpc::{ClientCsiRequest, RpcError, ServerReply};
use drover_core::structs::Secrets;

use crate::rootkeys::RootKeyError;
use crate::service::Service;

/// Every secret map a reply carries.
fn reply_maps(reply: &mut ServerReply) -> Vec<&mut Secrets> {
    match reply {
        ServerReply::Claimed { volume, .. } => vec![&mut volume.secrets],
        ServerReply::Variables { variables, .. } => {
            variables.values_mut().map(|variable| &mut variable.items).collect()
        }
        ServerReply::Snapshots { snapshots, .. } => snapshots.iter_mut().map(|s| &mut s.secrets).collect(),
        ServerReply::Done { .. }
        | ServerReply::ExternalVolumes { .. }
        | ServerReply::Error(_)
        | ServerReply::Heartbeat { .. }
        | ServerReply::JobRegistered { .. }
        | ServerReply::JobDispatched { .. }
        | ServerReply::SiTokens { .. } => Vec::new(),
    }
}

/// Every secret map a `ClientCSI` call carries.
fn request_maps(request: &mut ClientCsiRequest) -> Vec<&mut Secrets> {
    match request {
        ClientCsiRequest::ControllerAttach(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerDetach(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerValidate(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerCreate(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerDelete(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerCreateSnapshot(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerDeleteSnapshot(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerListSnapshots(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerExpand(request) => vec![&mut request.secrets],
        ClientCsiRequest::ControllerListVolumes(_)
        | ClientCsiRequest::NodeDetach(_)
        | ClientCsiRequest::NodeExpand(_) => Vec::new(),
    }
}

pub fn reply_is_sealed(reply: &mut ServerReply) -> bool {
    reply_maps(reply).iter().any(|map| map.is_sealed())
}

async fn open_all(service: &Service, maps: Vec<&mut Secrets>) -> Result<(), RootKeyError> {
    for map in maps {
        if map.is_sealed() {
            *map = service.open_secrets(map).await?;
        }
    }
    Ok(())
}

/// `reply` with its secrets opened, or an error reply saying which key was missing.
pub async fn open_reply(service: &Service, mut reply: ServerReply) -> ServerReply {
    match open_all(service, reply_maps(&mut reply)).await {
        Ok(()) => reply,
        Err(error) => {
            tracing::error!(%error, "a reply's sealed values could not be opened");
            ServerReply::Error(RpcError::new(
                drover_core::rpc::ErrorKind::Unavailable,
                error.to_string(),
                true,
            ))
        }
    }
}

/// `request` with its secrets opened.
pub async fn open_request(service: &Service, mut request: ClientCsiRequest) -> Result<ClientCsiRequest, String> {
    open_all(service, request_maps(&mut request))
        .await
        .map_err(|error| error.to_string())?;
    Ok(request)
}

impl super::AgentHandle {
    /// `secrets` sealed under the cluster's active root key, ready to be proposed; an empty
    /// map stays as it is (nothing to hide, and no key needed). The first value sealed in a
    /// cluster makes its first root key.
    pub async fn seal_secrets(&self, secrets: &Secrets) -> Result<Secrets, RootKeyError> {
        if secrets.is_empty() || secrets.is_sealed() {
            return Ok(secrets.clone());
        }
        let service = &self.inner.service;
        let active = self
            .read_state(|state| state.root_keys().active().map(|meta| meta.key_id.clone()))
            .ok_or_else(|| RootKeyError::NoActiveKey("this agent is not a server".into()))?;
        let key_id = match active {
            Some(key_id) => key_id,
            None => self.new_root_key(true).await?,
        };
        if service.keystore.material(&key_id).is_none() {
            service.fetch_root_key(&key_id).await?;
        }
        service.keystore.seal(&key_id, secrets)
    }

    /// `secrets` opened for a reader of this server's API.
    pub async fn open_secrets(&self, secrets: &Secrets) -> Result<Secrets, RootKeyError> {
        self.inner.service.open_secrets(secrets).await
    }

    /// Makes a new root key, hands it to the other servers and, once a quorum of voters holds
    /// it, proposes it active (Nomad's `operator root keyring rotate`). With `first_only`, a key
    /// another write made meanwhile is used instead. Returns the active key's id.
    pub async fn new_root_key(&self, first_only: bool) -> Result<String, RootKeyError> {
        let service = &self.inner.service;
        let _creating = service.keystore.creating().await;
        if first_only
            && let Some(Some(active)) =
                self.read_state(|state| state.root_keys().active().map(|meta| meta.key_id.clone()))
        {
            return Ok(active);
        }
        let material = crate::rootkeys::RootKeyMaterial::generate(super::unix_millis());
        let key_id = material.key_id.clone();
        service.keystore.insert(material.clone())?;
        let (peers, voters) = service.raft_peers();
        let kept = 1 + service.push_root_key(&peers, &material).await;
        let quorum = voters / 2 + 1;
        if kept < quorum {
            return Err(RootKeyError::NoActiveKey(format!(
                "only {kept} of {voters} servers took the new root key {key_id}; {quorum} must before it is used"
            )));
        }
        let command = drover_core::fsm::Command::RootKey(drover_core::fsm::rootkeys::RootKeyCommand::Activate {
            key_id: key_id.clone(),
        });
        self.apply(command)
            .await
            .map_err(|error| RootKeyError::NoActiveKey(format!("activating root key {key_id}: {error}")))?;
        tracing::info!(%key_id, servers = kept, "new root key active");
        Ok(key_id)
    }
}
