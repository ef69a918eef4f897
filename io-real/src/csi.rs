//! Production CSI: gRPC to a plugin over its unix socket (tonic). Mirrored by
//! `drover-io-sim`'s `csi.rs`, whose plugins fail, hang or are slow on command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_proto::csi::v1::controller_client::ControllerClient;
use drover_proto::csi::v1::identity_client::IdentityClient;
use drover_proto::csi::v1::node_client::NodeClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("cannot connect to CSI plugin at {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
}

/// A connection to one plugin's socket; cheap to clone (one HTTP/2 channel).
#[derive(Clone, Debug)]
pub struct CsiClient {
    channel: Channel,
    socket: PathBuf,
}

impl CsiClient {
    /// Connects to the plugin listening on `socket` ("unix:///path" or a path).
    pub async fn connect(socket: impl AsRef<Path>, timeout: Duration) -> Result<CsiClient, CsiError> {
        let text = socket.as_ref().to_string_lossy().into_owned();
        let socket = PathBuf::from(text.strip_prefix("unix://").unwrap_or(&text));
        let path = socket.clone();
        // The URI is required by tonic but unused: the connector dials the socket.
        let channel = Endpoint::from_static("http://csi.plugin")
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
            }))
            .await
            .map_err(|error| CsiError::Connect {
                path: socket.clone(),
                reason: error.to_string(),
            })?;
        Ok(CsiClient { channel, socket })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }

    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
}
