//! Production Consul client: catalog lookups and service registration over Consul's HTTP API,
//! each call bounded by a deadline. Mirrored by `drover-io-sim`'s `consul.rs`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use drover_core::connect::ConsulTransport;
use drover_core::rpc::{ConsulAclCall, ConsulAclError, ConsulAclReply};

use drover_io_real::io::{Consul, ServiceRegistration};

#[derive(Clone)]
pub struct ConsulHttp {
    base: String,
    timeout: Duration,
    /// Sent as `X-Consul-Token` (`consul { token }`).
    token: Option<String>,
    /// `Authorization: Basic ...` (`consul { auth }`).
    basic_auth: Option<String>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// An error and every cause under it: hyper's "client error (Connect)" alone does not say
/// that the certificate was refused, its cause does.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = inner.source();
    }
    text
}

/// A connector for `http://` and `https://` alike, trusting and presenting what `tls` says.
fn connector(tls: &crate::tls::ClientTls<'_>) -> Result<HttpsConnector<HttpConnector>, crate::tls::TlsError> {
    let config = crate::tls::client_config(tls)?;
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .build())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CatalogService {
    address: String,
    #[serde(default)]
    service_address: String,
    service_port: u16,
}

impl ConsulHttp {
    /// `address` is Consul's `host:port` (Nomad's `consul { address }`).
    /// Plain HTTP unless the address names `https://`, which then trusts the host's roots.
    pub fn new(address: &str, timeout: Duration) -> Self {
        Self::with_transport(address, timeout, &ConsulTransport::default())
            .expect("the default transport reads no file")
    }

    /// `address` over the transport of `consul { ssl verify_ssl ca_file cert_file key_file
    /// auth }`: HTTPS when `ssl` is set (or the address says `https://`), trusting `ca_file`
    /// (else the host's roots; nobody is checked with `verify_ssl = false`) and presenting
    /// `cert_file`/`key_file` when set. Fails naming the file that cannot be used.
    pub fn with_transport(
        address: &str,
        timeout: Duration,
        transport: &ConsulTransport,
    ) -> Result<Self, crate::tls::TlsError> {
        let host = address
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let ssl = transport.ssl || address.starts_with("https://");
        let base = format!("{}://{host}", if ssl { "https" } else { "http" });
        let tls = crate::tls::ClientTls {
            ca_file: &transport.ca_file,
            cert_file: &transport.cert_file,
            key_file: &transport.key_file,
            verify: transport.verify_ssl,
        };
        // Plain HTTP needs no roots: nothing is read until TLS is asked for.
        let connector = if ssl {
            connector(&tls)?
        } else {
            connector(&crate::tls::ClientTls {
                verify: false,
                ..Default::default()
            })?
        };
        let basic_auth = transport.auth.as_ref().map(|auth| {
            use base64::Engine;
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(auth))
        });
        Ok(ConsulHttp {
            base,
            timeout,
            token: None,
            basic_auth,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Presents `token` on every call (`None`: anonymous).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// One call: the status and body, or why there was no answer (transport, deadline).
    async fn exchange(
        &self,
        method: hyper::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(hyper::StatusCode, Vec<u8>), String> {
        let uri = format!("{}{}", self.base, path);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(&uri)
            .header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("x-consul-token", token);
        }
        if let Some(auth) = &self.basic_auth {
            request = request.header(hyper::header::AUTHORIZATION, auth);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| format!("bad Consul request {uri}: {error}"))?;
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| format!("{uri}: {}", error_chain(&error)))?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|error| format!("{uri}: {}", error_chain(&error)))?
                .to_bytes();
            Ok((status, bytes.to_vec()))
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| format!("{uri}: timed out after {:?}", self.timeout))?
    }

    async fn request(&self, method: hyper::Method, path: &str, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let (status, bytes) = self.exchange(method, path, body).await?;
        if !status.is_success() {
            return Err(format!(
                "{}{path}: HTTP {status}: {}",
                self.base,
                String::from_utf8_lossy(&bytes)
            ));
        }
        Ok(bytes)
    }

    /// Consul's ACL token API: create a local token with one service identity, or delete one.
    /// Transport failures, deadlines and 5xx are retryable; a token Consul does not know is
    /// `not_found` (its revocation already happened).
    async fn acl(&self, call: ConsulAclCall) -> Result<ConsulAclReply, ConsulAclError> {
        let (method, path, body) = match &call {
            ConsulAclCall::CreateToken {
                description,
                service_name,
            } => {
                let body = serde_json::json!({
                    "Description": description,
                    "ServiceIdentities": [{"ServiceName": service_name}],
                    "Local": true,
                });
                (
                    hyper::Method::PUT,
                    "/v1/acl/token".to_string(),
                    body.to_string().into_bytes(),
                )
            }
            ConsulAclCall::RevokeToken { accessor_id } => (
                hyper::Method::DELETE,
                format!("/v1/acl/token/{accessor_id}"),
                Vec::new(),
            ),
            ConsulAclCall::ListTokens => (hyper::Method::GET, "/v1/acl/tokens".to_string(), Vec::new()),
        };
        let (status, bytes) = self
            .exchange(method, &path, body)
            .await
            .map_err(|message| ConsulAclError {
                message,
                retryable: true,
                not_found: false,
            })?;
        let text = String::from_utf8_lossy(&bytes);
        if !status.is_success() {
            // text-match: Consul answers a token that does not exist with 403 and this text
            // (as Nomad reads it); no status tells it from a token without the permission.
            let not_found = status == hyper::StatusCode::NOT_FOUND
                || text.contains("ACL not found")
                || text.contains("Cannot find token");
            return Err(ConsulAclError {
                message: format!("{path}: HTTP {status}: {}", text.trim()),
                retryable: status.is_server_error(),
                not_found,
            });
        }
        match call {
            ConsulAclCall::CreateToken { .. } => {
                #[derive(Deserialize)]
                struct Created {
                    #[serde(rename = "AccessorID")]
                    accessor_id: String,
                    #[serde(rename = "SecretID")]
                    secret_id: String,
                }
                let created: Created = serde_json::from_slice(&bytes).map_err(|error| ConsulAclError {
                    message: format!("{path}: unreadable answer: {error}"),
                    retryable: true,
                    not_found: false,
                })?;
                Ok(ConsulAclReply::Created {
                    accessor_id: created.accessor_id,
                    secret_id: created.secret_id,
                })
            }
            ConsulAclCall::RevokeToken { .. } => Ok(ConsulAclReply::Revoked),
            ConsulAclCall::ListTokens => {
                #[derive(Deserialize)]
                struct Listed {
                    #[serde(rename = "AccessorID")]
                    accessor_id: String,
                    #[serde(rename = "Description", default)]
                    description: String,
                }
                let listed: Vec<Listed> = serde_json::from_slice(&bytes).map_err(|error| ConsulAclError {
                    message: format!("{path}: unreadable answer: {error}"),
                    retryable: true,
                    not_found: false,
                })?;
                Ok(ConsulAclReply::Tokens(
                    listed
                        .into_iter()
                        .map(|token| drover_core::rpc::ConsulToken {
                            accessor_id: token.accessor_id,
                            description: token.description,
                        })
                        .collect(),
                ))
            }
        }
    }

    /// The services the local agent holds, by id (`GET /v1/agent/services`).
    pub async fn agent_services(
        &self,
    ) -> Result<std::collections::BTreeMap<String, drover_core::client::services::RegisteredService>, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct AgentService {
            service: String,
            #[serde(default)]
            tags: Option<Vec<String>>,
            #[serde(default)]
            meta: Option<std::collections::BTreeMap<String, String>>,
            #[serde(default)]
            port: u16,
        }
        let bytes = self
            .request(hyper::Method::GET, "/v1/agent/services", Vec::new())
            .await?;
        let services: std::collections::BTreeMap<String, AgentService> =
            serde_json::from_slice(&bytes).map_err(|error| format!("/v1/agent/services: {error}"))?;
        Ok(services
            .into_iter()
            .map(|(id, service)| {
                (
                    id,
                    drover_core::client::services::RegisteredService {
                        name: service.service,
                        tags: service.tags.unwrap_or_default(),
                        meta: service.meta.unwrap_or_default(),
                        port: service.port,
                    },
                )
            })
            .collect())
    }

    /// The status of every check the local agent runs, by check id (`GET /v1/agent/checks`).
    pub async fn agent_checks(&self) -> Result<std::collections::BTreeMap<String, String>, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct AgentCheck {
            status: String,
        }
        let bytes = self.request(hyper::Method::GET, "/v1/agent/checks", Vec::new()).await?;
        let checks: std::collections::BTreeMap<String, AgentCheck> =
            serde_json::from_slice(&bytes).map_err(|error| format!("/v1/agent/checks: {error}"))?;
        Ok(checks.into_iter().map(|(id, check)| (id, check.status)).collect())
    }

    /// Registers a task's or group's service with the local agent, at its port's address, or
    /// at `address` when it has none; its checks and Connect sidecar with it.
    pub async fn register_task_service(
        &self,
        registration: &drover_core::client::services::TaskServiceRegistration,
        address: IpAddr,
    ) -> Result<(), String> {
        let body = service_registration_body(registration, address);
        self.request(
            hyper::Method::PUT,
            "/v1/agent/service/register",
            serde_json::to_vec(&body).expect("json serializes"),
        )
        .await
        .map(|_| ())
    }

    /// The agent's attributes as Nomad's consul fingerprinter names them, from
    /// `GET /v1/agent/self`.
    pub async fn fingerprint(&self) -> Result<std::collections::BTreeMap<String, String>, String> {
        let bytes = self.request(hyper::Method::GET, "/v1/agent/self", Vec::new()).await?;
        let agent: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|error| format!("/v1/agent/self: {error}"))?;
        Ok(consul_attributes(&agent))
    }

    /// The agent's `xDS.SupportedProxies` (`{"envoy": ["1.18.3", ...]}`), newest first.
    pub async fn supported_proxies(&self) -> Result<std::collections::BTreeMap<String, Vec<String>>, String> {
        let bytes = self.request(hyper::Method::GET, "/v1/agent/self", Vec::new()).await?;
        let agent: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|error| format!("/v1/agent/self: {error}"))?;
        Ok(supported_proxies(&agent))
    }

    /// Removes a service from the local agent.
    pub async fn deregister_service(&self, id: &str) -> Result<(), String> {
        self.request(
            hyper::Method::PUT,
            &format!("/v1/agent/service/deregister/{id}"),
            Vec::new(),
        )
        .await
        .map(|_| ())
    }

    async fn service_in(&self, service: &str, tag: &str, datacenter: Option<&str>) -> Result<Vec<SocketAddr>, String> {
        let mut path = format!("/v1/catalog/service/{service}?tag={tag}");
        if let Some(datacenter) = datacenter {
            path.push_str("&dc=");
            path.push_str(datacenter);
        }
        let body = self.request(hyper::Method::GET, &path, Vec::new()).await?;
        let services: Vec<CatalogService> =
            serde_json::from_slice(&body).map_err(|error| format!("malformed catalog answer: {error}"))?;
        Ok(services
            .into_iter()
            .filter_map(|service| {
                let host = if service.service_address.is_empty() {
                    service.address
                } else {
                    service.service_address
                };
                host.parse::<IpAddr>()
                    .ok()
                    .map(|ip| SocketAddr::new(ip, service.service_port))
            })
            .collect())
    }
}

impl Consul for ConsulHttp {
    async fn acl_call(&self, call: ConsulAclCall) -> Result<ConsulAclReply, ConsulAclError> {
        self.acl(call).await
    }

    /// The local datacenter first, then every other datacenter Consul knows.
    async fn catalog_service(&self, service: &str, tag: &str) -> Result<Vec<SocketAddr>, String> {
        let mut addrs = self.service_in(service, tag, None).await?;
        if let Ok(body) = self
            .request(hyper::Method::GET, "/v1/catalog/datacenters", Vec::new())
            .await
        {
            let datacenters: Vec<String> = serde_json::from_slice(&body).unwrap_or_default();
            for datacenter in datacenters.iter().skip(1) {
                if let Ok(more) = self.service_in(service, tag, Some(datacenter)).await {
                    addrs.extend(more);
                }
            }
        }
        addrs.sort();
        addrs.dedup();
        Ok(addrs)
    }

    async fn register_service(&self, registration: ServiceRegistration) -> Result<(), String> {
        let body = serde_json::json!({
            "ID": registration.id,
            "Name": registration.name,
            "Tags": registration.tags,
            "Address": registration.addr.ip().to_string(),
            "Port": registration.addr.port(),
        });
        self.request(
            hyper::Method::PUT,
            "/v1/agent/service/register",
            serde_json::to_vec(&body).expect("json serializes"),
        )
        .await
        .map(|_| ())
    }
}

/// `consul.server`, `consul.version`, `consul.revision`, `unique.consul.name`,
/// `consul.datacenter`, `consul.segment`, `consul.connect` and `consul.grpc` from the agent's
/// self description (Nomad's consul fingerprinter); absent fields are left out.
pub fn consul_attributes(agent: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    let text = |value: &serde_json::Value| match value {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Bool(flag) => Some(flag.to_string()),
        serde_json::Value::Number(number) => Some(number.to_string()),
        _ => None,
    };
    let fields = [
        ("consul.server", "/Config/Server"),
        ("consul.version", "/Config/Version"),
        ("consul.revision", "/Config/Revision"),
        ("unique.consul.name", "/Config/NodeName"),
        ("consul.datacenter", "/Config/Datacenter"),
        ("consul.segment", "/Member/Tags/segment"),
        ("consul.connect", "/DebugConfig/ConnectEnabled"),
        ("consul.grpc", "/DebugConfig/GRPCPort"),
    ];
    fields
        .into_iter()
        .filter_map(|(name, pointer)| Some((name.to_string(), agent.pointer(pointer).and_then(text)?)))
        .collect()
}

/// `xDS.SupportedProxies` of the agent's self description; empty when it has none.
pub fn supported_proxies(agent: &serde_json::Value) -> std::collections::BTreeMap<String, Vec<String>> {
    let Some(proxies) = agent
        .pointer("/xDS/SupportedProxies")
        .and_then(serde_json::Value::as_object)
    else {
        return std::collections::BTreeMap::new();
    };
    proxies
        .iter()
        .map(|(proxy, versions)| {
            let versions = versions
                .as_array()
                .map(|versions| {
                    versions
                        .iter()
                        .filter_map(|version| version.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            (proxy.clone(), versions)
        })
        .collect()
}

/// Consul's service registration body (`PUT /v1/agent/service/register`).
fn service_registration_body(
    registration: &drover_core::client::services::TaskServiceRegistration,
    address: IpAddr,
) -> serde_json::Value {
    let host = |at: &str| {
        if at.is_empty() {
            address.to_string()
        } else {
            at.to_string()
        }
    };
    let checks: Vec<serde_json::Value> = registration
        .checks
        .iter()
        .map(|check| check_body(check, &host(&check.address)))
        .collect();
    let mut body = serde_json::json!({
        "ID": registration.id,
        "Name": registration.name,
        "Tags": registration.tags,
        "Meta": registration.meta,
        "EnableTagOverride": registration.enable_tag_override,
        "Address": host(&registration.address),
        "Port": registration.port,
        "Checks": checks,
    });
    if let Some(connect) = &registration.connect {
        body["Connect"] = connect_body(connect);
    }
    body
}

/// One check of a registration: Consul runs it against `host` and the check's port.
fn check_body(check: &drover_core::client::services::CheckRegistration, host: &str) -> serde_json::Value {
    let target = format!("{host}:{}", check.port);
    let mut body = serde_json::json!({
        "CheckID": check.id,
        "Name": check.name,
        "Interval": format!("{}ms", check.interval_ms),
        "Timeout": format!("{}ms", check.timeout_ms),
    });
    match check.check_type.as_str() {
        "http" => {
            let scheme = if check.protocol.is_empty() {
                "http"
            } else {
                &check.protocol
            };
            body["HTTP"] = format!("{scheme}://{target}{}", check.path).into();
            if !check.method.is_empty() {
                body["Method"] = check.method.clone().into();
            }
            if !check.header.is_empty() {
                body["Header"] = serde_json::json!(check.header);
            }
        }
        "grpc" => {
            body["GRPC"] = if check.grpc_service.is_empty() {
                target.into()
            } else {
                format!("{target}/{}", check.grpc_service).into()
            };
            if check.grpc_use_tls {
                body["GRPCUseTLS"] = true.into();
            }
        }
        _ => body["TCP"] = target.into(),
    }
    if check.tls_skip_verify {
        body["TLSSkipVerify"] = true.into();
    }
    if !check.initial_status.is_empty() {
        body["Status"] = check.initial_status.clone().into();
    }
    body
}

/// Consul's `Connect` block: native, or the sidecar service Consul derives from the parent.
fn connect_body(connect: &drover_core::client::services::ConnectRegistration) -> serde_json::Value {
    let Some(sidecar) = &connect.sidecar else {
        return serde_json::json!({ "Native": connect.native });
    };
    let upstreams: Vec<serde_json::Value> = sidecar
        .upstreams
        .iter()
        .map(|upstream| {
            let mut body = serde_json::json!({
                "DestinationName": upstream.destination_name,
                "LocalBindPort": upstream.local_bind_port,
            });
            if !upstream.datacenter.is_empty() {
                body["Datacenter"] = upstream.datacenter.clone().into();
            }
            body
        })
        .collect();
    let config: serde_json::Map<String, serde_json::Value> = sidecar
        .config
        .iter()
        .map(|(key, value)| (key.clone(), config_json(value)))
        .collect();
    serde_json::json!({
        "SidecarService": {
            "Port": sidecar.port,
            "Tags": sidecar.tags,
            "Proxy": {
                "LocalServiceAddress": sidecar.local_service_address,
                "LocalServicePort": sidecar.local_service_port,
                "Upstreams": upstreams,
                "Config": config,
            },
        },
    })
}

fn config_json(value: &drover_core::structs::ConfigValue) -> serde_json::Value {
    use drover_core::structs::ConfigValue;
    match value {
        ConfigValue::Bool(flag) => (*flag).into(),
        ConfigValue::Int(number) => (*number).into(),
        ConfigValue::String(text) => text.clone().into(),
        ConfigValue::List(items) => items.iter().map(config_json).collect::<Vec<_>>().into(),
        ConfigValue::Map(map) => map
            .iter()
            .map(|(key, value)| (key.clone(), config_json(value)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    }
}
