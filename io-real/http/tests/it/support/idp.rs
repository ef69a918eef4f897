// Shared by io-real/http/tests/it/acl_login.rs and bin/tests/it/acl_cli.rs (included by path).
#![allow(dead_code)]

//! A fake OIDC identity provider on a real socket, and JWT signing keys made for the run:
//! discovery, JWKS, an authorization endpoint that answers with the redirect it would make
//! (the test plays the browser), a token endpoint checking the client secret and PKCE, and
//! user info.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::routing::{get, post};
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

pub fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An ES256 signing key made for the run: its PKCS#8 PEM, public PEM and JWK.
pub struct SigningKey {
    pub encoding: EncodingKey,
    pub public_pem: String,
    pub jwk: Value,
}

pub fn signing_key(kid: &str) -> SigningKey {
    let pair = rcgen::KeyPair::generate().unwrap();
    let raw = pair.public_key_raw();
    assert_eq!((raw.len(), raw[0]), (65, 4), "an uncompressed P-256 point");
    SigningKey {
        encoding: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
        public_pem: pair.public_key_pem(),
        jwk: json!({"kty": "EC", "crv": "P-256", "x": b64url(&raw[1..33]), "y": b64url(&raw[33..]),
            "kid": kid, "alg": "ES256", "use": "sig"}),
    }
}

pub fn sign(key: &SigningKey, kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, claims, &key.encoding).unwrap()
}

/// The fake provider's memory of an authorization request, by the code it handed out.
#[derive(Default)]
pub struct Idp {
    pub issuer: String,
    pub key: Option<Arc<SigningKey>>,
    /// code → (nonce, code_challenge)
    pub pending: BTreeMap<String, (String, String)>,
    pub userinfo_calls: usize,
}

pub type Shared = Arc<Mutex<Idp>>;

async fn discovery(State(idp): State<Shared>) -> axum::Json<Value> {
    let issuer = idp.lock().unwrap().issuer.clone();
    axum::Json(json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"),
        "userinfo_endpoint": format!("{issuer}/userinfo"),
        "jwks_uri": format!("{issuer}/jwks"),
    }))
}

async fn jwks(State(idp): State<Shared>) -> axum::Json<Value> {
    let key = idp.lock().unwrap().key.clone().unwrap();
    axum::Json(json!({ "keys": [key.jwk] }))
}

/// The user's browser arriving: the provider "logs them in" and redirects with a code.
async fn authorize(State(idp): State<Shared>, Query(query): Query<BTreeMap<String, String>>) -> String {
    assert_eq!(query["response_type"], "code");
    assert_eq!(query["client_id"], "drover");
    assert!(query["scope"].split(' ').any(|scope| scope == "openid"), "{query:?}");
    assert_eq!(query["code_challenge_method"], "S256");
    let code = format!("code-{}", query["state"]);
    idp.lock()
        .unwrap()
        .pending
        .insert(code.clone(), (query["nonce"].clone(), query["code_challenge"].clone()));
    format!("{}?code={code}&state={}", query["redirect_uri"], query["state"])
}

async fn token(State(idp): State<Shared>, body: String) -> Result<axum::Json<Value>, (axum::http::StatusCode, String)> {
    let form: BTreeMap<String, String> = form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let refuse = |why: &str| Err((axum::http::StatusCode::BAD_REQUEST, why.to_string()));
    if form.get("client_secret").map(String::as_str) != Some("s3cr3t-client") {
        return refuse("invalid_client");
    }
    let mut idp = idp.lock().unwrap();
    let Some((nonce, challenge)) = idp.pending.remove(&form["code"]) else {
        return refuse("invalid_grant");
    };
    let verifier = form.get("code_verifier").cloned().unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    if b64url(digest.as_ref()) != challenge {
        return refuse("invalid_grant: PKCE");
    }
    let claims = json!({"iss": idp.issuer, "sub": "user-7", "aud": "drover", "nonce": nonce,
        "exp": now_s() + 300, "iat": now_s(), "email": "dev@example.com"});
    let id_token = sign(idp.key.as_ref().unwrap(), "k1", &claims);
    Ok(axum::Json(
        json!({"id_token": id_token, "access_token": "at-1", "token_type": "Bearer"}),
    ))
}

async fn userinfo(State(idp): State<Shared>, headers: axum::http::HeaderMap) -> axum::Json<Value> {
    assert_eq!(headers["authorization"], "Bearer at-1");
    idp.lock().unwrap().userinfo_calls += 1;
    axum::Json(json!({"sub": "user-7", "groups": ["platform"]}))
}

/// Serves the fake provider on a port the OS hands out; returns its issuer URL.
pub async fn serve_idp(idp: Shared) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    idp.lock().unwrap().issuer = issuer.clone();
    let app = axum::Router::new()
        .route("/.well-known/openid-configuration", get(discovery))
        .route("/jwks", get(jwks))
        .route("/authorize", get(authorize))
        .route("/token", post(token))
        .route("/userinfo", get(userinfo))
        .with_state(idp);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    issuer
}

/// A plain GET of `url` (a browser's visit, without following redirects); returns the body.
pub fn browse(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}
