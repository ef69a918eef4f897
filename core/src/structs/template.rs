//! A task's `template` blocks (Nomad's `structs.Template`): a file rendered into the task's
//! directory before it starts, from inline `data` or a `source` file, in Go's template syntax,
//! re-rendered when a Nomad variable it reads changes.

#[allow(unused_imports)]
use crate::prelude::*;

use core::time::Duration;

use serde::{Deserialize, Serialize};

pub const TEMPLATE_CHANGE_MODE_NOOP: &str = "noop";
pub const TEMPLATE_CHANGE_MODE_RESTART: &str = "restart";
pub const TEMPLATE_CHANGE_MODE_SIGNAL: &str = "signal";
/// Nomad's defaults (`Template.Canonicalize`).
pub const TEMPLATE_DEFAULT_PERMS: &str = "0644";
pub const TEMPLATE_DEFAULT_SPLAY: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// `source`: a file in the task's directory (relative to it) holding the template.
    pub source_path: String,
    /// `destination`: where the result goes, relative to the task's directory.
    pub dest_path: String,
    /// `data`: the template itself.
    pub embedded_tmpl: String,
    /// `restart`, `signal` or `noop`: what a re-render does to the running task.
    pub change_mode: String,
    /// The signal `change_mode = "signal"` sends (`SIGHUP`, ...).
    pub change_signal: String,
    /// Re-renders wait a random time up to this long (so a cluster does not restart at once).
    pub splay: Duration,
    /// The file's mode, in octal (`"0644"`).
    pub perms: String,
    /// `env = true`: the result is `KEY=value` lines that join the task's environment.
    pub envvars: bool,
    pub left_delim: String,
    pub right_delim: String,
}

impl Default for Template {
    fn default() -> Self {
        Template {
            source_path: String::new(),
            dest_path: String::new(),
            embedded_tmpl: String::new(),
            change_mode: TEMPLATE_CHANGE_MODE_RESTART.into(),
            change_signal: String::new(),
            splay: TEMPLATE_DEFAULT_SPLAY,
            perms: TEMPLATE_DEFAULT_PERMS.into(),
            envvars: false,
            left_delim: "{{".into(),
            right_delim: "}}".into(),
        }
    }
}

impl Template {
    /// Nomad's `Template.Validate`, problem by problem.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.source_path.is_empty() && self.embedded_tmpl.is_empty() {
            errors.push("Must specify a source path or have an embedded template".to_string());
        }
        if self.dest_path.is_empty() {
            errors.push("Must specify a destination for the template".to_string());
        } else if escapes_task_dir(&self.dest_path) {
            errors.push("destination escapes allocation directory".to_string());
        }
        if !self.source_path.is_empty() && escapes_task_dir(&self.source_path) {
            errors.push("source escapes allocation directory".to_string());
        }
        match self.change_mode.as_str() {
            TEMPLATE_CHANGE_MODE_NOOP | TEMPLATE_CHANGE_MODE_RESTART => {}
            TEMPLATE_CHANGE_MODE_SIGNAL => {
                if self.change_signal.is_empty() {
                    errors.push("Must specify signal value when change mode is signal".to_string());
                } else if signal_number(&self.change_signal).is_none() {
                    errors.push(format!("unknown signal {:?}", self.change_signal));
                }
                if self.envvars {
                    errors.push("cannot use signals with env var templates".to_string());
                }
            }
            _ => errors.push("Invalid change mode. Must be one of the following: noop, signal, restart".to_string()),
        }
        if !self.perms.is_empty() && parse_perms(&self.perms).is_none() {
            errors.push(format!(
                "Failed to parse {:?} as octal: strconv.ParseUint: parsing {:?}: invalid syntax",
                self.perms, self.perms
            ));
        }
        if (self.left_delim != "{{" && !self.left_delim.is_empty())
            || (self.right_delim != "}}" && !self.right_delim.is_empty())
        {
            errors.push("custom template delimiters are not supported (only {{ and }})".to_string());
        }
        errors
    }

    /// The file's mode bits (`perms`, default 0644).
    pub fn mode(&self) -> u32 {
        parse_perms(&self.perms).unwrap_or(0o644)
    }
}

/// Octal permission bits of at most 12 bits (Go's `strconv.ParseUint(s, 8, 12)`).
pub fn parse_perms(text: &str) -> Option<u32> {
    let value = u32::from_str_radix(text, 8).ok()?;
    (value < 0o10000).then_some(value)
}

/// Whether a path relative to the task directory leaves the allocation directory (Nomad's
/// `PathEscapesAllocViaRelative("task", path)`): the task directory sits one level below the
/// allocation directory, so one `..` more than the path descends is an escape. Absolute paths
/// are taken relative to the task directory, as Nomad does.
fn escapes_task_dir(path: &str) -> bool {
    let mut depth: i64 = 1;
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// The Linux signal number of a name Nomad accepts (`SIGHUP`, `hup`, `SIGUSR1`, ...).
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    Some(match bare {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ABRT" => 6,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "TTIN" => 21,
        "TTOU" => 22,
        "WINCH" => 28,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nomads_template_validation_texts() {
        let empty = Template::default();
        assert_eq!(
            empty.validate(),
            [
                "Must specify a source path or have an embedded template",
                "Must specify a destination for the template"
            ]
        );
        let signal = Template {
            embedded_tmpl: "x".into(),
            dest_path: "local/x".into(),
            change_mode: "signal".into(),
            envvars: true,
            ..Template::default()
        };
        assert_eq!(
            signal.validate(),
            [
                "Must specify signal value when change mode is signal",
                "cannot use signals with env var templates"
            ]
        );
        let bad = Template {
            embedded_tmpl: "x".into(),
            dest_path: "../../etc/passwd".into(),
            change_mode: "reload".into(),
            perms: "999".into(),
            ..Template::default()
        };
        assert_eq!(
            bad.validate(),
            [
                "destination escapes allocation directory",
                "Invalid change mode. Must be one of the following: noop, signal, restart",
                "Failed to parse \"999\" as octal: strconv.ParseUint: parsing \"999\": invalid syntax",
            ]
        );
        let fine = Template {
            embedded_tmpl: "x".into(),
            dest_path: "../alloc/shared.env".into(),
            change_mode: "signal".into(),
            change_signal: "SIGHUP".into(),
            perms: "0600".into(),
            ..Template::default()
        };
        assert_eq!(fine.validate(), Vec::<String>::new());
        assert_eq!(fine.mode(), 0o600);
        assert_eq!(signal_number("hup"), Some(1));
        assert_eq!(signal_number("SIGUSR1"), Some(10));
    }
}
