//! `agent`: runs a Drover agent (server, client or both) with Nomad's flags and HCL config.
//!
//! `agent -dev` starts a single server+client with an embedded store under a temporary
//! directory. Flags may be written Nomad's way (`-bootstrap-expect=3`) or GNU-style.

mod cli;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use drover_host::consul::ConsulHttp;
use drover_host::net::GrpcTransport;
use drover_host::tls::agent::AgentTls;
use drover_host::{HostExecutor, client_identity};
use drover_io_real::client::{ClientCsiRouter, ClientParts, start_client};
use drover_io_real::devices::{DeviceManager, FakeDevicePlugin};
use drover_io_real::driver::{AgentHandle, AgentParts, start_agent};
use drover_io_real::io::{Consul, NoConsul, TracingObserver};

use drover_host::agent_config::{self as config, Flags, Loaded};

#[derive(Debug, Parser)]
#[command(
    name = "agent",
    version,
    about = "Drover agent: Nomad-compatible cluster formation, replicated state and CSI storage",
    after_help = "Flags may also be written with a single dash, as Nomad does: agent -dev, agent -server -bootstrap-expect=3"
)]
struct Cli {
    /// Operator commands (talk to an agent's HTTP API); without one, run the agent.
    #[command(subcommand)]
    command: Option<cli::Command>,
    #[command(flatten)]
    global: cli::Global,
    /// Start a single server+client with an embedded store in a temporary directory.
    #[arg(long)]
    dev: bool,
    /// Enable server mode.
    #[arg(long)]
    server: bool,
    /// Enable client mode.
    #[arg(long)]
    client: bool,
    /// Servers to wait for before bootstrapping Raft (0 = never, 1 = single server).
    #[arg(long = "bootstrap-expect", value_name = "N")]
    bootstrap_expect: Option<u32>,
    /// Directory for the agent's durable state.
    #[arg(long = "data-dir", value_name = "PATH")]
    data_dir: Option<String>,
    /// Address to bind every listener to.
    #[arg(long, value_name = "IP")]
    bind: Option<String>,
    /// HTTP API port (default 4646).
    #[arg(long = "http-port", value_name = "PORT")]
    http_port: Option<u16>,
    /// RPC port (default 4647).
    #[arg(long = "rpc-port", value_name = "PORT")]
    rpc_port: Option<u16>,
    /// Gossip port (default 4648).
    #[arg(long = "serf-port", value_name = "PORT")]
    serf_port: Option<u16>,
    /// Address of a server to join; repeatable.
    #[arg(long = "retry-join", value_name = "ADDR")]
    retry_join: Vec<String>,
    /// Interval between join attempts (default 30s).
    #[arg(long = "retry-interval", value_name = "DURATION")]
    retry_interval: Option<String>,
    /// Maximum join attempts (0 = unlimited).
    #[arg(long = "retry-max", value_name = "N")]
    retry_max: Option<u32>,
    /// Servers a client talks to, `host[:port]`, comma-separated; repeatable.
    #[arg(long, value_name = "ADDRS")]
    servers: Vec<String>,
    /// Region of this agent (default "global").
    #[arg(long, value_name = "NAME")]
    region: Option<String>,
    /// Datacenter of this agent (default "dc1").
    #[arg(long, value_name = "NAME")]
    dc: Option<String>,
    /// Node name (default: "dev" in dev mode, else "drover").
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Consul agent address (host:port) for server discovery.
    #[arg(long = "consul-address", value_name = "ADDR")]
    consul_address: Option<String>,
    /// Log level (TRACE, DEBUG, INFO, WARN, ERROR).
    #[arg(long = "log-level", value_name = "LEVEL")]
    log_level: Option<String>,
    /// Config file or directory of *.hcl files; repeatable, later ones win.
    #[arg(long, value_name = "PATH")]
    config: Vec<PathBuf>,
}

impl Cli {
    fn into_flags(self) -> Flags {
        Flags {
            dev: self.dev,
            server: self.server,
            client: self.client,
            bootstrap_expect: self.bootstrap_expect,
            data_dir: self.data_dir,
            bind: self.bind,
            http_port: self.http_port,
            rpc_port: self.rpc_port,
            serf_port: self.serf_port,
            retry_join: self.retry_join,
            retry_interval: self.retry_interval,
            retry_max: self.retry_max,
            servers: self.servers,
            region: self.region,
            dc: self.dc,
            node: self.node,
            consul_address: self.consul_address,
            log_level: self.log_level,
            config: self.config,
        }
    }
}

/// Nomad writes long flags with one dash (`-bootstrap-expect=3`); clap wants two. The command
/// of `alloc exec` and of `var lock` is left as written: like Go's flag parsing, flags end at
/// the first argument that is not one (the allocation, the variable's path).
fn normalize_args(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let args: Vec<OsString> = args.collect();
    let is = |position: usize, word: &str| args.get(position).is_some_and(|arg| arg == word);
    // The flags of such a command that take their value as the next argument.
    let value_flags: Option<&[&str]> = if is(1, "alloc") && is(2, "exec") {
        Some(&["task"])
    } else if is(1, "var") && is(2, "lock") {
        Some(&["ttl", "delay", "max-retry"])
    } else {
        None
    };
    let mut verbatim = false;
    let mut previous = OsString::new();
    args.iter()
        .enumerate()
        .map(|(position, arg)| {
            if verbatim {
                return arg.clone();
            }
            let flag_value = value_flags.is_some_and(|flags| {
                previous
                    .to_str()
                    .map(|flag| flag.trim_start_matches('-'))
                    .is_some_and(|flag| flags.contains(&flag))
            });
            previous = arg.clone();
            match arg.to_str() {
                // `-i=false` is a one-letter flag with its value, not a long flag.
                Some(text)
                    if position > 0
                        && text.len() > 2
                        && text.starts_with('-')
                        && !text.starts_with("--")
                        && text.as_bytes()[2] != b'=' =>
                {
                    OsString::from(format!("-{text}"))
                }
                Some(text) if value_flags.is_some() && position > 2 && !text.starts_with('-') && !flag_value => {
                    verbatim = true;
                    arg.clone()
                }
                _ => arg.clone(),
            }
        })
        .collect()
}

fn main() -> ExitCode {
    // A task's log collector, started by this agent's client (never typed by operators).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == drover_io_real::logmon::SUBCOMMAND)
    {
        return drover_io_real::logmon::main(std::env::args_os().skip(2));
    }
    // `alloc exec` into an `exec` task's namespaces, started by this agent's client.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == drover_host::nsexec::SUBCOMMAND)
    {
        return drover_host::nsexec::main(std::env::args_os().skip(2));
    }
    // A `raw_exec` task on its way in, started by this agent's client without a fork.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == drover_io_real::taskexec::SUBCOMMAND)
    {
        return drover_io_real::taskexec::main(std::env::args_os().skip(2));
    }
    let mut cli = Cli::parse_from(normalize_args(std::env::args_os()));
    if let Some(command) = cli.command.take() {
        // An operator's command piped into `head` stops quietly when the pipe closes, as
        // Nomad's (and every Unix tool's) does, instead of panicking in `println!`: the
        // default action of SIGPIPE, which Rust's runtime ignores. Only here — the agent's
        // own sockets are written with MSG_NOSIGNAL, but it never needs the signal.
        // SAFETY: signal has no memory preconditions; no thread has been started yet.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        return cli::run(cli.global, command);
    }
    let flags = cli.into_flags();
    let mut dev_dir: Option<PathBuf> = None;
    let loaded = config::load(&flags, || {
        let dir = std::env::temp_dir().join(format!("drover-dev-{}", std::process::id()));
        dev_dir = Some(dir.clone());
        Ok(dir.display().to_string())
    });
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("==> {error:#}");
            return ExitCode::from(1);
        }
    };
    for note in &loaded.notes {
        eprintln!("==> WARNING: {note}");
    }
    match loaded.config.validate() {
        Ok(warnings) => {
            for warning in warnings {
                eprintln!("==> {warning}");
            }
        }
        Err(error) => {
            eprintln!("==> {error}");
            return ExitCode::from(1);
        }
    }
    init_logging(&loaded.log_level);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(run(loaded));
    if let Some(dir) = dev_dir {
        remove_dev_dir(&dir);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("==> Error starting agent: {error:#}");
            ExitCode::from(1)
        }
    }
}

/// Removes the throwaway data dir of `-dev`, unless something is still mounted below it:
/// deleting through a bind mount would delete a volume's data.
fn remove_dev_dir(dir: &std::path::Path) {
    let prefix = dir.display().to_string();
    let mounted: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4).map(String::from))
        .filter(|point| point.starts_with(&prefix))
        .collect();
    if mounted.is_empty() {
        let _ = std::fs::remove_dir_all(dir);
    } else {
        eprintln!(
            "==> Keeping {}: still mounted below it: {}",
            dir.display(),
            mounted.join(", ")
        );
    }
}

/// The log filter for `-log-level` (openraft's own lines are off: the agent logs Raft's
/// events itself).
fn log_filter(level: &str) -> tracing_subscriber::EnvFilter {
    let mut directives = format!("{},openraft=off", level.to_lowercase());
    for target in drover_io_real::logbus::TRANSPORT_LOG_TARGETS {
        directives.push_str(&format!(",{target}=info"));
    }
    tracing_subscriber::EnvFilter::new(directives)
}

/// The agent's log on stderr at its `-log-level`, and beside it the lines `agent monitor`
/// watchers ask for, at their own levels (`drover_io_real::logbus`).
fn init_logging(level: &str) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| log_filter(level));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_target(false).with_filter(filter))
        .with(drover_io_real::logbus::layer())
        .init();
}

/// The agent's Consul client: `consul { address token }` over the block's TLS and auth.
fn consul_http(config: &drover_core::config::AgentConfig, address: &str) -> anyhow::Result<ConsulHttp> {
    let consul = ConsulHttp::with_transport(address, config.consul.timeout, &config.consul.transport)
        .context("consul: cannot set up TLS")?;
    Ok(consul.with_token(config.consul.token.clone()))
}

async fn run(loaded: Loaded) -> anyhow::Result<()> {
    let config = loaded.config.clone();
    let data_dir = PathBuf::from(config.data_dir.clone().context("no data dir")?);
    let db = drover_host::disk::open_database(&data_dir)?;
    let is_client = config.client.enabled || config.dev_mode;
    let tls = match loaded.tls.enabled() {
        true => Some(Arc::new(
            AgentTls::load(loaded.tls.clone(), &config.region).context("tls: cannot load the agent's certificates")?,
        )),
        false => None,
    };
    let mutual_rpc = tls
        .as_ref()
        .is_some_and(|tls| tls.settings().rpc && tls.settings().verify_server_hostname);
    if config.acl.enabled && !mutual_rpc {
        // Nomad's own advice: ACLs without mutual TLS protect the API, not the cluster.
        tracing::warn!(
            "ACLs are enabled but agent RPC has no mutual TLS (tls {{ rpc = true, verify_server_hostname = true }}): \
             every server request is still checked against its ACL token, but whoever reaches the RPC port can \
             send Raft's own messages as if it were a server"
        );
    }
    let (router, inbox) = ClientCsiRouter::new();
    // Dev mode's client destroys its allocations when the agent stops, as Nomad's does.
    let destroy_on_stop = (config.dev_mode && is_client).then(|| router.clone());
    let client_csi: Option<Arc<dyn drover_io_real::io::ClientCsi>> = is_client.then(|| Arc::new(router) as _);
    let handle = match &config.consul.address {
        Some(address) => {
            let consul = consul_http(&config, address)?;
            start(&loaded, db, consul, client_csi, tls.clone()).await?
        }
        None => start(&loaded, db, NoConsul, client_csi, tls.clone()).await?,
    };
    if is_client {
        // Allocations come from the local server's state, or from `client.servers`.
        for (name, volume) in &config.client.host_volumes {
            if !std::path::Path::new(&volume.path).is_dir() {
                anyhow::bail!("host_volume {name:?}: path {:?} is not a directory", volume.path);
            }
        }
        let (settings, node) =
            client_identity(&config, handle.node_id(), &data_dir, config.client.host_volumes.clone());
        // The client's view reaches the HTTP API through the agent (`ClientCsiRouter`).
        start_client(ClientParts {
            agent: handle.clone(),
            settings,
            executor: Arc::new(HostExecutor {
                drivers: drover_host::drivers::builtin(
                    config.client.raw_exec_enabled,
                    config.client.mock_driver_enabled,
                    std::env::current_exe().ok(),
                )
                .with(Arc::new(
                    drover_docker::driver(
                        config.client.docker.clone(),
                        &drover_docker::endpoint(&config.client.docker, std::env::var("DOCKER_HOST").ok()),
                    )
                    .with_alloc_root(&data_dir.join("alloc")),
                )),
                // -dev shows the device hook at work with two fake GPUs.
                devices: if config.dev_mode {
                    DeviceManager::default().with(Arc::new(FakeDevicePlugin::new(2)))
                } else {
                    DeviceManager::default()
                },
                alloc_root: data_dir.join("alloc"),
                exec: Default::default(),
                proxies: Default::default(),
            }),
            store: drover_host::disk::open_client_store(&data_dir.join("client"))?,
            inbox,
            node,
            services: match &config.consul.address {
                Some(address) => {
                    Some(Arc::new(consul_http(&config, address)?) as Arc<dyn drover_io_real::client::TaskServices>)
                }
                None => None,
            },
        })?;
    }
    let http_addr = SocketAddr::new(config.bind_addr, config.ports.http);
    let https = tls.clone().filter(|tls| tls.settings().http);
    let sockets = drover_host::sockets::TokioSockets;
    let bound = drover_http::serve_tls(&sockets, handle.clone(), http_addr, loaded.http_limits, https)
        .await
        .with_context(|| format!("failed to bind HTTP on {http_addr}"))?;
    if let Some(tls) = tls {
        tokio::spawn(reload_on_hangup(tls));
    }
    print_banner(&loaded, bound);
    tokio::spawn(release_start_up_code());
    tokio::spawn(release_free_heap());
    tokio::select! {
        () = wait_for_signal() => {
            eprintln!("==> Caught signal, shutting down");
            if let Some(client) = destroy_on_stop
                && !client.destroy_allocations(DEV_DESTROY_LIMIT).await
            {
                tracing::warn!(limit = ?DEV_DESTROY_LIMIT, "allocations still being destroyed; stopping anyway");
            }
            handle.shutdown().await;
            Ok(())
        }
        // Fail-stop: a server whose storage failed exits for its supervisor to restart it on
        // what is durable, rather than linger as a voter that can no longer vote.
        reason = handle.failed() => {
            anyhow::bail!("{reason}; exiting so the agent restarts from its data dir")
        }
    }
}

async fn start<C: Consul>(
    loaded: &Loaded,
    db: redb::Database,
    consul: C,
    client_csi: Option<Arc<dyn drover_io_real::io::ClientCsi>>,
    tls: Option<Arc<AgentTls>>,
) -> anyhow::Result<AgentHandle> {
    let mut transport = GrpcTransport::default()
        .with_max_conns_per_client(loaded.rpc_max_conns_per_client)
        .with_handshake_timeout(loaded.rpc_handshake_timeout);
    if let Some(tls) = tls.filter(|tls| tls.settings().rpc) {
        transport = transport.with_tls(tls);
    }
    let parts = AgentParts {
        config: loaded.config.clone(),
        db,
        transport,
        consul,
        observer: Arc::new(TracingObserver),
        client_csi,
        disk_latency: None,
        keystore: None,
    };
    Ok(start_agent(parts).await?)
}

fn print_banner(loaded: &Loaded, http: SocketAddr) {
    let config = &loaded.config;
    println!("==> Drover agent configuration:");
    println!();
    println!(
        "       Advertise Addrs: HTTP: {}; RPC: {}; Serf: {}",
        config.advertise.http, config.advertise.rpc, config.advertise.serf
    );
    println!(
        "            Bind Addrs: HTTP: {http}; RPC: {}:{}; Serf: {}:{}",
        config.bind_addr, config.ports.rpc, config.bind_addr, config.ports.serf
    );
    println!("                Client: {}", config.client.enabled);
    println!(
        "                   TLS: HTTP: {}; RPC: {}",
        loaded.tls.http, loaded.tls.rpc
    );
    println!("              Data Dir: {}", config.data_dir.as_deref().unwrap_or(""));
    println!("             Log Level: {}", loaded.log_level);
    println!("                Region: {} (DC: {})", config.region, config.datacenter);
    println!(
        "                Server: {} (bootstrap_expect: {})",
        config.server.enabled, config.server.bootstrap_expect
    );
    println!("               Version: {}", env!("CARGO_PKG_VERSION"));
    println!();
    println!("==> Drover agent started! Log data will stream in below:");
}

/// How long a dev agent's shutdown waits for its client to destroy its allocations: the
/// longest `kill_timeout` a task may have (the client's `max_kill_timeout`) and some.
const DEV_DESTROY_LIMIT: std::time::Duration = std::time::Duration::from_secs(45);

/// How long after start the agent lets go of code it ran only to start: long enough for the
/// first leader, the client's registration, fingerprint and allocation sync.
const START_UP: std::time::Duration = std::time::Duration::from_secs(10);

/// Drops the mappings of start-up-only code (`drover_host::memory`): most of an idle
/// agent's resident memory. Code that runs again is mapped back by one minor fault.
async fn release_start_up_code() {
    tokio::time::sleep(START_UP).await;
    match drover_host::memory::release_code_pages() {
        Ok(released) => tracing::info!(
            kib = released.kib,
            mappings = released.mappings,
            "released the start-up pages of the agent's code"
        ),
        Err(error) => tracing::warn!(%error, "could not release the start-up pages of the agent's code"),
    }
}

/// How often the agent checks for free heap to hand back, and how much makes it worth it.
const HEAP_CHECK: std::time::Duration = std::time::Duration::from_secs(15);
const HEAP_TRIM_THRESHOLD: usize = 32 << 20;

/// Hands freed heap back to the kernel (`drover_host::memory::release_free_heap`): after a
/// purge and GC, or a burst of big requests, the agent's RSS falls back instead of staying at
/// its peak.
async fn release_free_heap() {
    let mut ticks = tokio::time::interval(HEAP_CHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let freed = tokio::task::spawn_blocking(|| drover_host::memory::release_free_heap(HEAP_TRIM_THRESHOLD)).await;
        if let Ok(Some(freed)) = freed {
            tracing::debug!(
                free_kib = freed.free >> 10,
                rss_before_kib = freed.rss_before_kib,
                rss_after_kib = freed.rss_after_kib,
                "handed free heap back to the kernel"
            );
        }
    }
}

/// SIGHUP re-reads the CA, certificate and key named in `tls {}` (Nomad's reload): new
/// handshakes use them at once; open connections, and with them the cluster, stay up. A file
/// that cannot be read leaves the certificates in use, and says why.
async fn reload_on_hangup(tls: Arc<AgentTls>) {
    let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP: TLS certificates will not be reloaded");
        return;
    };
    while hangups.recv().await.is_some() {
        eprintln!("==> Caught signal: hangup");
        match tls.reload() {
            Ok(()) => tracing::info!("reloaded the TLS certificates"),
            Err(error) => tracing::error!(%error, "reloading the TLS certificates failed; keeping those in use"),
        }
    }
}

async fn wait_for_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    /// At DEBUG the agent's own lines are written and the transports' frame-by-frame ones
    /// are not (their INFO lines are).
    #[test]
    fn debug_logging_leaves_out_the_transports_frames() {
        use std::sync::{Arc, Mutex};
        let written = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = written.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(super::log_filter("DEBUG"))
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "h2::codec::framed_read", "received frame=Data");
            tracing::debug!(target: "hyper_util::client::legacy::pool", "pooling idle connection");
            tracing::debug!(target: "rustls::client::hs", "ALPN protocol is h2");
            tracing::info!(target: "tonic::transport", "a transport's notice");
            tracing::debug!(target: "drover_io_real::driver", "an agent's debug line");
        });
        let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with("a transport's notice"), "{text}");
        assert!(lines[1].ends_with("an agent's debug line"), "{text}");
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    use super::*;

    fn normalized(args: &[&str]) -> Vec<String> {
        normalize_args(args.iter().map(OsString::from))
            .into_iter()
            .map(|arg| arg.into_string().unwrap())
            .collect()
    }

    #[test]
    fn long_flags_get_two_dashes_but_not_an_exec_command_or_one_letter_values() {
        assert_eq!(
            normalized(&["agent", "-server", "-bootstrap-expect=3", "-i"]),
            ["agent", "--server", "--bootstrap-expect=3", "-i"]
        );
        assert_eq!(
            normalized(&[
                "agent", "alloc", "exec", "-i=false", "-task", "web", "abc", "ls", "-la", "-task"
            ]),
            [
                "agent", "alloc", "exec", "-i=false", "--task", "web", "abc", "ls", "-la", "-task"
            ]
        );
        // Flags may follow `-task web`; the command starts after the allocation.
        assert_eq!(
            normalized(&[
                "agent", "alloc", "exec", "-task", "web", "-i=false", "abc", "sh", "-cx", "id"
            ]),
            [
                "agent", "alloc", "exec", "--task", "web", "-i=false", "abc", "sh", "-cx", "id"
            ]
        );
        // `var lock`: its flags' values, then the path, then the command as written.
        assert_eq!(
            normalized(&[
                "agent",
                "var",
                "lock",
                "-ttl",
                "20s",
                "-delay=1s",
                "app/leader",
                "sh",
                "-c",
                "-x"
            ]),
            [
                "agent",
                "var",
                "lock",
                "--ttl",
                "20s",
                "--delay=1s",
                "app/leader",
                "sh",
                "-c",
                "-x"
            ]
        );
    }
}
