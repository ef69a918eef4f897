//! `agent acl auth-method ...`, `agent acl binding-rule ...` and `agent acl login`: Nomad's
//! single sign-on commands. `acl login` with an OIDC method serves the provider's redirect on
//! `-oidc-callback-addr` (Nomad's `localhost:4649`), as Nomad's CLI does.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::{Value, json};

use drover_http::api;

use super::{Api, Failure, table, text, typed};

#[derive(Debug, Subcommand)]
pub enum AuthMethodCommand {
    Create(MethodFlags),
    Update {
        #[command(flatten)]
        flags: MethodFlags,
        method: String,
    },
    Info {
        name: String,
    },
    List,
    Delete {
        name: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct MethodFlags {
    #[arg(long)]
    name: Option<String>,
    /// OIDC or JWT.
    #[arg(long = "type", value_name = "TYPE")]
    method_type: Option<String>,
    /// local or global.
    #[arg(long)]
    token_locality: Option<String>,
    #[arg(long)]
    token_name_format: Option<String>,
    #[arg(long, value_name = "DURATION")]
    max_token_ttl: Option<String>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    default: Option<bool>,
    /// The method's configuration as JSON, or `@file` holding it.
    #[arg(long)]
    config: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum BindingRuleCommand {
    Create(RuleFlags),
    Update {
        #[command(flatten)]
        flags: RuleFlags,
        id: String,
    },
    Info {
        id: String,
    },
    List,
    Delete {
        id: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct RuleFlags {
    #[arg(long)]
    description: Option<String>,
    #[arg(long)]
    auth_method: Option<String>,
    #[arg(long)]
    selector: Option<String>,
    /// role, policy or management.
    #[arg(long)]
    bind_type: Option<String>,
    #[arg(long)]
    bind_name: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct LoginFlags {
    /// The auth method (default: the cluster's default method).
    #[arg(long)]
    method: Option<String>,
    /// OIDC or JWT (default: the method's).
    #[arg(long = "type", value_name = "TYPE")]
    method_type: Option<String>,
    /// The JWT to log in with (JWT methods).
    #[arg(long)]
    login_token: Option<String>,
    /// Where the OIDC provider's redirect is received.
    #[arg(long, default_value = "localhost:4649")]
    oidc_callback_addr: String,
}

/// `-config`'s JSON, read from a file when it starts with `@`.
fn config_json(flag: &str) -> Result<Value, Failure> {
    let text = match flag.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|error| Failure(format!("Error reading config file {path:?}: {error}"), 1))?,
        None => flag.to_string(),
    };
    serde_json::from_str(&text).map_err(|error| Failure(format!("Error parsing the auth method config: {error}"), 1))
}

fn method_body(flags: MethodFlags, held: Value) -> Result<Value, Failure> {
    let mut body = if held.is_object() { held } else { json!({}) };
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            body[key] = value;
        }
    };
    set("Name", flags.name.map(Value::from));
    set("Type", flags.method_type.map(Value::from));
    set("TokenLocality", flags.token_locality.map(Value::from));
    set("TokenNameFormat", flags.token_name_format.map(Value::from));
    set("MaxTokenTTL", flags.max_token_ttl.map(Value::from));
    set("Default", flags.default.map(Value::from));
    set("Config", flags.config.as_deref().map(config_json).transpose()?);
    Ok(body)
}

pub(super) fn run_method(api: &Api, command: AuthMethodCommand) -> Result<(), Failure> {
    match command {
        AuthMethodCommand::Create(flags) => {
            let body = method_body(flags, Value::Null)?;
            let path = "/v1/acl/auth-method";
            print_method(&typed(path, &api.call("POST", path, Some(&body))?)?);
        }
        AuthMethodCommand::Update { flags, method } => {
            let held = api.get(&format!("/v1/acl/auth-method/{method}"))?;
            let body = method_body(flags, held)?;
            let path = format!("/v1/acl/auth-method/{method}");
            print_method(&typed(&path, &api.call("POST", &path, Some(&body))?)?);
        }
        AuthMethodCommand::Info { name } => print_method(&api.get_as(&format!("/v1/acl/auth-method/{name}"))?),
        AuthMethodCommand::List => {
            let methods: Vec<api::AuthMethodListStub> = api.get_as("/v1/acl/auth-methods")?;
            if methods.is_empty() {
                println!("No ACL auth methods found");
                return Ok(());
            }
            let mut rows = vec![["Name", "Type", "Default"].map(String::from).to_vec()];
            rows.extend(
                methods
                    .into_iter()
                    .map(|method| vec![method.name, method.method_type, method.default.to_string()]),
            );
            println!("{}", table(&rows));
        }
        AuthMethodCommand::Delete { name } => {
            api.call("DELETE", &format!("/v1/acl/auth-method/{name}"), None)?;
            println!("ACL auth method {name} successfully deleted");
        }
    }
    Ok(())
}

/// Text, or `<none>` when empty.
fn or_none(text: &str) -> String {
    if text.is_empty() { "<none>".into() } else { text.into() }
}

/// A list joined by commas, or `<none>` when empty.
fn list_or_none(items: &[String]) -> String {
    or_none(&items.join(","))
}

/// A map as `{key: value}` pairs joined by `; `, or `<none>` when empty.
fn map_or_none(map: &std::collections::BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = map.iter().map(|(key, value)| format!("{{{key}: {value}}}")).collect();
    or_none(&pairs.join("; "))
}

fn print_block(rows: &[(&str, String)]) {
    let width = rows.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    for (key, value) in rows {
        println!("{key:<width$} = {value}");
    }
}

/// Nomad's auth method block (`formatAuthMethod` and its config).
fn print_method(method: &api::AuthMethod) {
    print_block(&[
        ("Name", method.name.clone()),
        ("Type", method.method_type.clone()),
        ("Locality", method.token_locality.clone()),
        ("Max Token TTL", method.max_token_ttl.clone()),
        ("Token Name Format", method.token_name_format.clone()),
        ("Default", method.default.to_string()),
        ("Create Index", method.create_index.to_string()),
        ("Modify Index", method.modify_index.to_string()),
    ]);
    let config = &method.config;
    println!("\nAuth Method Config\n");
    let secret = if config.oidc_client_secret.is_empty() {
        "<none>"
    } else {
        "<redacted>"
    };
    print_block(&[
        (
            "JWT Validation Public Keys",
            list_or_none(&config.jwt_validation_pub_keys),
        ),
        ("JWKS URL", or_none(&config.jwks_url)),
        ("OIDC Discovery URL", or_none(&config.oidc_discovery_url)),
        ("OIDC Client ID", or_none(&config.oidc_client_id)),
        ("OIDC Client Secret", secret.into()),
        ("OIDC Enable PKCE", config.oidc_enable_pkce.to_string()),
        ("OIDC Disable UserInfo", config.oidc_disable_userinfo.to_string()),
        ("OIDC Scopes", list_or_none(&config.oidc_scopes)),
        ("Bound audiences", list_or_none(&config.bound_audiences)),
        ("Bound issuer", list_or_none(&config.bound_issuer)),
        ("Allowed redirects URIs", list_or_none(&config.allowed_redirect_uris)),
        ("Signing algorithms", list_or_none(&config.signing_algs)),
        ("Expiration Leeway", or_none(&config.expiration_leeway)),
        ("NotBefore Leeway", or_none(&config.not_before_leeway)),
        ("ClockSkew Leeway", or_none(&config.clock_skew_leeway)),
        ("Claim mappings", map_or_none(&config.claim_mappings)),
        ("List claim mappings", map_or_none(&config.list_claim_mappings)),
    ]);
}

fn rule_body(flags: RuleFlags, id: Option<&str>) -> Value {
    let mut body = json!({});
    if let Some(id) = id {
        body["ID"] = json!(id);
    }
    for (key, value) in [
        ("Description", flags.description),
        ("AuthMethod", flags.auth_method),
        ("Selector", flags.selector),
        ("BindType", flags.bind_type),
        ("BindName", flags.bind_name),
    ] {
        if let Some(value) = value {
            body[key] = json!(value);
        }
    }
    body
}

pub(super) fn run_rule(api: &Api, command: BindingRuleCommand) -> Result<(), Failure> {
    match command {
        BindingRuleCommand::Create(flags) => {
            let path = "/v1/acl/binding-rule";
            print_rule(&typed(path, &api.call("POST", path, Some(&rule_body(flags, None)))?)?);
        }
        BindingRuleCommand::Update { flags, id } => {
            let body = rule_body(flags, Some(&id));
            let path = format!("/v1/acl/binding-rule/{id}");
            print_rule(&typed(&path, &api.call("POST", &path, Some(&body))?)?);
        }
        BindingRuleCommand::Info { id } => print_rule(&api.get_as(&format!("/v1/acl/binding-rule/{id}"))?),
        BindingRuleCommand::List => {
            let rules: Vec<api::BindingRule> = api.get_as("/v1/acl/binding-rules")?;
            if rules.is_empty() {
                println!("No ACL binding rules found");
                return Ok(());
            }
            let mut rows = vec![["ID", "Description", "Auth Method"].map(String::from).to_vec()];
            rows.extend(
                rules
                    .into_iter()
                    .map(|rule| vec![rule.id, or_none(&rule.description), rule.auth_method]),
            );
            println!("{}", table(&rows));
        }
        BindingRuleCommand::Delete { id } => {
            api.call("DELETE", &format!("/v1/acl/binding-rule/{id}"), None)?;
            println!("ACL binding rule {id} successfully deleted");
        }
    }
    Ok(())
}

/// Nomad's binding rule block.
fn print_rule(rule: &api::BindingRule) {
    print_block(&[
        ("ID", rule.id.clone()),
        ("Description", or_none(&rule.description)),
        ("Auth Method", rule.auth_method.clone()),
        ("Selector", format!("{:?}", rule.selector)),
        ("Bind Type", rule.bind_type.clone()),
        ("Bind Name", or_none(&rule.bind_name)),
        ("Create Time", rule.create_time.clone()),
        ("Modify Time", rule.modify_time.clone()),
        ("Create Index", rule.create_index.to_string()),
        ("Modify Index", rule.modify_index.to_string()),
    ]);
}

/// How long `acl login` waits for the provider's redirect.
const CALLBACK_WAIT: Duration = Duration::from_secs(300);

pub(super) fn login(api: &Api, flags: LoginFlags) -> Result<(), Failure> {
    let methods: Vec<api::AuthMethodListStub> = api.get_as("/v1/acl/auth-methods")?;
    let method = match &flags.method {
        Some(name) => methods.iter().find(|method| method.name == *name),
        None => methods.iter().find(|method| method.default),
    }
    .ok_or_else(|| match &flags.method {
        Some(name) => Failure(format!("Error: auth-method {name:?} not found"), 1),
        None => Failure("Error: no default auth method found; name one with -method".into(), 1),
    })?;
    let name = method.name.clone();
    let method_type = flags.method_type.clone().unwrap_or_else(|| method.method_type.clone());
    let token = match method_type.to_uppercase().as_str() {
        "JWT" => {
            let login_token = flags
                .login_token
                .ok_or_else(|| Failure("Error: a JWT login needs -login-token".into(), 1))?;
            api.call(
                "POST",
                "/v1/acl/login",
                Some(&json!({"AuthMethodName": name, "LoginToken": login_token})),
            )?
        }
        "OIDC" => oidc_login(api, &name, &flags.oidc_callback_addr)?,
        other => return Err(Failure(format!("Error: unsupported auth method type {other:?}"), 1)),
    };
    println!("Successfully logged in via {} and {name}\n", method_type.to_uppercase());
    super::acl::print_token(&super::typed("/v1/acl/login", &token)?)
}

/// The OIDC flow: the provider's URL printed (and opened when a browser can be), its
/// redirect received on `callback_addr`, the code handed to the cluster.
fn oidc_login(api: &Api, method: &str, callback_addr: &str) -> Result<Value, Failure> {
    let listener = TcpListener::bind(callback_addr).map_err(|error| {
        Failure(
            format!("Error starting the OIDC callback server on {callback_addr}: {error}"),
            1,
        )
    })?;
    let redirect_uri = format!("http://{callback_addr}/oidc/callback");
    let nonce = drover_io_real::runtime::random_uuid();
    let url = api.call(
        "POST",
        "/v1/acl/oidc/auth-url",
        Some(&json!({"AuthMethodName": method, "RedirectURI": redirect_uri, "ClientNonce": nonce})),
    )?;
    let url = text(&url["AuthURL"]);
    println!("Complete the login via your OIDC provider. Launching browser to:\n\n    {url}\n");
    let _ = std::io::stdout().flush();
    let _ = std::process::Command::new("xdg-open")
        .arg(&url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let (code, state) = await_callback(&listener)?;
    api.call(
        "POST",
        "/v1/acl/oidc/complete-auth",
        Some(
            &json!({"AuthMethodName": method, "ClientNonce": nonce, "State": state, "Code": code,
            "RedirectURI": redirect_uri}),
        ),
    )
}

/// The request line of a browser's request, its whole head read (at most 64 KiB): a socket
/// closed with the browser's headers unread is reset, and the reset can destroy the answer
/// before the browser reads it.
fn read_head(stream: &std::net::TcpStream) -> std::io::Result<String> {
    let mut reader = BufReader::new(std::io::Read::take(stream, 64 << 10));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut header = String::new();
    while reader.read_line(&mut header)? > 0 && header != "\r\n" && header != "\n" {
        header.clear();
    }
    Ok(request_line)
}

/// Ends a connection the way a browser can read the answer to its end: write half shut,
/// what it still sends read and dropped for a moment.
fn close_gently(stream: &std::net::TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut reader = stream;
    while matches!(std::io::Read::read(&mut reader, &mut sink), Ok(read) if read > 0) {}
}

/// The `code` and `state` of the first `/oidc/callback` request (an `error` is reported).
fn await_callback(listener: &TcpListener) -> Result<(String, String), Failure> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + CALLBACK_WAIT;
    loop {
        let (stream, _) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(Failure("Error: no OIDC callback within 5 minutes".into(), 1));
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let line = read_head(&stream)?;
        let target = line.split_whitespace().nth(1).unwrap_or_default();
        let Some(query) = target.strip_prefix("/oidc/callback?") else {
            let _ = (&stream).write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            close_gently(&stream);
            continue;
        };
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        };
        let page = "<html><body>Signed in via your OIDC provider. You can close this window.</body></html>";
        let _ = write!(
            &stream,
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
            page.len()
        );
        close_gently(&stream);
        if let Some(error) = get("error") {
            let description = get("error_description").unwrap_or_default();
            return Err(Failure(
                format!("Error: the OIDC provider refused the login: {error} {description}"),
                1,
            ));
        }
        return match (get("code"), get("state")) {
            (Some(code), Some(state)) => Ok((code, state)),
            _ => Err(Failure("Error: the OIDC callback carried no code and state".into(), 1)),
        };
    }
}
