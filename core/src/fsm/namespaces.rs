//! Namespaces (Nomad's `namespaces` table): the `default` namespace always exists and can be
//! neither deleted nor stored over by another definition of it; others are made and changed
//! by an operator's upsert and deleted only when no job in them still runs.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::pmap::PMap;
use super::{Response, ServerState, Table};
use crate::error::ErrorKind;

/// The namespace everything is in unless it says otherwise.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Nomad's description of it.
pub const DEFAULT_DESCRIPTION: &str = "Default shared namespace";
/// Nomad's limit on a description.
pub const DESCRIPTION_MAX: usize = 256;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    #[serde(default)]
    pub create_index: u64,
    #[serde(default)]
    pub modify_index: u64,
}

impl Namespace {
    /// The `default` namespace as it is before anyone describes it.
    pub fn default_namespace() -> Self {
        Namespace {
            name: DEFAULT_NAMESPACE.into(),
            description: DEFAULT_DESCRIPTION.into(),
            create_index: 1,
            modify_index: 1,
            ..Namespace::default()
        }
    }

    /// Nomad's `Namespace.Validate`, with its texts.
    pub fn validate(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 128
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !name_ok {
            return Err(format!(
                "invalid name {:?}. Must match regex ^[a-zA-Z0-9-]{{1,128}}$",
                self.name
            ));
        }
        if self.description.len() > DESCRIPTION_MAX {
            return Err(format!("description longer than {DESCRIPTION_MAX}"));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceCommand {
    /// Creates or replaces each (keeping its create index).
    Upsert { namespaces: Vec<Namespace> },
    /// Deletes each, all or none: refused for `default`, an unknown name, or a namespace with
    /// a job that is not stopped.
    Delete { names: Vec<String> },
}

impl NamespaceCommand {
    /// What a caller may write directly (`Command::check_direct_write`).
    pub fn check(&self) -> Result<(), String> {
        match self {
            NamespaceCommand::Upsert { namespaces } => {
                if namespaces.is_empty() {
                    return Err("must specify at least one namespace".into());
                }
                namespaces.iter().try_for_each(Namespace::validate)
            }
            NamespaceCommand::Delete { names } if names.is_empty() => {
                Err("must specify at least one namespace to delete".into())
            }
            NamespaceCommand::Delete { .. } => Ok(()),
        }
    }
}

impl ServerState {
    pub(super) fn apply_namespaces(&mut self, index: u64, command: &NamespaceCommand) -> Response {
        match command {
            NamespaceCommand::Upsert { namespaces } => {
                for namespace in namespaces {
                    let create_index = self
                        .namespaces
                        .get(&namespace.name)
                        .map_or(index, |old| old.create_index);
                    let stored = Namespace {
                        create_index,
                        modify_index: index,
                        ..namespace.clone()
                    };
                    self.namespaces.insert(namespace.name.clone(), stored);
                }
            }
            NamespaceCommand::Delete { names } => {
                for name in names {
                    if name == DEFAULT_NAMESPACE {
                        return Response::Error(ErrorKind::Invalid, "default namespace can not be deleted".into());
                    }
                    if self.namespaces.get(name).is_none() {
                        return Response::Error(ErrorKind::NotFound, format!("namespace {name:?} does not exist"));
                    }
                    let running = self.jobs().any(|job| job.namespace == *name && !job.stop);
                    if running {
                        return Response::Error(
                            ErrorKind::Refused,
                            format!("namespace {name:?} has non-terminal jobs in regions: [global]"),
                        );
                    }
                }
                for name in names {
                    self.namespaces.delete(name);
                }
            }
        }
        self.table_index.insert(Table::Namespaces, index);
        Response::Done
    }

    /// The namespace named, `default` included.
    pub fn namespace(&self, name: &str) -> Option<Namespace> {
        match self.namespaces.get(name) {
            Some(namespace) => Some(namespace.clone()),
            None if name == DEFAULT_NAMESPACE => Some(Namespace::default_namespace()),
            None => None,
        }
    }

    /// Every namespace by name, `default` included.
    pub fn namespaces(&self) -> Vec<Namespace> {
        let mut all: BTreeMap<String, Namespace> = self
            .namespaces
            .iter()
            .map(|(name, namespace)| (name.clone(), namespace.clone()))
            .collect();
        all.entry(DEFAULT_NAMESPACE.into())
            .or_insert_with(Namespace::default_namespace);
        all.into_values().collect()
    }
}

/// The namespaces table's type in the state.
pub(super) type NamespaceTable = PMap<String, Namespace>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::Command;
    use crate::fsm::csi::tests::Fixture;

    fn upsert(names: &[&str]) -> Command {
        Command::Namespace(NamespaceCommand::Upsert {
            namespaces: names
                .iter()
                .map(|name| Namespace {
                    name: (*name).into(),
                    description: format!("{name} team"),
                    ..Namespace::default()
                })
                .collect(),
        })
    }

    fn delete(name: &str) -> Command {
        Command::Namespace(NamespaceCommand::Delete {
            names: vec![name.into()],
        })
    }

    #[test]
    fn default_always_exists_and_others_live_until_deleted() {
        let mut fixture = Fixture::new();
        let names = |fixture: &Fixture| -> Vec<String> {
            fixture
                .state
                .namespaces()
                .into_iter()
                .map(|namespace| namespace.name)
                .collect()
        };
        assert_eq!(names(&fixture), ["default"]);
        assert_eq!(
            fixture.state.namespace("default").unwrap().description,
            DEFAULT_DESCRIPTION
        );
        fixture.ok(upsert(&["prod", "dev"]));
        assert_eq!(names(&fixture), ["default", "dev", "prod"]);
        let created = fixture.state.namespace("prod").unwrap();
        fixture.ok(upsert(&["prod"]));
        let updated = fixture.state.namespace("prod").unwrap();
        assert_eq!(updated.create_index, created.create_index);
        assert!(updated.modify_index > created.modify_index);
        fixture.ok(delete("dev"));
        assert_eq!(names(&fixture), ["default", "prod"]);
    }

    #[test]
    fn deletes_that_would_lose_something_are_refused_whole() {
        let mut fixture = Fixture::new();
        fixture.ok(upsert(&["prod", "dev"]));
        let refused = |fixture: &mut Fixture, command: Command| match fixture.apply(command) {
            Response::Error(kind, text) => (kind, text),
            other => panic!("applied: {other:?}"),
        };
        assert_eq!(
            refused(&mut fixture, delete("default")),
            (ErrorKind::Invalid, "default namespace can not be deleted".into())
        );
        assert_eq!(refused(&mut fixture, delete("qa")).0, ErrorKind::NotFound);
        let mut job = crate::structs::Job {
            id: "web".into(),
            namespace: "prod".into(),
            ..Default::default()
        };
        fixture.ok(Command::JobUpsert { job: job.clone() });
        let both = Command::Namespace(NamespaceCommand::Delete {
            names: vec!["dev".into(), "prod".into()],
        });
        assert_eq!(
            refused(&mut fixture, both),
            (
                ErrorKind::Refused,
                "namespace \"prod\" has non-terminal jobs in regions: [global]".into()
            )
        );
        assert!(fixture.state.namespace("dev").is_some(), "all or none");
        job.stop = true;
        fixture.ok(Command::JobUpsert { job });
        fixture.ok(delete("prod"));
        assert!(fixture.state.namespace("prod").is_none());
    }

    #[test]
    fn names_and_descriptions_are_checked_with_nomads_texts() {
        let named = |name: &str| Namespace {
            name: name.into(),
            ..Namespace::default()
        };
        assert!(named("team-a1").validate().is_ok());
        assert_eq!(
            named("a b").validate().unwrap_err(),
            "invalid name \"a b\". Must match regex ^[a-zA-Z0-9-]{1,128}$"
        );
        assert!(named("").validate().is_err());
        let long = Namespace {
            description: "x".repeat(257),
            ..named("a")
        };
        assert_eq!(long.validate().unwrap_err(), "description longer than 256");
        let empty = NamespaceCommand::Upsert { namespaces: vec![] };
        assert!(empty.check().is_err());
    }
}
