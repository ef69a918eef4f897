//! A hostile CSI plugin: a gRPC server on a unix socket that answers every call with the fuzz
//! input, so the agent's real CSI client (tonic over the socket, then our conversion) reads
//! malformed, truncated, oversized and lying replies exactly as it would from a broken plugin.
//!
//! An input's first byte picks how the rest is sent:
//! - `0`: as the one message of a well-framed reply (the protobuf body is what is fuzzed);
//! - `1`: as the raw HTTP/2 body, so the gRPC frame headers themselves lie (lengths, flags);
//! - `2`: as a gRPC error status, the second byte its code and the rest its message.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use drover_core::client::CsiCall;
use drover_core::rpc::{ClientCsiRequest, ControllerAttachRequest};
use drover_core::structs::{AccessMode, AttachmentMode};
use drover_host::csi::CsiClient;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper::header::{HeaderMap, HeaderValue};

/// The calls a plugin's reply is read for, one per target variant.
pub const CALLS: &[&str] = &[
    "probe",
    "plugin_info",
    "plugin_capabilities",
    "controller_capabilities",
    "node_info",
    "node_capabilities",
    "node_unpublish",
    "controller_publish",
];

struct Plugin {
    runtime: tokio::runtime::Runtime,
    client: CsiClient,
    reply: Arc<Mutex<Vec<u8>>>,
    _dir: PathBuf,
}

thread_local! {
    /// One plugin per fuzzing thread: its runtime runs on that thread, so what the client
    /// allocates is counted against the case.
    static PLUGIN: OnceLock<Plugin> = const { OnceLock::new() };
}

fn start() -> Plugin {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = std::env::temp_dir().join(format!(
        "drover-fuzz-csi-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("socket dir");
    let socket = dir.join("csi.sock");
    let reply = Arc::new(Mutex::new(Vec::new()));
    let client = runtime.block_on(async {
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind the plugin socket");
        let served = reply.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let served = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_request| {
                        let reply = served.lock().expect("reply lock").clone();
                        async move { Ok::<_, std::convert::Infallible>(response(&reply)) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        CsiClient::connect(&socket, Duration::from_secs(5))
            .await
            .expect("connect to the fuzz plugin")
    });
    Plugin {
        runtime,
        client,
        reply,
        _dir: dir,
    }
}

type Body = StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>>;

fn response(input: &[u8]) -> hyper::Response<Body> {
    let (mode, rest) = input
        .split_first()
        .map_or((0, &[][..]), |(mode, rest)| (*mode % 3, rest));
    let mut trailers = HeaderMap::new();
    let mut frames = Vec::new();
    match mode {
        0 => {
            let mut framed = Vec::with_capacity(5 + rest.len());
            framed.push(0);
            framed.extend_from_slice(&(rest.len() as u32).to_be_bytes());
            framed.extend_from_slice(rest);
            frames.push(Frame::data(Bytes::from(framed)));
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
        }
        1 => {
            frames.push(Frame::data(Bytes::copy_from_slice(rest)));
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
        }
        _ => {
            let (code, message) = rest
                .split_first()
                .map_or((2, &[][..]), |(code, message)| (*code, message));
            trailers.insert("grpc-status", HeaderValue::from(u16::from(code % 20)));
            let message: String = String::from_utf8_lossy(message)
                .chars()
                .filter(|c| c.is_ascii_graphic() || *c == ' ')
                .collect();
            if let Ok(value) = HeaderValue::from_str(&message) {
                trailers.insert("grpc-message", value);
            }
        }
    }
    frames.push(Frame::trailers(trailers));
    hyper::Response::builder()
        .header("content-type", "application/grpc")
        .body(StreamBody::new(futures::stream::iter(
            frames.into_iter().map(Ok).collect::<Vec<_>>(),
        )))
        .expect("a response")
}

/// Calls `CALLS[variant]` on the plugin, which answers with `input`.
pub fn call(variant: usize, input: &[u8]) {
    PLUGIN.with(|plugin| {
        let plugin = plugin.get_or_init(start);
        *plugin.reply.lock().expect("reply lock") = input.to_vec();
        let client = plugin.client.clone();
        plugin.runtime.block_on(async move {
            let call = match variant {
                0 => CsiCall::Probe,
                1 => CsiCall::GetPluginInfo,
                2 => CsiCall::GetPluginCapabilities,
                3 => CsiCall::ControllerGetCapabilities,
                4 => CsiCall::NodeGetInfo,
                5 => CsiCall::NodeGetCapabilities,
                6 => CsiCall::NodeUnpublishVolume {
                    volume_id: "vol".into(),
                    target_path: "/tmp/target".into(),
                },
                _ => {
                    let request = ClientCsiRequest::ControllerAttach(ControllerAttachRequest {
                        plugin_id: "fuzz".into(),
                        volume_id: "vol".into(),
                        client_csi_node_id: "n1".into(),
                        attachment_mode: AttachmentMode::FileSystem,
                        access_mode: AccessMode::SingleNodeWriter,
                        mount_options: None,
                        read_only: false,
                        secrets: Default::default(),
                        volume_context: Default::default(),
                    });
                    let _ = client.controller_request(&request).await;
                    return;
                }
            };
            let _ = client.execute(&call).await;
        });
    });
}

/// Well-framed replies of a plugin that follows the spec, one or more per call.
pub fn seeds() -> Vec<(usize, Vec<u8>)> {
    use drover_proto::csi::v1 as csi;
    use prost::Message;
    let framed = |message: Vec<u8>| [vec![0], message].concat();
    let rpc_capability = |kind: i32| csi::ControllerServiceCapability {
        r#type: Some(csi::controller_service_capability::Type::Rpc(
            csi::controller_service_capability::Rpc { r#type: kind },
        )),
    };
    let node_capability = |kind: i32| csi::NodeServiceCapability {
        r#type: Some(csi::node_service_capability::Type::Rpc(
            csi::node_service_capability::Rpc { r#type: kind },
        )),
    };
    vec![
        (0, framed(csi::ProbeResponse { ready: Some(true) }.encode_to_vec())),
        (
            1,
            framed(
                csi::GetPluginInfoResponse {
                    name: "fuzz.csi.drover".into(),
                    vendor_version: "1.0.0".into(),
                    manifest: [("url".to_string(), "https://example.com".to_string())].into(),
                }
                .encode_to_vec(),
            ),
        ),
        (
            2,
            framed(
                csi::GetPluginCapabilitiesResponse {
                    capabilities: vec![csi::PluginCapability {
                        r#type: Some(csi::plugin_capability::Type::Service(csi::plugin_capability::Service {
                            r#type: csi::plugin_capability::service::Type::ControllerService as i32,
                        })),
                    }],
                }
                .encode_to_vec(),
            ),
        ),
        (
            3,
            framed(
                csi::ControllerGetCapabilitiesResponse {
                    capabilities: (1..=13).map(rpc_capability).collect(),
                }
                .encode_to_vec(),
            ),
        ),
        (
            4,
            framed(
                csi::NodeGetInfoResponse {
                    node_id: "node-1".into(),
                    max_volumes_per_node: 8,
                    accessible_topology: Some(csi::Topology {
                        segments: [("zone".to_string(), "a".to_string())].into(),
                    }),
                }
                .encode_to_vec(),
            ),
        ),
        (
            5,
            framed(
                csi::NodeGetCapabilitiesResponse {
                    capabilities: (1..=6).map(node_capability).collect(),
                }
                .encode_to_vec(),
            ),
        ),
        (6, framed(csi::NodeUnpublishVolumeResponse {}.encode_to_vec())),
        (
            7,
            framed(
                csi::ControllerPublishVolumeResponse {
                    publish_context: [("device".to_string(), "/dev/xvdb".to_string())].into(),
                }
                .encode_to_vec(),
            ),
        ),
        (0, [vec![2, 14], b"plugin is restarting".to_vec()].concat()),
    ]
}
