//! `agent acl auth-method ...`, `agent acl binding-rule ...` and `agent acl login`: Nomad's
//! single sign-on commands. `acl login` with an OIDC method serves the provider's redirect on
//! `-oidc-callback-addr` (Nomad's `localhost:4649`), as Nomad's CLI does.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::{Value, json};

use super::{Api, Failure, table, text};

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
            print_method(&api.call("POST", "/v1/acl/auth-method", Some(&body))?);
        }
        AuthMethodCommand::Update { flags, method } => {
            let held = api.get(&format!("/v1/acl/auth-method/{method}"))?;
            let body = method_body(flags, held)?;
            print_method(&api.call("POST", &format!("/v1/acl/auth-method/{method}"), Some(&body))?);
        }
        AuthMethodCommand::Info { name } => print_method(&api.get(&format!("/v1/acl/auth-method/{name}"))?),
        AuthMethodCommand::List => {
            let methods = api.get("/v1/acl/auth-methods")?;
            let methods = methods.as_array().cloned().unwrap_or_default();
            if methods.is_empty() {
                println!("No ACL auth methods found");
                return Ok(());
            }
            let mut rows = vec![["Name", "Type", "Default"].map(String::from).to_vec()];
            rows.extend(
                methods
                    .iter()
                    .map(|method| vec![text(&method["Name"]), text(&method["Type"]), text(&method["Default"])]),
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

fn or_none(value: &Value) -> String {
    match value {
        Value::Null => "<none>".into(),
        Value::String(text) if text.is_empty() => "<none>".into(),
        Value::Array(items) if items.is_empty() => "<none>".into(),
        Value::Object(map) if map.is_empty() => "<none>".into(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| format!("{{{key}: {}}}", text(value)))
            .collect::<Vec<_>>()
            .join("; "),
        other => text(other),
    }
}

fn print_block(rows: &[(&str, String)]) {
    let width = rows.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    for (key, value) in rows {
        println!("{key:<width$} = {value}");
    }
}

/// Nomad's auth method block (`formatAuthMethod` and its config).
fn print_method(method: &Value) {
    print_block(&[
        ("Name", text(&method["Name"])),
        ("Type", text(&method["Type"])),
        ("Locality", text(&method["TokenLocality"])),
        ("Max Token TTL", text(&method["MaxTokenTTL"])),
        ("Token Name Format", text(&method["TokenNameFormat"])),
        ("Default", text(&method["Default"])),
        ("Create Index", text(&method["CreateIndex"])),
        ("Modify Index", text(&method["ModifyIndex"])),
    ]);
    let config = &method["Config"];
    println!("\nAuth Method Config\n");
    let secret = match config["OIDCClientSecret"].as_str() {
        Some("") | None => "<none>".to_string(),
        Some(_) => "<redacted>".to_string(),
    };
    print_block(&[
        ("JWT Validation Public Keys", or_none(&config["JWTValidationPubKeys"])),
        ("JWKS URL", or_none(&config["JWKSURL"])),
        ("OIDC Discovery URL", or_none(&config["OIDCDiscoveryURL"])),
        ("OIDC Client ID", or_none(&config["OIDCClientID"])),
        ("OIDC Client Secret", secret),
        ("OIDC Enable PKCE", text(&config["OIDCEnablePKCE"])),
        ("OIDC Disable UserInfo", text(&config["OIDCDisableUserInfo"])),
        ("OIDC Scopes", or_none(&config["OIDCScopes"])),
        ("Bound audiences", or_none(&config["BoundAudiences"])),
        ("Bound issuer", or_none(&config["BoundIssuer"])),
        ("Allowed redirects URIs", or_none(&config["AllowedRedirectURIs"])),
        ("Signing algorithms", or_none(&config["SigningAlgs"])),
        ("Expiration Leeway", or_none(&config["ExpirationLeeway"])),
        ("NotBefore Leeway", or_none(&config["NotBeforeLeeway"])),
        ("ClockSkew Leeway", or_none(&config["ClockSkewLeeway"])),
        ("Claim mappings", or_none(&config["ClaimMappings"])),
        ("List claim mappings", or_none(&config["ListClaimMappings"])),
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
            print_rule(&api.call("POST", "/v1/acl/binding-rule", Some(&rule_body(flags, None)))?);
        }
        BindingRuleCommand::Update { flags, id } => {
            let body = rule_body(flags, Some(&id));
            print_rule(&api.call("POST", &format!("/v1/acl/binding-rule/{id}"), Some(&body))?);
        }
        BindingRuleCommand::Info { id } => print_rule(&api.get(&format!("/v1/acl/binding-rule/{id}"))?),
        BindingRuleCommand::List => {
            let rules = api.get("/v1/acl/binding-rules")?;
            let rules = rules.as_array().cloned().unwrap_or_default();
            if rules.is_empty() {
                println!("No ACL binding rules found");
                return Ok(());
            }
            let mut rows = vec![["ID", "Description", "Auth Method"].map(String::from).to_vec()];
            rows.extend(rules.iter().map(|rule| {
                vec![
                    text(&rule["ID"]),
                    or_none(&rule["Description"]),
                    text(&rule["AuthMethod"]),
                ]
            }));
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
fn print_rule(rule: &Value) {
    print_block(&[
        ("ID", text(&rule["ID"])),
        ("Description", or_none(&rule["Description"])),
        ("Auth Method", text(&rule["AuthMethod"])),
        ("Selector", format!("{:?}", rule["Selector"].as_str().unwrap_or(""))),
        ("Bind Type", text(&rule["BindType"])),
        ("Bind Name", or_none(&rule["BindName"])),
        ("Create Time", text(&rule["CreateTime"])),
        ("Modify Time", text(&rule["ModifyTime"])),
        ("Create Index", text(&rule["CreateIndex"])),
        ("Modify Index", text(&rule["ModifyIndex"])),
    ]);
}

/// How long `acl login` waits for the provider's redirect.
const CALLBACK_WAIT: Duration = Duration::from_secs(300);

pub(super) fn login(api: &Api, flags: LoginFlags) -> Result<(), Failure> {
    let methods = api.get("/v1/acl/auth-methods")?;
    let methods = methods.as_array().cloned().unwrap_or_default();
    let method = match &flags.method {
        Some(name) => methods.iter().find(|method| method["Name"] == name.as_str()),
        None => methods.iter().find(|method| method["Default"] == true),
    }
    .ok_or_else(|| match &flags.method {
        Some(name) => Failure(format!("Error: auth-method {name:?} not found"), 1),
        None => Failure("Error: no default auth method found; name one with -method".into(), 1),
    })?;
    let name = text(&method["Name"]);
    let method_type = flags.method_type.clone().unwrap_or_else(|| text(&method["Type"]));
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
    super::acl::print_token(&token)
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
