//! What a server asks of an identity provider when someone logs in: a JWT's signature and
//! claims checked against the auth method's keys (PEM keys, a JWKS URL, or the keys an OIDC
//! discovery document points to), and the OIDC provider's discovery document, token and
//! user-info endpoints. Every call is bounded in time and in size.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use drover_core::acl::auth::AuthMethodConfig;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;

/// How long one call to the provider may take (Nomad's login deadline is 60 s; ours is per call).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from a provider.
const BODY_MAX: usize = 1 << 20;
/// cap/jwt's leeways when the method sets none: 150 s for `exp` and `nbf`, 60 s of clock skew.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(150);
const DEFAULT_SKEW: Duration = Duration::from_secs(60);

/// An HTTP(S) client trusting `ca_pems` (PEM text, as Nomad's `DiscoveryCaPem` and
/// `JWKSCACert` hold), else the host's roots.
pub struct Provider {
    client: Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Full<Bytes>>,
}

impl Provider {
    pub fn new(ca_pems: &[String]) -> Result<Provider, String> {
        let config = if ca_pems.iter().all(|pem| pem.trim().is_empty()) {
            drover_host::tls::client_config(&drover_host::tls::ClientTls {
                verify: true,
                ..Default::default()
            })
            .map_err(|error| error.to_string())?
        } else {
            let mut roots = rustls::RootCertStore::empty();
            for pem in ca_pems {
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    let cert = cert.map_err(|error| format!("invalid CA certificate: {error}"))?;
                    roots
                        .add(cert)
                        .map_err(|error| format!("invalid CA certificate: {error}"))?;
                }
            }
            rustls::ClientConfig::builder_with_provider(drover_host::tls::provider())
                .with_safe_default_protocol_versions()
                .map_err(|error| error.to_string())?
                .with_root_certificates(Arc::new(roots))
                .with_no_client_auth()
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Provider {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends `request` and reads its JSON answer; a status other than 200 is an error.
    async fn json(&self, request: hyper::Request<Full<Bytes>>) -> Result<Value, String> {
        let url = request.uri().to_string();
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| format!("{url}: {error}"))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), BODY_MAX)
                .collect()
                .await
                .map_err(|error| format!("{url}: reading the answer: {error}"))?
                .to_bytes();
            if status != hyper::StatusCode::OK {
                let text = String::from_utf8_lossy(&body[..body.len().min(256)]).into_owned();
                return Err(format!("{url}: {status}: {text}"));
            }
            serde_json::from_slice(&body).map_err(|error| format!("{url}: not JSON: {error}"))
        };
        tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| format!("{url}: no answer within {CALL_TIMEOUT:?}"))?
    }

    pub async fn get_json(&self, url: &str, bearer: Option<&str>) -> Result<Value, String> {
        let mut request = hyper::Request::get(url).header("Accept", "application/json");
        if let Some(token) = bearer {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        self.json(
            request
                .body(Full::default())
                .map_err(|error| format!("{url}: {error}"))?,
        )
        .await
    }

    pub async fn post_form(&self, url: &str, form: &[(&str, &str)]) -> Result<Value, String> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let request = hyper::Request::post(url)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Accept", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| format!("{url}: {error}"))?;
        self.json(request).await
    }

    /// The OIDC discovery document under `issuer` (`/.well-known/openid-configuration`).
    pub async fn discover(&self, issuer: &str) -> Result<Discovery, String> {
        let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
        let document = self.get_json(&url, None).await?;
        let field = |name: &str| document[name].as_str().unwrap_or_default().to_string();
        let discovery = Discovery {
            issuer: field("issuer"),
            authorization_endpoint: field("authorization_endpoint"),
            token_endpoint: field("token_endpoint"),
            userinfo_endpoint: field("userinfo_endpoint"),
            jwks_uri: field("jwks_uri"),
        };
        if discovery.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return Err(format!(
                "the discovery document's issuer {:?} is not {issuer:?}",
                discovery.issuer
            ));
        }
        if discovery.jwks_uri.is_empty() {
            return Err(format!("{url}: no jwks_uri"));
        }
        Ok(discovery)
    }

    pub async fn jwks(&self, url: &str) -> Result<JwkSet, String> {
        let value = self.get_json(url, None).await?;
        serde_json::from_value(value).map_err(|error| format!("{url}: not a JSON Web Key Set: {error}"))
    }
}

/// What an OIDC provider publishes about itself.
#[derive(Clone, Debug, Default)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub userinfo_endpoint: String,
    pub jwks_uri: String,
}

/// The keys a token may be signed with.
pub enum Keys {
    Pem(Vec<String>),
    Jwks(JwkSet),
}

/// The keys `config` names, fetched when they live at a URL.
pub async fn keys(config: &AuthMethodConfig) -> Result<Keys, String> {
    if !config.jwt_validation_pub_keys.is_empty() {
        return Ok(Keys::Pem(config.jwt_validation_pub_keys.clone()));
    }
    if !config.jwks_url.is_empty() {
        let provider = Provider::new(std::slice::from_ref(&config.jwks_ca_cert))?;
        return Ok(Keys::Jwks(provider.jwks(&config.jwks_url).await?));
    }
    let provider = Provider::new(&config.discovery_ca_pem)?;
    let discovery = provider.discover(&config.oidc_discovery_url).await?;
    Ok(Keys::Jwks(provider.jwks(&discovery.jwks_uri).await?))
}

fn algorithm(name: &str) -> Result<Algorithm, String> {
    name.parse::<Algorithm>()
        .map_err(|_| format!("unsupported signing algorithm {name:?}"))
}

fn pem_key(pem: &str, alg: Algorithm) -> Result<DecodingKey, jsonwebtoken::errors::Error> {
    use Algorithm::*;
    match alg {
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => DecodingKey::from_rsa_pem(pem.as_bytes()),
        ES256 | ES384 => DecodingKey::from_ec_pem(pem.as_bytes()),
        EdDSA => DecodingKey::from_ed_pem(pem.as_bytes()),
        HS256 | HS384 | HS512 => Err(jsonwebtoken::errors::ErrorKind::InvalidAlgorithm.into()),
    }
}

/// What a verified token must also satisfy.
pub struct Expect<'a> {
    /// The allowed algorithms (`SigningAlgs`; cap/jwt's default is RS256).
    pub algs: &'a [String],
    /// At least one of these in `aud` (none: not checked).
    pub audiences: &'a [String],
    /// `iss` one of these (none: not checked).
    pub issuers: &'a [String],
    pub config: &'a AuthMethodConfig,
}

/// `token`'s claims when its signature is one of `keys`' and its claims satisfy `expect`.
pub fn verify(token: &str, keys: &Keys, expect: &Expect<'_>) -> Result<Value, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|error| format!("malformed token: {error}"))?;
    let allowed: Vec<Algorithm> = if expect.algs.is_empty() {
        vec![Algorithm::RS256]
    } else {
        expect
            .algs
            .iter()
            .map(|name| algorithm(name))
            .collect::<Result<_, _>>()?
    };
    if !allowed.contains(&header.alg) {
        return Err(format!(
            "token signed with {:?}, which the auth method does not allow",
            header.alg
        ));
    }
    let config = expect.config;
    let leeway = |set: u64, default: Duration| if set == 0 { default } else { Duration::from_millis(set) };
    let skew = leeway(config.clock_skew_leeway_ms, DEFAULT_SKEW);
    let exp = leeway(config.expiration_leeway_ms, DEFAULT_LEEWAY);
    let nbf = leeway(config.not_before_leeway_ms, DEFAULT_LEEWAY);
    let mut validation = Validation::new(header.alg);
    validation.algorithms = vec![header.alg];
    validation.required_spec_claims = HashSet::new();
    validation.leeway = (exp.max(nbf) + skew).as_secs();
    validation.validate_nbf = true;
    if expect.audiences.is_empty() {
        validation.validate_aud = false;
    } else {
        validation.set_audience(expect.audiences);
    }
    if !expect.issuers.is_empty() {
        validation.set_issuer(expect.issuers);
    }
    let candidates: Vec<DecodingKey> = match keys {
        Keys::Pem(pems) => pems.iter().filter_map(|pem| pem_key(pem, header.alg).ok()).collect(),
        Keys::Jwks(set) => set
            .keys
            .iter()
            .filter(|jwk| header.kid.is_none() || jwk.common.key_id == header.kid)
            .filter_map(|jwk| DecodingKey::from_jwk(jwk).ok())
            .collect(),
    };
    if candidates.is_empty() {
        return Err("no key of the auth method can check this token".into());
    }
    let mut last = String::new();
    for key in &candidates {
        match jsonwebtoken::decode::<Value>(token, key, &validation) {
            Ok(data) if data.claims.is_object() => return Ok(data.claims),
            Ok(_) => return Err("the token's claims are not an object".into()),
            Err(error) => {
                last = match error.kind() {
                    jsonwebtoken::errors::ErrorKind::InvalidSignature => {
                        "no known key successfully validated the token signature".into()
                    }
                    jsonwebtoken::errors::ErrorKind::ExpiredSignature => "token is expired (exp)".into(),
                    jsonwebtoken::errors::ErrorKind::ImmatureSignature => "token not valid yet (nbf)".into(),
                    jsonwebtoken::errors::ErrorKind::InvalidAudience => "invalid audience (aud) claim".into(),
                    jsonwebtoken::errors::ErrorKind::InvalidIssuer => "invalid issuer (iss) claim".into(),
                    _ => error.to_string(),
                };
                if !matches!(error.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) {
                    return Err(last);
                }
            }
        }
    }
    Err(last)
}
