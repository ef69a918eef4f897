//! The checks csi-sanity's identity, controller and node suites make of a hostpath plugin,
//! run against `drover-csi-fake` over its unix socket with real bind mounts (needs root).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use drover_host::csi::CsiClient;
use drover_proto::csi::v1 as csi;
use tonic::Code;

const PLUGIN: &str = env!("CARGO_BIN_EXE_drover-csi-fake");

struct Fake {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Leave no mount behind under the temp dir.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            for point in mounts.lines().filter_map(|line| line.split_whitespace().nth(4)) {
                if point.starts_with(&*self.dir.path().to_string_lossy()) {
                    let _ = Command::new("umount").arg(point).status();
                }
            }
        }
    }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// Starts the plugin on `dir/csi.sock` and waits until it accepts connections.
fn spawn_plugin(dir: &Path, extra: &[&str]) -> (Child, PathBuf) {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { geteuid() }, 0, "these checks bind-mount volumes and need root");
    let socket = dir.join("csi.sock");
    let child = Command::new(PLUGIN)
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .arg("--node-id=node-1")
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .expect("plugin starts");
    for _ in 0..200 {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, socket)
}

fn start(extra: &[&str]) -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let (child, socket) = spawn_plugin(dir.path(), extra);
    Fake { child, dir, socket }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn client(fake: &Fake) -> CsiClient {
    CsiClient::connect(&fake.socket, Duration::from_secs(5))
        .await
        .expect("connects")
}

fn writer() -> Option<csi::VolumeCapability> {
    Some(csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume::default(),
        )),
    })
}

fn code<T>(result: Result<T, tonic::Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

fn is_mounted(path: &Path) -> bool {
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .any(|point| Path::new(point) == canonical)
}

#[test]
fn identity_suite() {
    let fake = start(&[]);
    runtime().block_on(async {
        let mut identity = client(&fake).await.identity();
        let info = identity
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(!info.name.is_empty() && !info.vendor_version.is_empty());
        let caps = identity
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(!caps.capabilities.is_empty());
        let probe = identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
        assert_eq!(probe.ready, Some(true));
    });
}

#[test]
fn controller_suite() {
    let fake = start(&["--attach-detach"]);
    runtime().block_on(async {
        let mut controller = client(&fake).await.controller();
        let caps = controller
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            caps.capabilities.len(),
            3,
            "create/delete, publish/unpublish and read-only publish"
        );

        let create = |name: &str, caps: Vec<csi::VolumeCapability>| csi::CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: caps,
            ..Default::default()
        };
        assert_eq!(
            code(controller.create_volume(create("", vec![writer().unwrap()])).await),
            Code::InvalidArgument
        );
        assert_eq!(
            code(controller.create_volume(create("v1", vec![])).await),
            Code::InvalidArgument
        );
        let first = controller
            .create_volume(create("v1", vec![writer().unwrap()]))
            .await
            .unwrap()
            .into_inner();
        let again = controller
            .create_volume(create("v1", vec![writer().unwrap()]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            first.volume.unwrap().volume_id,
            again.volume.unwrap().volume_id,
            "CreateVolume is idempotent"
        );
        // The name taken with another size: ALREADY_EXISTS, even for a size the plugin could
        // never make (OUT_OF_RANGE came first).
        for bytes in [2 << 30, i64::MAX] {
            let mut bigger = create("v1", vec![writer().unwrap()]);
            bigger.capacity_range = Some(csi::CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            });
            assert_eq!(
                code(controller.create_volume(bigger).await),
                Code::AlreadyExists,
                "{bytes}"
            );
        }

        let validate = |id: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_capabilities: caps,
            ..Default::default()
        };
        let missing_id = controller
            .validate_volume_capabilities(validate("", vec![writer().unwrap()]))
            .await;
        assert_eq!(code(missing_id), Code::InvalidArgument);
        let unknown = controller
            .validate_volume_capabilities(validate("missing", vec![writer().unwrap()]))
            .await;
        assert_eq!(code(unknown), Code::NotFound);
        assert_eq!(
            code(controller.validate_volume_capabilities(validate("v1", vec![])).await),
            Code::InvalidArgument
        );
        let confirmed = controller
            .validate_volume_capabilities(validate("v1", vec![writer().unwrap()]))
            .await
            .unwrap()
            .into_inner();
        assert!(confirmed.confirmed.is_some());

        let publish =
            |volume: &str, node: &str, cap: Option<csi::VolumeCapability>| csi::ControllerPublishVolumeRequest {
                volume_id: volume.into(),
                node_id: node.into(),
                volume_capability: cap,
                ..Default::default()
            };
        for (request, expected) in [
            (publish("", "node-1", writer()), Code::InvalidArgument),
            (publish("v1", "", writer()), Code::InvalidArgument),
            (publish("v1", "node-1", None), Code::InvalidArgument),
            (publish("missing", "node-1", writer()), Code::NotFound),
            (publish("v1", "other-node", writer()), Code::NotFound),
        ] {
            assert_eq!(code(controller.controller_publish_volume(request).await), expected);
        }
        let published = controller
            .controller_publish_volume(publish("v1", "node-1", writer()))
            .await
            .unwrap()
            .into_inner();
        assert!(!published.publish_context.is_empty());
        for _ in 0..2 {
            let unpublish = csi::ControllerUnpublishVolumeRequest {
                volume_id: "v1".into(),
                node_id: "node-1".into(),
                ..Default::default()
            };
            controller
                .controller_unpublish_volume(unpublish)
                .await
                .expect("ControllerUnpublishVolume is idempotent");
        }
        let delete = |id: &str| csi::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        };
        assert_eq!(code(controller.delete_volume(delete("")).await), Code::InvalidArgument);
        controller.delete_volume(delete("v1")).await.unwrap();
        controller
            .delete_volume(delete("v1"))
            .await
            .expect("DeleteVolume is idempotent");
        // Gone, so unpublished from every node: the spec's SHOULD return OK (NOT_FOUND before).
        controller
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: "v1".into(),
                node_id: "node-1".into(),
                ..Default::default()
            })
            .await
            .expect("ControllerUnpublishVolume of a deleted volume succeeds");
        // Unimplemented optional calls say so.
        assert_eq!(
            code(controller.list_volumes(csi::ListVolumesRequest::default()).await),
            Code::Unimplemented
        );
    });
}

#[test]
fn node_suite_with_staging_and_real_mounts() {
    let fake = start(&["--stage-unstage"]);
    let root = fake.dir.path().to_path_buf();
    runtime().block_on(async {
        let plugin = client(&fake).await;
        let (mut node, mut controller) = (plugin.node(), plugin.controller());
        let caps = node
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(caps.capabilities.len(), 1, "STAGE_UNSTAGE_VOLUME");
        let info = node
            .node_get_info(csi::NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.node_id, "node-1");
        let create = csi::CreateVolumeRequest {
            name: "vol".into(),
            volume_capabilities: vec![writer().unwrap()],
            ..Default::default()
        };
        controller.create_volume(create).await.unwrap();

        let staging = root.join("staging/vol");
        let target = root.join("per-alloc/a1/vol/rw-file-system-single-node-writer");
        let publish =
            |target: &Path, cap: Option<csi::VolumeCapability>, readonly: bool| csi::NodePublishVolumeRequest {
                volume_id: "vol".into(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: cap,
                readonly,
                ..Default::default()
            };
        let early = node.node_publish_volume(publish(&target, writer(), false)).await;
        assert_eq!(code(early), Code::FailedPrecondition, "publish needs stage first");
        let mut missing_id = publish(&target, writer(), false);
        missing_id.volume_id.clear();
        assert_eq!(code(node.node_publish_volume(missing_id).await), Code::InvalidArgument);
        assert_eq!(
            code(node.node_publish_volume(publish(Path::new(""), writer(), false)).await),
            Code::InvalidArgument
        );
        assert_eq!(
            code(node.node_publish_volume(publish(&target, None, false)).await),
            Code::InvalidArgument
        );

        let stage = csi::NodeStageVolumeRequest {
            volume_id: "vol".into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: writer(),
            ..Default::default()
        };
        node.node_stage_volume(stage.clone()).await.unwrap();
        node.node_stage_volume(stage)
            .await
            .expect("NodeStageVolume is idempotent");
        assert!(is_mounted(&staging));
        node.node_publish_volume(publish(&target, writer(), false))
            .await
            .unwrap();
        node.node_publish_volume(publish(&target, writer(), false))
            .await
            .expect("NodePublishVolume is idempotent");
        assert!(is_mounted(&target));
        std::fs::write(target.join("hello.txt"), b"written through the publish mount").unwrap();
        let volume_file = root.join("state/volumes/vol/hello.txt");
        assert_eq!(
            std::fs::read(&volume_file).unwrap(),
            b"written through the publish mount"
        );

        // A read-only publish refuses writes but shows the data.
        let reader = root.join("per-alloc/a2/vol/ro");
        node.node_publish_volume(publish(&reader, writer(), true))
            .await
            .unwrap();
        assert!(std::fs::write(reader.join("nope"), b"x").is_err(), "read-only mount");
        assert_eq!(
            std::fs::read(reader.join("hello.txt")).unwrap(),
            b"written through the publish mount"
        );

        for path in [&target, &reader] {
            let unpublish = csi::NodeUnpublishVolumeRequest {
                volume_id: "vol".into(),
                target_path: path.display().to_string(),
            };
            node.node_unpublish_volume(unpublish.clone()).await.unwrap();
            node.node_unpublish_volume(unpublish)
                .await
                .expect("NodeUnpublishVolume is idempotent");
            assert!(!is_mounted(path) && !path.exists(), "mount and directory gone");
        }
        let missing_target = csi::NodeUnpublishVolumeRequest {
            volume_id: "vol".into(),
            target_path: String::new(),
        };
        assert_eq!(
            code(node.node_unpublish_volume(missing_target).await),
            Code::InvalidArgument
        );
        let unstage = csi::NodeUnstageVolumeRequest {
            volume_id: "vol".into(),
            staging_target_path: staging.display().to_string(),
        };
        node.node_unstage_volume(unstage.clone()).await.unwrap();
        node.node_unstage_volume(unstage)
            .await
            .expect("NodeUnstageVolume is idempotent");
        assert!(!is_mounted(&staging));
        assert_eq!(
            std::fs::read(&volume_file).unwrap(),
            b"written through the publish mount",
            "data survives"
        );
    });
}

#[test]
fn fault_switches_fail_and_crash_named_calls_and_a_restart_reuses_the_stale_socket() {
    let mut fake = start(&["--fail=NodeGetInfo", "--crash=Probe"]);
    runtime().block_on(async {
        let plugin = client(&fake).await;
        let status = plugin
            .node()
            .node_get_info(csi::NodeGetInfoRequest {})
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(
            status.message().contains("injected failure in NodeGetInfo"),
            "{status:?}"
        );
        assert!(
            plugin.identity().probe(csi::ProbeRequest {}).await.is_err(),
            "the plugin crashed on Probe"
        );
    });
    let exit = fake.child.wait().unwrap();
    assert_eq!(exit.code(), Some(3));
    assert!(fake.socket.exists(), "the crash left a stale socket behind");
    let (replacement, _) = spawn_plugin(fake.dir.path(), &[]);
    fake.child = replacement;
    runtime().block_on(async {
        let probe = client(&fake)
            .await
            .identity()
            .probe(csi::ProbeRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(probe.ready, Some(true));
    });
}

/// The client's CSI calls (`CsiCall`) and the servers' controller calls, executed by
/// `CsiClient` against the fake plugin: the mapping from the core's types to CSI messages and
/// from gRPC codes to the core's retry kinds.
#[test]
fn the_cores_calls_over_grpc() {
    use drover_core::client::{CsiCall, CsiReply, ErrorKind, Reply, VolumeCapability};
    use drover_core::rpc::{ClientCsiReply, ClientCsiRequest, ControllerAttachRequest, ControllerValidateRequest};
    use drover_core::structs::{AccessMode, AttachmentMode, CsiCapability};

    let fake = start(&["--stage-unstage", "--attach-detach", "--auto-create"]);
    let root = fake.dir.path().to_path_buf();
    runtime().block_on(async {
        let plugin = client(&fake).await;
        let csi = |reply| match reply {
            Ok(Reply::Csi(reply)) => reply,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            csi(plugin.execute(&CsiCall::GetPluginCapabilities).await),
            CsiReply::PluginCapabilities {
                controller_service: true,
                accessibility_constraints: false
            }
        );
        assert!(matches!(
            csi(plugin.execute(&CsiCall::NodeGetCapabilities).await),
            CsiReply::NodeCapabilities {
                stage_unstage: true,
                ..
            }
        ));
        assert!(matches!(
            csi(plugin.execute(&CsiCall::NodeGetInfo).await),
            CsiReply::NodeInfo { node_id, .. } if node_id == "node-1"
        ));
        match csi(plugin.execute(&CsiCall::ControllerGetCapabilities).await) {
            CsiReply::ControllerCapabilities(info) => {
                assert!(info.supports_attach_detach && info.supports_create_delete)
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            csi(plugin.execute(&CsiCall::Probe).await),
            CsiReply::Probe { ready: true }
        );

        let validate = ClientCsiRequest::ControllerValidate(ControllerValidateRequest {
            plugin_id: "fake".into(),
            volume_id: "vol".into(),
            capabilities: vec![CsiCapability {
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
            }],
            parameters: Default::default(),
            context: Default::default(),
            secrets: Default::default(),
        });
        assert_eq!(plugin.controller_request(&validate).await, Ok(ClientCsiReply::Done));
        let attach = ClientCsiRequest::ControllerAttach(ControllerAttachRequest {
            plugin_id: "fake".into(),
            volume_id: "vol".into(),
            client_csi_node_id: "node-1".into(),
            attachment_mode: AttachmentMode::FileSystem,
            access_mode: AccessMode::SingleNodeWriter,
            mount_options: None,
            read_only: false,
            secrets: Default::default(),
            volume_context: Default::default(),
        });
        assert!(matches!(
            plugin.controller_request(&attach).await,
            Ok(ClientCsiReply::Attached { .. })
        ));

        let capability = VolumeCapability {
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            mount_options: Default::default(),
        };
        let staging = root.join("staging/default/vol/rw-file-system-single-node-writer");
        let target = root.join("per-alloc/a1/vol/rw-file-system-single-node-writer");
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let publish = CsiCall::NodePublishVolume {
            volume_id: "vol".into(),
            publish_context: Default::default(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            capability: capability.clone(),
            readonly: false,
            secrets: Default::default(),
            volume_context: Default::default(),
        };
        // Before staging: FailedPrecondition, which the core does not retry.
        let early = plugin.execute(&publish).await.unwrap_err();
        assert_eq!(early.kind, ErrorKind::FailedPrecondition, "{}", early.message);
        assert!(
            early.message.starts_with("NodePublishVolume: rpc error"),
            "{}",
            early.message
        );
        let stage = CsiCall::NodeStageVolume {
            volume_id: "vol".into(),
            publish_context: Default::default(),
            staging_target_path: staging.display().to_string(),
            capability,
            secrets: Default::default(),
            volume_context: Default::default(),
        };
        assert_eq!(csi(plugin.execute(&stage).await), CsiReply::Done);
        assert_eq!(csi(plugin.execute(&publish).await), CsiReply::Done);
        assert!(is_mounted(&staging) && is_mounted(&target));
        let unpublish = CsiCall::NodeUnpublishVolume {
            volume_id: "vol".into(),
            target_path: target.display().to_string(),
        };
        assert_eq!(csi(plugin.execute(&unpublish).await), CsiReply::Done);
        let unstage = CsiCall::NodeUnstageVolume {
            volume_id: "vol".into(),
            staging_target_path: staging.display().to_string(),
        };
        assert_eq!(csi(plugin.execute(&unstage).await), CsiReply::Done);
        assert!(!is_mounted(&staging) && !is_mounted(&target));
    });
}

/// Nomad's CSI client (Go gRPC) names the socket's path as the HTTP/2 `:authority`; the
/// plugin must answer it as Go plugins do, not reset the stream. Spoken here frame by frame,
/// as tonic's own client cannot send such an authority.
#[test]
fn a_socket_path_as_the_authority_is_answered() {
    use std::io::{Read, Write};

    let fake = start(&[]);
    let mut stream = std::os::unix::net::UnixStream::connect(&fake.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let frame = |kind: u8, flags: u8, id: u32, payload: &[u8]| {
        let mut bytes = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        bytes.extend_from_slice(&[kind, flags]);
        bytes.extend_from_slice(&id.to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    };
    let socket = fake.socket.to_string_lossy().into_owned();
    let mut encoder = fluke_hpack::Encoder::new();
    let block = encoder.encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/csi.v1.Identity/Probe"),
        (b":authority", socket.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    // One empty message: not compressed, length 0.
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    stream.write_all(&out).unwrap();

    let mut decoder = fluke_hpack::Decoder::new();
    let mut headers = Vec::new();
    loop {
        let mut head = [0u8; 9];
        stream.read_exact(&mut head).expect("the plugin answers");
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let mut payload = vec![0u8; length];
        stream.read_exact(&mut payload).unwrap();
        match kind {
            // The server's settings, acknowledged.
            0x4 if flags & 0x1 == 0 => stream.write_all(&frame(0x4, 0x1, 0, &[])).unwrap(),
            0x3 => panic!(
                "the stream was reset: error code {}",
                u32::from_be_bytes(payload[..4].try_into().unwrap())
            ),
            0x1 => {
                headers.extend(decoder.decode(&payload).unwrap());
                if flags & 0x1 != 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    let text: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| {
            (
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            )
        })
        .collect();
    assert!(text.contains(&(":status".into(), "200".into())), "{text:?}");
    assert!(text.contains(&("grpc-status".into(), "0".into())), "{text:?}");
}
