//! Which Envoy a Connect sidecar container runs (Nomad's `envoy_version` hook, 1.0 on): the
//! client's default image names no version but `${NOMAD_envoy_version}`, which the hook
//! replaces, before each start, with the newest version the local Consul agent says it
//! supports (`xDS.SupportedProxies.envoy` of `/v1/agent/self`). An image an operator names
//! in full (`sidecar_task { config { image = ... } }`, or the client's
//! `meta.connect.sidecar_image`) is left as it is, and Consul is not asked.
//!
//! The client's `meta.connect.*` defaults ([`CLIENT_META_DEFAULTS`]) are what the injected
//! sidecar task's config interpolates.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

/// The pseudo-variable the hook replaces (Nomad's `envoy.VersionVar`).
pub const VERSION_VAR: &str = "${NOMAD_envoy_version}";

/// Nomad's defaults for the client's `meta.connect.*`, set where the operator set none.
pub const CLIENT_META_DEFAULTS: [(&str, &str); 4] = [
    ("connect.sidecar_image", "envoyproxy/envoy:v${NOMAD_envoy_version}"),
    ("connect.gateway_image", "envoyproxy/envoy:v${NOMAD_envoy_version}"),
    ("connect.log_level", "info"),
    ("connect.proxy_concurrency", "1"),
];

/// The client's node meta with Nomad's Connect defaults filled in.
pub fn with_client_meta_defaults(mut meta: BTreeMap<String, String>) -> BTreeMap<String, String> {
    for (key, value) in CLIENT_META_DEFAULTS {
        meta.entry(key.to_string()).or_insert_with(|| value.to_string());
    }
    meta
}

/// Whether a sidecar task on `driver` whose (interpolated) image is `image` needs Consul's
/// preferred version: only a container image that asks for it.
pub fn needs_version(driver: &str, image: Option<&str>) -> bool {
    driver == "docker" && image.is_some_and(|image| image.contains(VERSION_VAR))
}

/// The image with the newest supported Envoy in place of [`VERSION_VAR`], from the agent's
/// `SupportedProxies` (newest first). Nomad's texts when Consul names none, or one that is
/// not a version.
pub fn resolve_image(image: &str, supported: &BTreeMap<String, Vec<String>>) -> Result<String, String> {
    let newest = supported
        .get("envoy")
        .and_then(|versions| versions.first())
        .ok_or_else(|| "Consul did not report any supported envoy versions".to_string())?;
    let version = semver(newest).ok_or_else(|| format!("unexpected envoy version format: {newest:?}"))?;
    Ok(image.replace(VERSION_VAR, &version))
}

/// A version as Envoy's images are tagged: three numbers without a `v` (`1.18` is
/// `1.18.0`), a pre-release kept (`1.19.0-dev`); `None` when it is not a version.
fn semver(text: &str) -> Option<String> {
    let text = text.trim().trim_start_matches('v');
    let (numbers, suffix) = match text.split_once(['-', '+']) {
        Some((numbers, _)) => (numbers, &text[numbers.len()..]),
        None => (text, ""),
    };
    let mut parts: Vec<u64> = numbers
        .split('.')
        .map(|part| part.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    parts.resize(3, 0);
    Some(format!("{}.{}.{}{suffix}", parts[0], parts[1], parts[2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supported(versions: &[&str]) -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([(
            "envoy".to_string(),
            versions.iter().map(|version| version.to_string()).collect(),
        )])
    }

    #[test]
    fn the_newest_supported_envoy_replaces_the_version_variable() {
        let image = "envoyproxy/envoy:v${NOMAD_envoy_version}";
        assert_eq!(
            resolve_image(image, &supported(&["1.18.3", "1.17.1"])).as_deref(),
            Ok("envoyproxy/envoy:v1.18.3")
        );
        assert_eq!(
            resolve_image(image, &supported(&["1.18"])).as_deref(),
            Ok("envoyproxy/envoy:v1.18.0")
        );
        assert_eq!(
            resolve_image(
                "local/envoy:${NOMAD_envoy_version}-custom",
                &supported(&["v1.19.0-dev"])
            )
            .as_deref(),
            Ok("local/envoy:1.19.0-dev-custom")
        );
    }

    #[test]
    fn a_consul_that_names_no_version_or_a_bad_one_is_an_error() {
        let image = "envoyproxy/envoy:v${NOMAD_envoy_version}";
        assert_eq!(
            resolve_image(image, &BTreeMap::new()),
            Err("Consul did not report any supported envoy versions".into())
        );
        assert_eq!(
            resolve_image(image, &supported(&[])),
            Err("Consul did not report any supported envoy versions".into())
        );
        assert_eq!(
            resolve_image(image, &supported(&["latest"])),
            Err("unexpected envoy version format: \"latest\"".into())
        );
    }

    #[test]
    fn only_a_container_image_asking_for_a_version_needs_one() {
        assert!(needs_version(
            "docker",
            Some("envoyproxy/envoy:v${NOMAD_envoy_version}")
        ));
        assert!(!needs_version("docker", Some("envoyproxy/envoy:v1.18.3")));
        assert!(!needs_version("raw_exec", Some("${NOMAD_envoy_version}")));
        assert!(!needs_version("docker", None));
    }

    #[test]
    fn meta_defaults_fill_only_what_the_operator_left_out() {
        let meta = with_client_meta_defaults(BTreeMap::from([("connect.log_level".to_string(), "debug".to_string())]));
        assert_eq!(meta["connect.log_level"], "debug");
        assert_eq!(meta["connect.proxy_concurrency"], "1");
        assert_eq!(
            meta["connect.sidecar_image"],
            "envoyproxy/envoy:v${NOMAD_envoy_version}"
        );
    }
}
