//! Direct writes: the only commands a server proposes as a caller hands them over.
//!
//! Every other command is built by the leader's endpoints after their checks (a claim after the
//! claim rules, a plan after the scheduler, a node update after the node's secret). The agent
//! RPC's `Apply`, which a follower uses to forward a direct write to the leader, accepts
//! exactly these, validated here, so no peer can write an arbitrary entry into the log.

#[allow(unused_imports)]
use crate::prelude::*;

use super::Command;

/// The longest variable path accepted.
pub const VARIABLE_PATH_LEN_MAX: usize = 128;

/// Why a direct write was refused; the text names what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DirectWriteError {
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    #[error("variable must contain at least one item")]
    NoItems,
    #[error("{command} is not a direct write: only the servers' endpoints propose it")]
    NotDirect { command: &'static str },
    #[error("{0}")]
    Acl(String),
    #[error("{0}")]
    Items(String),
}

/// Checks a variable path: `[A-Za-z0-9-_~/]`, at most [`VARIABLE_PATH_LEN_MAX`] bytes, no
/// empty, `.` or `..` segments.
pub fn validate_variable_path(path: &str) -> Result<(), DirectWriteError> {
    let bad = |reason| {
        Err(DirectWriteError::InvalidPath {
            path: path.to_string(),
            reason,
        })
    };
    if path.is_empty() {
        return bad("must not be empty");
    }
    if path.len() > VARIABLE_PATH_LEN_MAX {
        return bad("must be at most 128 characters");
    }
    if !path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '~' | '/'))
    {
        return bad("may only contain letters, digits and - _ ~ /");
    }
    if path
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return bad("must not contain empty, '.' or '..' segments");
    }
    Ok(())
}

impl Command {
    /// Accepts the command as a direct write (variables, validated), or says why not.
    pub fn check_direct_write(&self) -> Result<(), DirectWriteError> {
        match self {
            Command::VariableUpsert { path, items, .. } => {
                validate_variable_path(path)?;
                if items.is_empty() {
                    return Err(DirectWriteError::NoItems);
                }
                match items.sealed() {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(reason)) => Err(DirectWriteError::Items(format!("malformed sealed items: {reason}"))),
                    None => crate::structs::check_secret_keys("variable items", items.keys())
                        .map_err(DirectWriteError::Items),
                }
            }
            Command::VariableDelete { path, .. } => validate_variable_path(path),
            Command::VariableLock(command) => {
                validate_variable_path(command.path())?;
                command.check().map_err(DirectWriteError::Items)
            }
            Command::Acl(command) => super::acl::AclState::check(command).map_err(DirectWriteError::Acl),
            Command::RootKey(
                super::rootkeys::RootKeyCommand::Activate { key_id }
                | super::rootkeys::RootKeyCommand::Delete { key_id },
            ) => super::rootkeys::check_key_id(key_id).map_err(DirectWriteError::Items),
            Command::Namespace(command) => command.check().map_err(DirectWriteError::Items),
            other => Err(DirectWriteError::NotDirect { command: other.name() }),
        }
    }

    /// The commands this one applies: a batch's members, or itself.
    pub fn members(&self) -> &[Command] {
        match self {
            Command::Batch(members) => members,
            single => core::slice::from_ref(single),
        }
    }

    /// The command's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Batch(_) => "Batch",
            Command::LeadershipEstablished { .. } => "LeadershipEstablished",
            Command::VariableUpsert { .. } => "VariableUpsert",
            Command::VariableDelete { .. } => "VariableDelete",
            Command::VariableLock(_) => "VariableLock",
            Command::NodeRegister { .. } => "NodeRegister",
            Command::NodeUpdateStatus { .. } => "NodeUpdateStatus",
            Command::NodeUpdateCsiInfo { .. } => "NodeUpdateCsiInfo",
            Command::NodeUpdateDrivers { .. } => "NodeUpdateDrivers",
            Command::NodeEmitEvents { .. } => "NodeEmitEvents",
            Command::NodeDeregister { .. } => "NodeDeregister",
            Command::NodeUpdateDrain { .. } => "NodeUpdateDrain",
            Command::NodeUpdateEligibility { .. } => "NodeUpdateEligibility",
            Command::AllocUpdateDesiredTransition { .. } => "AllocUpdateDesiredTransition",
            Command::JobUpsert { .. } => "JobUpsert",
            Command::JobDeregister { .. } => "JobDeregister",
            Command::JobRegister { .. } => "JobRegister",
            Command::JobStop { .. } => "JobStop",
            Command::JobScale { .. } => "JobScale",
            Command::PeriodicLaunch { .. } => "PeriodicLaunch",
            Command::PlanApply { .. } => "PlanApply",
            Command::DeploymentStatus { .. } => "DeploymentStatus",
            Command::DeploymentPromote { .. } => "DeploymentPromote",
            Command::DeploymentAllocHealth { .. } => "DeploymentAllocHealth",
            Command::JobStability { .. } => "JobStability",
            Command::SystemGc { .. } => "SystemGc",
            Command::ReconcileSummaries => "ReconcileSummaries",
            Command::AllocUpsert { .. } => "AllocUpsert",
            Command::AllocClientUpdate { .. } => "AllocClientUpdate",
            Command::AllocClientUpdates { .. } => "AllocClientUpdates",
            Command::AllocDelete { .. } => "AllocDelete",
            Command::EvalUpsert { .. } => "EvalUpsert",
            Command::CsiVolumeRegister { .. } => "CsiVolumeRegister",
            Command::CsiVolumeDeregister { .. } => "CsiVolumeDeregister",
            Command::CsiVolumeClaim { .. } => "CsiVolumeClaim",
            Command::CsiPluginDelete { .. } => "CsiPluginDelete",
            Command::SiAccessorsUpsert { .. } => "SiAccessorsUpsert",
            Command::SiAccessorsDelete { .. } => "SiAccessorsDelete",
            Command::Acl(_) => "Acl",
            Command::RootKey(_) => "RootKey",
            Command::Namespace(_) => "Namespace",
            Command::AutopilotSetConfig { .. } => "AutopilotSetConfig",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_variable_writes_are_direct() {
        let upsert = |path: &str, items: &[(&str, &str)]| Command::VariableUpsert {
            path: path.into(),
            items: items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            cas: None,
            lock_id: None,
        };
        assert_eq!(upsert("nomad/jobs/a-b_c~d", &[("k", "v")]).check_direct_write(), Ok(()));
        assert_eq!(upsert("a", &[]).check_direct_write(), Err(DirectWriteError::NoItems));
        let long = "x".repeat(VARIABLE_PATH_LEN_MAX + 1);
        for bad in ["", "a//b", "a/../b", "./a", "a b", "ä", long.as_str()] {
            assert!(
                matches!(
                    upsert(bad, &[("k", "v")]).check_direct_write(),
                    Err(DirectWriteError::InvalidPath { .. })
                ),
                "{bad:?}"
            );
            assert!(
                Command::VariableDelete {
                    path: bad.into(),
                    cas: None,
                    lock_id: None,
                }
                .check_direct_write()
                .is_err()
            );
        }
        let claimless = Command::CsiPluginDelete { plugin_id: "p".into() };
        assert_eq!(
            claimless.check_direct_write().unwrap_err().to_string(),
            "CsiPluginDelete is not a direct write: only the servers' endpoints propose it"
        );
        let lead = Command::LeadershipEstablished {
            leader_id: 1,
            term: 9,
            cluster_id: "forged".into(),
        };
        assert!(lead.check_direct_write().is_err());
    }
}
