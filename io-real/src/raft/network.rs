//! Raft RPCs over the agent transport: each openraft request is serialized as JSON into an
//! agent envelope, and the remote's `Result` comes back the same way, so remote Raft errors
//! reach openraft as `RemoteError`s and transport failures as `Unreachable`/`Network`.

use std::net::SocketAddr;

use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use drover_proto::agent::v1::{AgentRequest, RaftPayload};
use openraft::AnyError;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{ServerNode, TypeConfig};
use crate::io::{Transport, TransportError};

pub struct NetworkFactory<T> {
    transport: T,
    region: String,
}

impl<T: Transport> NetworkFactory<T> {
    pub fn new(transport: T, region: String) -> Self {
        NetworkFactory { transport, region }
    }
}

impl<T: Transport> RaftNetworkFactory<TypeConfig> for NetworkFactory<T> {
    type Network = Connection<T>;

    async fn new_client(&mut self, target: u64, node: &ServerNode) -> Connection<T> {
        Connection {
            transport: self.transport.clone(),
            region: self.region.clone(),
            target,
            addr: node.rpc_addr.parse().ok(),
            raw_addr: node.rpc_addr.clone(),
        }
    }
}

pub struct Connection<T> {
    transport: T,
    region: String,
    target: u64,
    addr: Option<SocketAddr>,
    raw_addr: String,
}

type RpcResult<R, E> = Result<R, RPCError<u64, ServerNode, RaftError<u64, E>>>;

impl<T: Transport> Connection<T> {
    async fn send<Req, Resp, E>(
        &self,
        wrap: fn(RaftPayload) -> RequestBody,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(addr) = self.addr else {
            let error = AnyError::error(format!("invalid RPC address {:?}", self.raw_addr));
            return Err(RPCError::Unreachable(Unreachable::new(&error)));
        };
        let json = serde_json::to_vec(request).expect("raft request serializes");
        let envelope = AgentRequest {
            attached_node: String::new(),
            region: self.region.clone(),
            forwarded: false,
            version: crate::service::ENVELOPE_VERSION,
            body: Some(wrap(RaftPayload { json })),
        };
        let response = self
            .transport
            .call(addr, envelope, option.hard_ttl())
            .await
            .map_err(|error| match error {
                TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&error)),
                _ => RPCError::Network(NetworkError::new(&error)),
            })?;
        match response.body {
            Some(ResponseBody::Raft(payload)) => {
                let result: Result<Resp, RaftError<u64, E>> = serde_json::from_slice(&payload.json)
                    .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
                result.map_err(|remote| RPCError::RemoteError(RemoteError::new(self.target, remote)))
            }
            Some(ResponseBody::Error(error)) => {
                Err(RPCError::Network(NetworkError::new(&AnyError::error(error.message))))
            }
            other => Err(RPCError::Network(NetworkError::new(&AnyError::error(format!(
                "unexpected response to a Raft RPC: {other:?}"
            ))))),
        }
    }
}

impl<T: Transport> RaftNetwork<TypeConfig> for Connection<T> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible> {
        self.send(RequestBody::RaftAppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.send(RequestBody::RaftInstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, openraft::error::Infallible> {
        self.send(RequestBody::RaftVote, &rpc, &option).await
    }
}
