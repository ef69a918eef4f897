//! The README's TLS cluster, by its commands: `agent tls ca create` and `agent tls cert create
//! -server|-client|-cli` write Nomad's files (keys 0600, nothing overwritten); an agent serves
//! HTTPS and mutual-TLS RPC with them; the CLI reaches it with `-ca-cert` or `NOMAD_CACERT`
//! and is refused without; `alloc exec` runs a command in a task over `wss://`; and a peer
//! that connects and stays silent is dropped when its handshake deadline passes, without
//! holding up anyone else.

use crate::support;

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{AGENT, Agent, cluster_specs, server_args, wait_for};

/// Runs the CLI in `dir`: exit code and everything it printed.
fn cli(dir: &Path, args: &[&str], env: &[(&str, String)]) -> (i32, String) {
    let mut command = Command::new(AGENT);
    command
        .args(args)
        .current_dir(dir)
        .env_remove("NOMAD_CACERT")
        .env_remove("NOMAD_ADDR");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("the CLI runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Opens a plain TCP connection to `port` and sends nothing: how long until the agent drops
/// it (a read returns end of stream or an error), up to `limit`.
fn silent_peer_dropped_within(port: u16, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => continue,
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(_) => return Some(started.elapsed()),
        }
    }
}

#[test]
fn a_dev_ca_made_by_the_cli_secures_an_agent_the_cli_then_reaches() {
    let root = tempfile::tempdir().unwrap();
    let pki = root.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();

    let (code, out) = cli(&pki, &["tls", "ca", "create"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("==> CA certificate saved to: nomad-agent-ca.pem"), "{out}");
    assert_eq!(mode(&pki.join("nomad-agent-ca-key.pem")), 0o600);
    let (code, out) = cli(&pki, &["tls", "ca", "create"], &[]);
    assert_ne!(code, 0, "an existing CA is not overwritten: {out}");
    for (flag, stem) in [
        ("-server", "global-server-nomad"),
        ("-client", "global-client-nomad"),
        ("-cli", "global-cli-nomad"),
    ] {
        let (code, out) = cli(&pki, &["tls", "cert", "create", flag], &[]);
        assert_eq!(code, 0, "{flag}: {out}");
        assert!(pki.join(format!("{stem}.pem")).exists(), "{flag}: {out}");
        assert_eq!(mode(&pki.join(format!("{stem}-key.pem"))), 0o600, "{flag}");
    }
    let (code, out) = cli(&pki, &["tls", "cert", "create"], &[]);
    assert_eq!(
        (code, out.trim()),
        (1, "Please provide either -server, -client, or -cli")
    );

    // A server with those files, HTTPS and mutual-TLS RPC, and short handshake deadlines.
    let specs = cluster_specs(root.path(), 1);
    std::fs::create_dir_all(&specs[0].data_dir).unwrap();
    let file = |name: &str| pki.join(name).display().to_string();
    let config = specs[0].data_dir.join("tls.hcl");
    std::fs::write(
        &config,
        format!(
            "tls {{\n  http = true\n  rpc = true\n  ca_file = \"{}\"\n  cert_file = \"{}\"\n  key_file = \"{}\"\n  verify_server_hostname = true\n}}\nlimits {{\n  https_handshake_timeout = \"1s\"\n  rpc_handshake_timeout = \"1s\"\n}}\n",
            file("nomad-agent-ca.pem"),
            file("global-server-nomad.pem"),
            file("global-server-nomad-key.pem"),
        ),
    )
    .unwrap();
    let mut args = server_args(&specs, 0);
    args.push(format!("-config={}", config.display()));
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let address = format!("-address=https://127.0.0.1:{}", specs[0].http);
    let ca_flag = format!("-ca-cert={}", file("nomad-agent-ca.pem"));

    let status = |extra: &[&str], env: &[(&str, String)]| {
        let mut args = vec!["server", "members", address.as_str()];
        args.extend_from_slice(extra);
        cli(root.path(), &args, env)
    };
    let answered = wait_for(Duration::from_secs(30), || {
        let (code, out) = status(&[&ca_flag], &[]);
        (code == 0).then_some(out)
    });
    assert!(
        answered.is_some(),
        "the CLI reaches the agent with -ca-cert:\n{}",
        agent.log()
    );
    let (code, out) = status(&[], &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("UnknownIssuer"), "without the CA the CLI says why: {out}");
    let (code, out) = status(&[], &[("NOMAD_CACERT", file("nomad-agent-ca.pem"))]);
    assert_eq!(code, 0, "NOMAD_CACERT: {out}");

    // A task, and a command run in it over wss:// with the same settings.
    std::fs::write(
        root.path().join("web.hcl"),
        "job \"web\" {\n  datacenters = [\"dc1\"]\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n      config {\n        command = \"/bin/sh\"\n        args = [\"-c\", \"sleep 600\"]\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let (code, out) = cli(
        root.path(),
        &["job", "run", "-detach", &address, &ca_flag, "web.hcl"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    let alloc = wait_for(Duration::from_secs(60), || {
        let (code, out) = cli(root.path(), &["job", "status", &address, &ca_flag, "web"], &[]);
        if code != 0 {
            return None;
        }
        let row = out
            .lines()
            .skip_while(|line| !line.starts_with("Allocations"))
            .find(|line| line.contains("running"))?;
        row.split_whitespace().next().map(str::to_string)
    })
    .unwrap_or_else(|| panic!("the task runs:\n{}", agent.log()));
    let (code, out) = cli(
        root.path(),
        &[
            "alloc",
            "exec",
            &address,
            &ca_flag,
            "-i=false",
            &alloc,
            "sh",
            "-c",
            "echo over-wss; exit 4",
        ],
        &[],
    );
    assert_eq!((code, out.as_str()), (4, "over-wss\n"), "alloc exec over wss://");

    // Silent peers on both TLS ports are dropped at their deadline; while they hang on, the
    // API answers others.
    let silent = std::thread::spawn({
        let (http, rpc) = (specs[0].http, specs[0].rpc);
        move || {
            let limit = Duration::from_secs(60);
            (
                silent_peer_dropped_within(http, limit),
                silent_peer_dropped_within(rpc, limit),
            )
        }
    });
    let (code, out) = status(&[&ca_flag], &[]);
    assert_eq!(code, 0, "answered while a silent peer waits: {out}");
    let (http, rpc) = silent.join().unwrap();
    assert!(http.is_some(), "a silent HTTPS peer was never dropped");
    assert!(rpc.is_some(), "a silent RPC peer was never dropped");
}
