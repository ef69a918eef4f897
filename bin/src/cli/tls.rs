//! `agent tls ca create` and `agent tls cert create -server|-client|-cli`: a development CA and
//! certificates for Nomad's roles, in Nomad's file names, so a TLS cluster takes three commands.

use std::net::IpAddr;
use std::path::Path;

use clap::Subcommand;
use drover_host::tls::issue::{self, CertRequest, Role};

use super::Failure;

#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// The certificate authority.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Certificates signed by the CA.
    #[command(subcommand)]
    Cert(CertCommand),
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a self-signed CA: <domain>-agent-ca.pem and <domain>-agent-ca-key.pem.
    Create {
        /// The cluster's domain (file names).
        #[arg(long, default_value = "nomad")]
        domain: String,
        /// Days the CA is valid for.
        #[arg(long, default_value_t = 1825)]
        days: u32,
        #[arg(long = "common-name", default_value = "Nomad Agent CA")]
        common_name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Create a certificate for a server, client or CLI: <region>-<role>-<domain>.pem and its key.
    Create {
        #[arg(long)]
        server: bool,
        #[arg(long)]
        client: bool,
        #[arg(long)]
        cli: bool,
        /// The CA certificate (default <domain>-agent-ca.pem).
        #[arg(long)]
        ca: Option<String>,
        /// The CA's key (default <domain>-agent-ca-key.pem).
        #[arg(long)]
        key: Option<String>,
        #[arg(long, default_value = "global")]
        region: String,
        #[arg(long, default_value = "nomad")]
        domain: String,
        /// Days the certificate is valid for.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Another DNS name to put in the certificate; repeatable.
        #[arg(long = "additional-dnsname")]
        additional_dnsname: Vec<String>,
        /// Another IP address to put in the certificate; repeatable.
        #[arg(long = "additional-ipaddress")]
        additional_ipaddress: Vec<IpAddr>,
    },
}

pub fn run(command: TlsCommand) -> Result<(), Failure> {
    match command {
        TlsCommand::Ca(CaCommand::Create {
            domain,
            days,
            common_name,
        }) => {
            let cert_file = format!("{domain}-agent-ca.pem");
            let key_file = format!("{domain}-agent-ca-key.pem");
            refuse_overwrite(&[&cert_file, &key_file])?;
            let ca = issue::create_ca(&common_name, days).map_err(|error| Failure(error.to_string(), 1))?;
            write(&cert_file, &ca.cert_pem, false)?;
            println!("==> CA certificate saved to: {cert_file}");
            write(&key_file, &ca.key_pem, true)?;
            println!("==> CA certificate key saved to: {key_file}");
            Ok(())
        }
        TlsCommand::Cert(CertCommand::Create {
            server,
            client,
            cli,
            ca,
            key,
            region,
            domain,
            days,
            additional_dnsname,
            additional_ipaddress,
        }) => {
            let role = match (server, client, cli) {
                (true, false, false) => Role::Server,
                (false, true, false) => Role::Client,
                (false, false, true) => Role::Cli,
                _ => return Err(Failure("Please provide either -server, -client, or -cli".into(), 1)),
            };
            let ca_file = ca.unwrap_or_else(|| format!("{domain}-agent-ca.pem"));
            let ca_key_file = key.unwrap_or_else(|| format!("{domain}-agent-ca-key.pem"));
            let read = |path: &str| {
                std::fs::read_to_string(path)
                    .map_err(|error| Failure(format!("Error reading CA file {path}: {error}"), 1))
            };
            let (ca_pem, ca_key_pem) = (read(&ca_file)?, read(&ca_key_file)?);
            let request = CertRequest {
                role,
                region: &region,
                domain: &domain,
                days,
                extra_dns: &additional_dnsname,
                extra_ips: &additional_ipaddress,
            };
            let stem = request.file_stem();
            let (cert_file, key_file) = (format!("{stem}.pem"), format!("{stem}-key.pem"));
            refuse_overwrite(&[&cert_file, &key_file])?;
            if role == Role::Server {
                println!(
                    "==> WARNING: Server Certificates grants authority to become a\n    server and access all state in the cluster including root keys\n    and all ACL tokens. Do not distribute them to production hosts\n    that are not server nodes. Store them as securely as CA keys."
                );
            }
            println!("==> Using CA file {ca_file} and CA key {ca_key_file}");
            let issued =
                issue::create_cert(&ca_pem, &ca_key_pem, &request).map_err(|error| Failure(error.to_string(), 1))?;
            write(&cert_file, &issued.cert_pem, false)?;
            println!("==> {} certificate saved to {cert_file}", role_title(role));
            write(&key_file, &issued.key_pem, true)?;
            println!("==> {} certificate key saved to {key_file}", role_title(role));
            Ok(())
        }
    }
}

fn role_title(role: Role) -> &'static str {
    match role {
        Role::Server => "Server",
        Role::Client => "Client",
        Role::Cli => "Cli",
    }
}

fn refuse_overwrite(files: &[&str]) -> Result<(), Failure> {
    for file in files {
        if Path::new(file).exists() {
            return Err(Failure(format!("File '{file}' already exists"), 1));
        }
    }
    Ok(())
}

/// Writes `text` to `path`; keys readable by their owner only.
fn write(path: &str, text: &str, secret: bool) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    if secret {
        options.mode(0o600);
    }
    options
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|error| Failure(format!("Could not write {path}: {error}"), 1))
}
