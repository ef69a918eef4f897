//! The production executor: the host filesystem and mount table, the process drivers, device
//! plugins, and CSI plugins over their unix sockets; and the host's identity and resources.

use drover_core::error::{AllocCallError, AllocCallFailure, CsiCallError, CsiCallFailure};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_core::client::client::ClientSettings;
use drover_core::client::devices::{DeviceInstance, DevicePick};
use drover_core::client::services::{RegisteredService, TaskServiceRegistration};
use drover_core::client::{DriverCapabilities, ErrorKind, ExitResult, Io, IoError, Outcome, Reply, TaskHandle};
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest};
use drover_core::structs::{DriverInfo, Node, NodeStatus};

use crate::consul::ConsulHttp;
use crate::csi::CsiClient;
use crate::exec_sessions::ExecSessions;
use drover_io_real::alloc_files::{fs_error, write as write_file};
use drover_io_real::client::{ClientExecutor, TaskServices};
use drover_io_real::devices::{DeviceManager, DeviceStats};
use drover_io_real::drivers::{Drivers, TaskResourceUsage};
use drover_io_real::exec::{ExecReply, ExecRequest};
use drover_io_real::io::BoxFuture;

/// The production executor: host filesystem, process drivers, CSI over unix sockets.
#[derive(Clone, Debug)]
pub struct HostExecutor {
    pub drivers: Drivers,
    pub devices: DeviceManager,
    /// Where the allocation directories are (`<data_dir>/alloc`): what is made, written or read
    /// under one is opened beneath it, never through a link its tasks planted
    /// ([`drover_io_real::confined`]).
    pub alloc_root: PathBuf,
    /// Its `alloc exec` sessions (one set per client).
    pub exec: ExecSessions,
    /// The unix sockets it serves into allocations (Consul's gRPC API for bridge-mode groups).
    pub proxies: crate::socket_proxy::SocketProxies,
}

/// Runs a helper (the `consul` CLI for Envoy bootstraps) to completion; killed if the core's
/// deadline drops the call. Its stdout goes to `stdout_path` only when it exits 0.
async fn run_command(
    program: &str,
    args: &[String],
    env: &[(String, String)],
    stdout_path: &str,
    mode: u32,
    alloc_root: &Path,
) -> Result<Reply, IoError> {
    let output = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(key, value)| (key, value)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| {
            let kind = if error.kind() == std::io::ErrorKind::NotFound {
                ErrorKind::NotFound
            } else {
                ErrorKind::Other
            };
            IoError::new(kind, format!("failed to run {program}: {error}"))
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(IoError::other(format!(
            "{program} {}: {}",
            output.status,
            stderr.trim()
        )));
    }
    write_file(alloc_root, stdout_path, &output.stdout, mode).map(|()| Reply::Unit)
}

/// Whether `path` is a mount point, from the kernel's own table.
fn is_mount_point(path: &str) -> Result<bool, IoError> {
    let canonical = match std::fs::canonicalize(path) {
        Ok(path) => path,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(fs_error(&format!("resolve {path}"), error)),
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo").map_err(|error| fs_error("read mountinfo", error))?;
    Ok(table
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .any(|point| Path::new(point) == canonical))
}

impl ClientExecutor for HostExecutor {
    fn execute(&self, io: Io) -> BoxFuture<Outcome> {
        let drivers = self.drivers.clone();
        let devices = self.devices.clone();
        let alloc_root = self.alloc_root.clone();
        let proxies = self.proxies.clone();
        Box::pin(async move {
            let driver = |name: &str| {
                drivers
                    .get(name)
                    .cloned()
                    .ok_or_else(|| IoError::other(format!("driver \"{name}\" is not available")))
            };
            match io {
                Io::Mkdir { path } => drover_io_real::alloc_files::mkdir(&alloc_root, &path).map(|()| Reply::Unit),
                Io::RemoveAll { path } => match std::fs::remove_dir_all(&path) {
                    Ok(()) => Ok(Reply::Unit),
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Reply::Unit),
                    Err(error) => Err(fs_error(&format!("remove {path}"), error)),
                },
                Io::Rmdir { path } => std::fs::remove_dir(&path)
                    .map(|()| Reply::Unit)
                    .map_err(|error| fs_error(&format!("rmdir {path}"), error)),
                Io::IsMountPoint { path } => is_mount_point(&path).map(Reply::Bool),
                Io::ReadFile { path } => drover_io_real::alloc_files::read(&alloc_root, &path).map(Reply::File),
                Io::WriteFile { path, content, mode } => {
                    write_file(&alloc_root, &path, content.as_bytes(), mode).map(|()| Reply::Unit)
                }
                Io::WriteBytes { path, content, mode } => {
                    write_file(&alloc_root, &path, &content, mode).map(|()| Reply::Unit)
                }
                Io::RunCommand {
                    program,
                    args,
                    env,
                    stdout_path,
                    mode,
                } => run_command(&program, &args, &env, &stdout_path, mode, &alloc_root).await,
                Io::StartTask(config) => {
                    let driver = driver(&config.driver)?;
                    Ok(Reply::Started(driver.start(*config).await?))
                }
                Io::StopTask {
                    handle,
                    kill_timeout,
                    signal,
                } => {
                    let driver = driver(&handle.driver)?;
                    driver.stop(handle, kill_timeout, signal).await?;
                    Ok(Reply::Unit)
                }
                Io::RecoverTask { handle } => {
                    let driver = driver(&handle.driver)?;
                    driver.recover(handle).await?;
                    Ok(Reply::Unit)
                }
                Io::SignalTask { handle, signal } => {
                    let driver = driver(&handle.driver)?;
                    driver.signal(&handle, signal)?;
                    Ok(Reply::Unit)
                }
                Io::RenderTemplate(request) => drover_io_real::template::render_to_file(&request).map(Reply::Rendered),
                Io::DestroyTask { handle } => {
                    let driver = driver(&handle.driver)?;
                    driver.destroy(handle).await?;
                    Ok(Reply::Unit)
                }
                Io::CreateNetwork {
                    alloc_id,
                    driver: name,
                    ports,
                } => Ok(Reply::Network(driver(&name)?.create_network(alloc_id, ports).await?)),
                Io::DestroyNetwork { alloc_id, network } => {
                    driver(&network.driver)?.destroy_network(alloc_id, network).await?;
                    Ok(Reply::Unit)
                }
                Io::ProxySocket { path, target } => proxies.start(&alloc_root, &path, &target).map(|()| Reply::Unit),
                Io::StopProxySocket { path } => {
                    proxies.stop(&path);
                    Ok(Reply::Unit)
                }
                Io::PrepareDevices { picks } => devices.prepare(&picks).map(Reply::Reserved),
                Io::Csi { socket, call } => {
                    let client = CsiClient::connect(&socket, CSI_CONNECT_TIMEOUT)
                        .await
                        .map_err(|error| IoError::new(ErrorKind::Unavailable, error.to_string()))?;
                    client.execute(&call).await
                }
                Io::Server(_) | Io::AllocSync(_) | Io::Consul(_) | Io::Volume(_) | Io::ReserveDevices { .. } => {
                    Err(IoError::other("not an executor request"))
                }
            }
        })
    }

    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult> {
        match self.drivers.get(&handle.driver) {
            Some(driver) => driver.wait(handle),
            None => Box::pin(async move {
                ExitResult {
                    err: Some(format!("driver \"{}\" is not available", handle.driver)),
                    ..ExitResult::default()
                }
            }),
        }
    }

    fn fingerprint(&self) -> Vec<(String, DriverCapabilities, DriverInfo)> {
        self.drivers
            .iter()
            .map(|driver| (driver.name().to_string(), driver.capabilities(), driver.fingerprint()))
            .collect()
    }

    fn node_attributes(&self) -> BTreeMap<String, String> {
        self.devices.attributes()
    }

    fn device_inventory(&self) -> BTreeMap<String, Vec<DeviceInstance>> {
        self.devices.inventory()
    }

    fn device_stats(&self, picks: &[DevicePick]) -> Vec<DeviceStats> {
        self.devices.stats(picks)
    }

    fn host_counters(&self) -> Option<drover_io_real::client::hoststats::HostCounters> {
        Some(read_host_counters(&self.alloc_root))
    }

    fn task_stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage> {
        self.drivers.get(&handle.driver)?.stats(handle)
    }

    fn exec_start(&self, handle: &TaskHandle, command: &[String], tty: bool) -> BoxFuture<Result<u64, AllocCallError>> {
        let launch = self
            .drivers
            .get(&handle.driver)
            .map(|driver| driver.exec_launch(handle, command, tty));
        let (driver, sessions) = (handle.driver.clone(), self.exec.clone());
        Box::pin(async move {
            let launch = launch
                .ok_or_else(|| AllocCallError::failed(format!("driver \"{driver}\" is not available")))?
                .await
                .map_err(|error| {
                    let kind = match error.kind {
                        drover_core::client::ErrorKind::Unsupported => AllocCallFailure::Invalid,
                        _ => AllocCallFailure::Failed,
                    };
                    AllocCallError::new(kind, error.message)
                })?;
            sessions.start(launch, tty).await.map_err(AllocCallError::failed)
        })
    }

    fn exec_step(&self, request: ExecRequest) -> BoxFuture<Result<ExecReply, AllocCallError>> {
        let sessions = self.exec.clone();
        Box::pin(async move { sessions.step(request).await.map_err(AllocCallError::failed) })
    }

    fn controller(&self, socket: String, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, CsiCallError>> {
        Box::pin(async move {
            let client = CsiClient::connect(&socket, CSI_CONNECT_TIMEOUT)
                .await
                .map_err(|error| {
                    CsiCallError::new(
                        CsiCallFailure::Unreachable,
                        format!("CSI client error (retryable): {error}"),
                    )
                })?;
            client.controller_request(&request).await
        })
    }
}

/// How long connecting to a plugin's socket may take (the call itself has the core's deadline).
const CSI_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl TaskServices for ConsulHttp {
    fn agent_services(&self) -> BoxFuture<Result<BTreeMap<String, RegisteredService>, String>> {
        let consul = self.clone();
        Box::pin(async move { consul.agent_services().await })
    }

    fn register(&self, registration: TaskServiceRegistration, address: IpAddr) -> BoxFuture<Result<(), String>> {
        let consul = self.clone();
        Box::pin(async move { consul.register_task_service(&registration, address).await })
    }

    fn deregister(&self, id: String) -> BoxFuture<Result<(), String>> {
        let consul = self.clone();
        Box::pin(async move { consul.deregister_service(&id).await })
    }

    fn agent_checks(&self) -> BoxFuture<Result<BTreeMap<String, String>, String>> {
        let consul = self.clone();
        Box::pin(async move { consul.agent_checks().await })
    }

    fn fingerprint(&self) -> BoxFuture<Result<BTreeMap<String, String>, String>> {
        let consul = self.clone();
        Box::pin(async move { consul.fingerprint().await })
    }

    fn supported_proxies(&self) -> BoxFuture<Result<BTreeMap<String, Vec<String>>, String>> {
        let consul = self.clone();
        Box::pin(async move { consul.supported_proxies().await })
    }
}

/// The client's settings and node record for an agent whose data lives in `data_dir`:
/// client state under `<data_dir>/client`, allocations under `<data_dir>/alloc`.
pub fn client_identity(
    config: &drover_core::config::AgentConfig,
    node_id: u64,
    data_dir: &Path,
    host_volumes: BTreeMap<String, drover_core::client::volume_hook::HostVolumeConfig>,
) -> (ClientSettings, Node) {
    let id = drover_io_real::client::node_uuid(node_id);
    let settings = ClientSettings {
        node_id: id.clone(),
        paths: drover_core::client::paths::ClientPaths::new(
            data_dir.join("client").display().to_string(),
            data_dir.join("alloc").display().to_string(),
        ),
        host_volumes: host_volumes.clone(),
        region: config.region.clone(),
        seed: node_id,
        faults: config.client.faults,
        consul: config.consul.for_client(),
        max_kill_timeout: config
            .client
            .max_kill_timeout
            .unwrap_or(drover_core::client::task_runner::DEFAULT_MAX_KILL_TIMEOUT),
    };
    let mut resources = host_resources();
    // The disk allocation directories may take: what is free where they live, at start (as
    // Nomad's storage fingerprint).
    if let Some(data_dir) = &config.data_dir {
        let alloc_root = std::path::Path::new(data_dir).join("alloc");
        let probe = if alloc_root.exists() {
            alloc_root
        } else {
            std::path::PathBuf::from(data_dir)
        };
        resources.disk_mb = disk_free_mb(&probe).unwrap_or(0);
    }
    resources.networks = host_networks(config);
    resources.reserved_ports = config.client.reserved_ports.clone();
    resources.min_dynamic_port = config.client.min_dynamic_port;
    resources.max_dynamic_port = config.client.max_dynamic_port;
    let node = Node {
        id,
        name: config.name.clone(),
        datacenter: config.datacenter.clone(),
        rpc_addr: config.advertise.rpc.to_string(),
        http_addr: config.advertise.http.to_string(),
        status: NodeStatus::Ready,
        host_volumes,
        // Nomad's `connect.*` defaults where the operator set none.
        meta: drover_core::connect::envoy_version::with_client_meta_defaults(config.client.meta.clone()),
        node_class: config.client.node_class.clone(),
        attributes: host_attributes(config, &resources),
        resources,
        ..Node::default()
    };
    (settings, node)
}

/// The host's fingerprinted attributes under Nomad's names (`${attr.*}` in constraints and
/// interpolation): kernel, OS, CPU, memory, hostname and the advertised address.
pub fn host_attributes(
    config: &drover_core::config::AgentConfig,
    resources: &drover_core::structs::NodeResources,
) -> BTreeMap<String, String> {
    let mut attributes = BTreeMap::new();
    // SAFETY: uname writes into the zeroed struct we own.
    let uts = unsafe {
        let mut uts: libc::utsname = std::mem::zeroed();
        (libc::uname(&mut uts) == 0).then_some(uts)
    };
    let field = |chars: &[libc::c_char]| -> String {
        let bytes: Vec<u8> = chars.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    if let Some(uts) = uts {
        attributes.insert("kernel.name".into(), field(&uts.sysname).to_lowercase());
        attributes.insert("kernel.version".into(), field(&uts.release));
        attributes.insert("unique.hostname".into(), field(&uts.nodename));
    }
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let os_value = |key: &str| {
        os_release
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .map(|value| value.trim_matches('"').to_string())
    };
    if let Some(name) = os_value("ID") {
        attributes.insert("os.name".into(), name);
    }
    if let Some(version) = os_value("VERSION_ID") {
        attributes.insert("os.version".into(), version);
    }
    // Go's names for the architectures, as Nomad reports them.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    };
    attributes.insert("cpu.arch".into(), arch.into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    attributes.insert("cpu.numcores".into(), cores.to_string());
    attributes.insert("cpu.totalcompute".into(), resources.cpu.to_string());
    attributes.insert(
        "memory.totalbytes".into(),
        (resources.memory_mb * 1024 * 1024).to_string(),
    );
    attributes.insert(
        "unique.network.ip-address".into(),
        config.advertise.http.ip().to_string(),
    );
    attributes.insert("nomad.version".into(), NOMAD_COMPATIBLE_VERSION.into());
    attributes.insert("drover.version".into(), env!("CARGO_PKG_VERSION").into());
    attributes
}

/// Every address of every interface that is up (IPv4 before IPv6, then by interface name).
pub fn interfaces() -> Vec<drover_core::structs::NodeNetwork> {
    let mut found = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we walk read-only and then free.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Vec::new();
    }
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let device = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let Some(ip) = sockaddr_ip(ifa.ifa_addr) else { continue };
        let prefix = sockaddr_ip(ifa.ifa_netmask).map_or(0, |mask| match mask {
            std::net::IpAddr::V4(mask) => u32::from(mask).count_ones(),
            std::net::IpAddr::V6(mask) => u128::from(mask).count_ones(),
        });
        found.push((ip.is_ipv6(), device, ip, prefix));
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found.sort();
    found
        .into_iter()
        .map(|(_, device, ip, prefix)| drover_core::structs::NodeNetwork {
            device,
            ip: ip.to_string(),
            cidr: format!("{ip}/{prefix}"),
        })
        .collect()
}

fn sockaddr_ip(addr: *const libc::sockaddr) -> Option<std::net::IpAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the family says which sockaddr this is; each is read as its own type.
    unsafe {
        match i32::from((*addr).sa_family) {
            libc::AF_INET => {
                let v4 = &*(addr as *const libc::sockaddr_in);
                Some(std::net::IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(
                    v4.sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => {
                let v6 = &*(addr as *const libc::sockaddr_in6);
                Some(std::net::IpAddr::V6(std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

/// The address tasks' ports are allocated on (Nomad's network fingerprint): the configured
/// `network_interface`'s first address; else the interface holding the advertised address;
/// else, when the agent advertises no specific address, the default route's interface; else
/// loopback.
pub fn host_networks(config: &drover_core::config::AgentConfig) -> Vec<drover_core::structs::NodeNetwork> {
    let all = interfaces();
    let on = |device: &str| all.iter().find(|network| network.device == device).cloned();
    let chosen = if !config.client.network_interface.is_empty() {
        on(&config.client.network_interface)
    } else {
        let advertised = config.advertise.http.ip();
        if advertised.is_unspecified() {
            default_route_interface().and_then(|device| on(&device))
        } else {
            all.iter()
                .find(|network| network.ip == advertised.to_string())
                .cloned()
                .or_else(|| {
                    Some(drover_core::structs::NodeNetwork {
                        device: String::new(),
                        ip: advertised.to_string(),
                        cidr: format!("{advertised}/{}", if advertised.is_ipv6() { 128 } else { 32 }),
                    })
                })
        }
    };
    vec![chosen.unwrap_or_else(|| drover_core::structs::NodeNetwork {
        device: "lo".into(),
        ip: "127.0.0.1".into(),
        cidr: "127.0.0.1/8".into(),
    })]
}

/// The interface of the IPv4 default route, from /proc/net/route.
fn default_route_interface() -> Option<String> {
    let table = std::fs::read_to_string("/proc/net/route").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"00000000")).then(|| fields[0].to_string())
    })
}

/// The Nomad version whose API and behaviour the agent follows (`${attr.nomad.version}`, for
/// jobs that constrain on it).
pub const NOMAD_COMPATIBLE_VERSION: &str = "1.1.2";

/// The host's CPU (cores × MHz, as Nomad counts it) and memory (MB), from /proc.
pub fn host_resources() -> drover_core::structs::NodeResources {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mhz: Vec<f64> = cpuinfo
        .lines()
        .filter(|line| line.starts_with("cpu MHz"))
        .filter_map(|line| line.split(':').nth(1)?.trim().parse().ok())
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    // Without a clock rate (some VMs and ARM hosts) Nomad's fallback: 1 GHz per core.
    let per_core = if mhz.is_empty() {
        1000.0
    } else {
        mhz.iter().sum::<f64>() / mhz.len() as f64
    };
    let memory_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|line| line.starts_with("MemTotal:"))
        .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    drover_core::structs::NodeResources {
        cpu: (per_core * cores as f64) as u64,
        memory_mb: memory_kb / 1024,
        ..Default::default()
    }
}

/// The host's counters from `/proc` and the filesystem holding `alloc_root`.
pub fn read_host_counters(alloc_root: &std::path::Path) -> drover_io_real::client::hoststats::HostCounters {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| {
        meminfo
            .lines()
            .find(|line| line.starts_with(key))
            .and_then(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpus = stat
        .lines()
        .filter(|line| line.starts_with("cpu") && line.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?.to_string();
            let ticks: Vec<u64> = fields.filter_map(|field| field.parse().ok()).collect();
            // user nice system idle iowait irq softirq steal (guest time is inside user).
            let at = |index: usize| ticks.get(index).copied().unwrap_or(0);
            Some(drover_io_real::client::hoststats::CpuTimes {
                name,
                user: at(0) + at(1),
                system: at(2) + at(5) + at(6),
                idle: at(3) + at(4),
                total: (0..8).map(at).sum(),
            })
        })
        .collect();
    let uptime_secs = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0) as u64;
    drover_io_real::client::hoststats::HostCounters {
        memory_total: kib("MemTotal:"),
        memory_available: kib("MemAvailable:"),
        memory_free: kib("MemFree:"),
        cpus,
        alloc_disk: disk_usage(alloc_root),
        uptime_secs,
        unix_nanos: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos()),
    }
}

/// The space free (to unprivileged users) on the filesystem holding `path`, in MB.
pub fn disk_free_mb(path: &std::path::Path) -> Option<u64> {
    disk_usage(path).map(|disk| disk.available / (1024 * 1024))
}

/// `statvfs` of `path`, named by the mount that holds it (`/proc/self/mounts`).
fn disk_usage(path: &std::path::Path) -> Option<drover_io_real::client::hoststats::DiskUsage> {
    use std::os::unix::ffi::OsStrExt;
    let path = path.canonicalize().ok()?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c_path` is a valid C string; `stat` is written by the call before it is read.
    let stat = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c_path.as_ptr(), &mut stat) != 0 {
            return None;
        }
        stat
    };
    let block = stat.f_frsize as u64;
    let size = stat.f_blocks as u64 * block;
    let available = stat.f_bavail as u64 * block;
    let used = size.saturating_sub(stat.f_bfree as u64 * block);
    let inodes = stat.f_files as u64;
    let inodes_used_percent = if inodes == 0 {
        0.0
    } else {
        inodes.saturating_sub(stat.f_ffree as u64) as f64 * 100.0 / inodes as f64
    };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let (device, mountpoint) = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?.to_string(), fields.next()?.to_string()))
        })
        .filter(|(_, mountpoint)| path.starts_with(mountpoint))
        .max_by_key(|(_, mountpoint)| mountpoint.len())
        .unwrap_or_default();
    Some(drover_io_real::client::hoststats::DiskUsage {
        device,
        mountpoint,
        size,
        used,
        available,
        inodes_used_percent,
    })
}

#[cfg(test)]
mod fingerprint_tests {
    use super::*;

    #[test]
    fn host_attributes_use_nomads_names_and_this_hosts_values() {
        let config = drover_core::config::AgentConfig::default();
        let resources = host_resources();
        let attributes = host_attributes(&config, &resources);
        assert_eq!(attributes["kernel.name"], "linux");
        assert_eq!(
            attributes["cpu.numcores"],
            std::thread::available_parallelism().unwrap().get().to_string()
        );
        assert_eq!(
            attributes["memory.totalbytes"],
            (resources.memory_mb * 1024 * 1024).to_string()
        );
        assert_eq!(
            attributes["unique.network.ip-address"],
            config.advertise.http.ip().to_string()
        );
        assert_eq!(attributes["nomad.version"], NOMAD_COMPATIBLE_VERSION);
        assert!(!attributes["kernel.version"].is_empty() && !attributes["unique.hostname"].is_empty());
    }
}

#[cfg(test)]
mod confined_tests {
    use super::*;

    fn executor(alloc_root: &Path) -> HostExecutor {
        HostExecutor {
            drivers: crate::drivers::builtin(false, false, None),
            devices: DeviceManager::default(),
            alloc_root: alloc_root.to_path_buf(),
            exec: ExecSessions::default(),
            proxies: Default::default(),
        }
    }

    /// Issue 54: the secrets dir's token, the Envoy bootstrap and a dispatch payload are
    /// written as root into directories the task owns. A task that made `secrets` a link to a
    /// host directory, or planted a link at the file's temporary name, must not have the agent
    /// write through it; the task dirs are made beneath the allocation directory too.
    #[tokio::test]
    async fn writes_into_a_task_dir_never_follow_a_link_the_task_planted() {
        let data = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let alloc_root = data.path().join("alloc");
        let task = alloc_root.join("a1/web");
        let executor = executor(&alloc_root);
        let path = |rest: &str| task.join(rest).display().to_string();
        let run = |io| executor.execute(io);
        run(Io::Mkdir { path: path("secrets") }).await.unwrap();
        run(Io::WriteFile {
            path: path("secrets/si_token"),
            content: "token".into(),
            mode: 0o440,
        })
        .await
        .unwrap();
        assert!(matches!(
            run(Io::ReadFile { path: path("secrets/si_token") }).await,
            Ok(Reply::File(Some(text))) if text == "token"
        ));

        // The temporary name planted as a link to a host file: the file is left alone.
        let host_file = outside.path().join("shadow");
        std::fs::write(&host_file, "root:*:").unwrap();
        std::os::unix::fs::symlink(&host_file, task.join("secrets/.si_token.drover-tmp")).unwrap();
        run(Io::WriteFile {
            path: path("secrets/si_token"),
            content: "again".into(),
            mode: 0o440,
        })
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "root:*:");

        // `secrets` made a link to a host directory: nothing is written, made or read there.
        std::fs::remove_dir_all(task.join("secrets")).unwrap();
        std::os::unix::fs::symlink(outside.path(), task.join("secrets")).unwrap();
        let refused = run(Io::WriteBytes {
            path: path("secrets/payload"),
            content: b"x".to_vec(),
            mode: 0o644,
        })
        .await
        .unwrap_err();
        assert_eq!(refused.kind, ErrorKind::FailedPrecondition, "{}", refused.message);
        for io in [
            Io::Mkdir {
                path: path("secrets/sub"),
            },
            Io::ReadFile {
                path: path("secrets/shadow"),
            },
        ] {
            let refused = run(io).await.unwrap_err();
            assert_eq!(refused.kind, ErrorKind::FailedPrecondition, "{}", refused.message);
        }
        let names: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("shadow")]);
    }

    #[test]
    fn this_hosts_counters_are_read() {
        let counters = read_host_counters(&std::env::temp_dir());
        assert!(counters.memory_total > 0 && counters.memory_available <= counters.memory_total);
        assert!(!counters.cpus.is_empty() && counters.cpus[0].name == "cpu0");
        let disk = counters.alloc_disk.expect("the temp dir's filesystem");
        assert!(disk.size > 0 && !disk.mountpoint.is_empty(), "{disk:?}");
        assert!(counters.uptime_secs > 0);
    }
}
