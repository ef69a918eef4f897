//! What a task driver's `config` block takes, checked when a job is admitted (`job run`,
//! `job plan`, `job validate`, the HTTP API), so that a key the driver would not read is
//! refused by name at once rather than ignored on some client later.
//!
//! A driver's schema is a table of [`Field`]s, as Nomad's drivers declare theirs with
//! `hclspec`: each key's [`Shape`] (a string, a list of strings, a block, …) and whether it is
//! required. Values are read as HCL's type conversion reads them: a number or a bool may be
//! written as a quoted string, a string with `${…}` is taken as it is (it is interpolated on
//! the client, per allocation). The problems are Nomad's (HCL's) sentences, with HCL's
//! suggestion of a near key.
//!
//! Drivers without a schema here (a third party's, the test `mock` driver) are not checked.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::structs::ConfigValue;

pub mod docker;
pub mod docker_plugin;

/// The signal a task is stopped with when it names no `kill_signal`: SIGTERM for a container
/// (what `docker stop` sends, and what images' entrypoints handle), SIGINT for a process, as
/// Nomad's drivers default.
pub fn default_kill_signal(driver: &str) -> i32 {
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;
    match driver {
        "docker" => SIGTERM,
        _ => SIGINT,
    }
}

/// What one key of a driver's config holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    String,
    Bool,
    Number,
    /// A Go duration (`"5m"`, `"30s"`).
    Duration,
    /// `list(string)`.
    Strings,
    /// `map(string)`, also written as the older block (`labels { a = "b" }`), which reads as a
    /// list of maps.
    StringMap,
    /// `map(number)` (`port_map { http = 8080 }`).
    NumberMap,
    /// One block of these fields.
    Block(&'static [Field]),
    /// Repeated blocks of these fields (`mount { … } mount { … }`).
    Blocks(&'static [Field]),
}

impl Shape {
    /// HCL's name of the type, as its "… required" sentences say it.
    fn name(self) -> &'static str {
        match self {
            Shape::String => "string",
            Shape::Bool => "bool",
            Shape::Number => "number",
            Shape::Duration => "duration",
            Shape::Strings => "list of string",
            Shape::StringMap => "map of string",
            Shape::NumberMap => "map of number",
            Shape::Block(_) => "block",
            Shape::Blocks(_) => "list of block",
        }
    }
}

/// One key of a driver's config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub shape: Shape,
    pub required: bool,
    /// A key Nomad's driver takes that this one cannot honour yet, and why: refused by name
    /// rather than taken and ignored.
    pub unsupported: Option<&'static str>,
}

impl Field {
    pub const fn optional(name: &'static str, shape: Shape) -> Field {
        Field {
            name,
            shape,
            required: false,
            unsupported: None,
        }
    }

    pub const fn required(name: &'static str, shape: Shape) -> Field {
        Field {
            name,
            shape,
            required: true,
            unsupported: None,
        }
    }

    pub const fn unsupported(name: &'static str, shape: Shape, why: &'static str) -> Field {
        Field {
            name,
            shape,
            required: false,
            unsupported: Some(why),
        }
    }
}

/// The schema of `driver`'s config, if this agent knows it.
pub fn schema(driver: &str) -> Option<&'static [Field]> {
    match driver {
        "docker" => Some(docker::FIELDS),
        _ => None,
    }
}

/// Why a config cannot be taken. `path` names the key as written, with the block and position
/// it sits in (`mount[1].bind_options.propagation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigProblem {
    /// A key the driver does not take; `suggestion` is a near one it does.
    Unknown {
        path: String,
        suggestion: Option<&'static str>,
    },
    /// A required key that is not there.
    Missing { path: String },
    /// A value of the wrong type.
    Wrong { path: String, expected: &'static str },
    /// A key Nomad's driver takes that this one does not honour (yet), and why.
    Unsupported { path: String, why: &'static str },
    /// A value of the right type that the driver cannot take, in Nomad's words.
    Invalid { path: String, message: &'static str },
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigProblem::Unknown { path, suggestion } => {
                write!(f, "config: An argument named {path:?} is not expected here.")?;
                if let Some(near) = suggestion {
                    write!(f, " Did you mean {near:?}?")?;
                }
                Ok(())
            }
            ConfigProblem::Missing { path } => write!(
                f,
                "config: The argument {path:?} is required, but no definition was found."
            ),
            ConfigProblem::Unsupported { path, why } => {
                write!(
                    f,
                    "config: The argument {path:?} is not supported by this agent: {why}."
                )
            }
            ConfigProblem::Wrong { path, expected } => {
                write!(
                    f,
                    "config: Inappropriate value for attribute {path:?}: {expected} required."
                )
            }
            ConfigProblem::Invalid { message, .. } => write!(f, "config: {message}"),
        }
    }
}

/// What is wrong with `config` for `driver` (nothing for a driver without a schema here), in
/// key order.
pub fn check(driver: &str, config: &BTreeMap<String, ConfigValue>) -> Vec<ConfigProblem> {
    let mut problems = Vec::new();
    if let Some(fields) = schema(driver) {
        check_fields(fields, config, "", &mut problems);
    }
    if driver == "docker" {
        docker::check_values(config, &mut problems);
    }
    problems
}

fn check_fields(
    fields: &'static [Field],
    config: &BTreeMap<String, ConfigValue>,
    prefix: &str,
    problems: &mut Vec<ConfigProblem>,
) {
    for (key, value) in config {
        let path = format!("{prefix}{key}");
        match fields.iter().find(|field| field.name == key) {
            Some(Field {
                unsupported: Some(why), ..
            }) => problems.push(ConfigProblem::Unsupported { path, why }),
            Some(field) => check_value(field.shape, value, &path, problems),
            None => problems.push(ConfigProblem::Unknown {
                path,
                suggestion: suggestion(key, fields),
            }),
        }
    }
    for field in fields.iter().filter(|field| field.required) {
        if !config.contains_key(field.name) {
            problems.push(ConfigProblem::Missing {
                path: format!("{prefix}{}", field.name),
            });
        }
    }
}

fn check_value(shape: Shape, value: &ConfigValue, path: &str, problems: &mut Vec<ConfigProblem>) {
    let wrong = |problems: &mut Vec<ConfigProblem>| {
        problems.push(ConfigProblem::Wrong {
            path: path.to_string(),
            expected: shape.name(),
        });
    };
    let fits = match shape {
        Shape::String => scalar(value),
        Shape::Bool => interpolated(value) || value.as_bool().is_some() || parses_bool(value),
        Shape::Number => interpolated(value) || value.as_int().is_some(),
        Shape::Duration => {
            interpolated(value)
                || value
                    .as_str()
                    .is_some_and(|text| crate::goduration::parse(text).is_ok())
        }
        Shape::Strings => match value {
            ConfigValue::List(items) => items.iter().all(scalar),
            _ => false,
        },
        Shape::StringMap => maps(value).is_some_and(|maps| maps.iter().all(|map| map.values().all(scalar))),
        Shape::NumberMap => maps(value).is_some_and(|maps| {
            maps.iter()
                .all(|map| map.values().all(|item| interpolated(item) || item.as_int().is_some()))
        }),
        Shape::Block(fields) => match maps(value).as_deref() {
            Some([one]) => {
                check_fields(fields, one, &format!("{path}."), problems);
                true
            }
            _ => false,
        },
        Shape::Blocks(fields) => match maps(value) {
            Some(each) => {
                for (position, block) in each.iter().enumerate() {
                    check_fields(fields, block, &format!("{path}[{position}]."), problems);
                }
                true
            }
            None => false,
        },
    };
    if !fits {
        wrong(problems);
    }
}

/// A string, or a number or bool HCL converts to one.
fn scalar(value: &ConfigValue) -> bool {
    matches!(
        value,
        ConfigValue::String(_) | ConfigValue::Int(_) | ConfigValue::Bool(_)
    )
}

/// A string to be interpolated on the client: its type is known only then.
fn interpolated(value: &ConfigValue) -> bool {
    value.as_str().is_some_and(|text| text.contains("${"))
}

fn parses_bool(value: &ConfigValue) -> bool {
    matches!(value.as_str(), Some("true" | "false"))
}

/// A map, or the list of maps the older block syntax reads as; also a block (a map) or
/// repeated blocks (a list of maps), as the jobspec reads them.
fn maps(value: &ConfigValue) -> Option<Vec<&BTreeMap<String, ConfigValue>>> {
    match value {
        ConfigValue::Map(map) => Some(alloc::vec![map]),
        ConfigValue::List(items) => items
            .iter()
            .map(|item| match item {
                ConfigValue::Map(map) => Some(map),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// The key of `fields` nearest `key`, if near enough to be what was meant (HCL suggests a name
/// within an edit distance of three).
fn suggestion(key: &str, fields: &'static [Field]) -> Option<&'static str> {
    fields
        .iter()
        .map(|field| (distance(key, field.name), field.name))
        .filter(|(distance, _)| *distance < 3)
        .min()
        .map(|(_, name)| name)
}

/// Levenshtein distance over characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(distance("image", "image"), 0);
        assert_eq!(distance("imgae", "image"), 2);
        assert_eq!(distance("imag", "image"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("privileged", "priviledged"), 1);
    }

    #[test]
    fn a_driver_without_a_schema_is_not_checked() {
        let config = BTreeMap::from([("anything".to_string(), ConfigValue::Bool(true))]);
        assert!(check("mock", &config).is_empty());
        assert!(check("some-plugin", &config).is_empty());
    }
}
