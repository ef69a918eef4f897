//! ACL policies in Nomad's policy language (HCL), read into the core's [`PolicyRules`] and
//! checked there (`PolicyRules::validate`: names, policies and capabilities with Nomad's
//! texts). A block or attribute the language does not have is refused by name rather than
//! ignored: a typo in a deny rule must not silently grant.
//!
//! ```hcl
//! namespace "default" {
//!   policy       = "read"
//!   capabilities = ["submit-job"]
//!   variables { path "nomad/jobs/*" { capabilities = ["read"] } }
//! }
//! host_volume "prod-*" { policy = "write" }
//! node { policy = "read" }
//! plugin { policy = "list" }
//! ```

use drover_core::acl::{HostVolumeRule, NamespaceRule, PolicyRules, VariableRule};

/// Parses and checks a policy's rules; the error is Nomad's `Failed to parse ACL Policy: ...`
/// or the check's text.
pub fn parse(text: &str) -> Result<PolicyRules, String> {
    let fail = |why: String| format!("Failed to parse ACL Policy: {why}");
    let body = drover_io_real::hcl_check::parse_body(text).map_err(fail)?;
    let mut rules = PolicyRules::default();
    if let Some(attribute) = body.attributes().next() {
        return Err(fail(format!(
            "unexpected attribute {:?} outside a block",
            attribute.key()
        )));
    }
    for block in body.blocks() {
        let label = || block.labels().first().map(|label| label.as_str().to_string());
        match block.identifier() {
            "namespace" => {
                let name = label().ok_or_else(|| fail("namespace block without a name".into()))?;
                rules.namespaces.push(namespace(&name, block.body()).map_err(fail)?);
            }
            "host_volume" => {
                let name = label().ok_or_else(|| fail("host_volume block without a name".into()))?;
                let (policy, capabilities) = policy_and_capabilities(block.body(), &[]).map_err(fail)?;
                rules.host_volumes.push(HostVolumeRule {
                    name,
                    policy,
                    capabilities,
                });
            }
            coarse @ ("agent" | "node" | "operator" | "quota" | "plugin") => {
                let (policy, capabilities) = policy_and_capabilities(block.body(), &[]).map_err(fail)?;
                if !capabilities.is_empty() {
                    return Err(fail(format!("{coarse} takes a policy, not capabilities")));
                }
                let slot = match coarse {
                    "agent" => &mut rules.agent,
                    "node" => &mut rules.node,
                    "operator" => &mut rules.operator,
                    "quota" => &mut rules.quota,
                    _ => &mut rules.plugin,
                };
                *slot = Some(policy.ok_or_else(|| fail(format!("{coarse} block without a policy")))?);
            }
            other => return Err(fail(format!("unknown block {other:?}"))),
        }
    }
    rules.validate()?;
    Ok(rules)
}

fn namespace(name: &str, body: &hcl::Body) -> Result<NamespaceRule, String> {
    let (policy, capabilities) = policy_and_capabilities(body, &["variables"])?;
    let mut variables = Vec::new();
    for block in body.blocks() {
        for path in block.body().blocks() {
            if path.identifier() != "path" {
                return Err(format!("unknown block {:?} in variables", path.identifier()));
            }
            let spec = path
                .labels()
                .first()
                .map(|label| label.as_str().to_string())
                .ok_or("variables path block without a path")?;
            let (policy, capabilities) = policy_and_capabilities(path.body(), &[])?;
            if policy.is_some() {
                return Err(format!("variables path {spec:?} takes capabilities, not a policy"));
            }
            variables.push(VariableRule {
                path: spec,
                capabilities,
            });
        }
    }
    Ok(NamespaceRule {
        name: name.to_string(),
        policy,
        capabilities,
        variables,
    })
}

/// A block's `policy` and `capabilities`; any other attribute, and any block but `blocks`, is
/// an error.
fn policy_and_capabilities(body: &hcl::Body, blocks: &[&str]) -> Result<(Option<String>, Vec<String>), String> {
    let mut policy = None;
    let mut capabilities = Vec::new();
    for attribute in body.attributes() {
        match (attribute.key(), attribute.expr()) {
            ("policy", hcl::Expression::String(text)) => policy = Some(text.clone()),
            ("capabilities", hcl::Expression::Array(items)) => {
                for item in items {
                    match item {
                        hcl::Expression::String(text) => capabilities.push(text.clone()),
                        other => return Err(format!("capabilities must be strings, not {other}")),
                    }
                }
            }
            ("policy" | "capabilities", other) => {
                return Err(format!("{} has the wrong type: {other}", attribute.key()));
            }
            (key, _) => return Err(format!("unknown attribute {key:?}")),
        }
    }
    if let Some(block) = body.blocks().find(|block| !blocks.contains(&block.identifier())) {
        return Err(format!("unknown block {:?}", block.identifier()));
    }
    Ok((policy, capabilities))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nomads_policy_language_is_read_and_expanded() {
        let rules = parse(
            r#"
namespace "default" {
  policy       = "read"
  capabilities = ["submit-job"]
  variables {
    path "nomad/jobs/*" { capabilities = ["read"] }
  }
}
namespace "prod-*" { policy = "deny" }
host_volume "scratch" { policy = "write" }
node { policy = "read" }
plugin { policy = "list" }
"#,
        )
        .unwrap();
        assert_eq!(rules.namespaces.len(), 2);
        let default = &rules.namespaces[0];
        assert!(default.capabilities.iter().any(|cap| cap == "submit-job"));
        assert!(default.capabilities.iter().any(|cap| cap == "read-job"));
        assert_eq!(default.variables[0].path, "nomad/jobs/*");
        assert_eq!(rules.namespaces[1].capabilities, ["deny"]);
        assert_eq!(
            rules.host_volumes[0].capabilities,
            ["mount-readonly", "mount-readwrite"]
        );
        assert_eq!(rules.node.as_deref(), Some("read"));
        assert_eq!(rules.plugin.as_deref(), Some("list"));
    }

    #[test]
    fn an_empty_policy_is_valid_and_grants_nothing() {
        for text in ["", "  \n# nothing yet\n"] {
            let rules = parse(text).unwrap();
            assert!(rules.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn what_the_language_does_not_have_is_refused_by_name() {
        for (text, error) in [
            (
                "namespace \"default\" { polcy = \"read\" }",
                "unknown attribute \"polcy\"",
            ),
            ("nodes { policy = \"read\" }", "unknown block \"nodes\""),
            ("node { policy = \"admin\" }", "Invalid node policy: \"admin\""),
            (
                "namespace \"default\" { policy = \"root\" }",
                "Invalid namespace policy: \"root\"",
            ),
            ("namespace \"default\" {", "Failed to parse ACL Policy"),
        ] {
            let got = parse(text).unwrap_err();
            assert!(got.contains(error), "{text:?}: {got}");
        }
    }
}
