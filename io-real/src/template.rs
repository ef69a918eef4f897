//! Rendering of task `template` blocks (the driver half of the core's template hook): Go's
//! template syntax through `gtmpl`, with Nomad's functions for what a task reads — `env`,
//! `nomadVar`, `nomadVarExists` — and the common string functions of consul-template.
//!
//! `render` is pure (the simulation calls it too); `render_to_file` reads a `source`, renders
//! and writes the destination atomically with the template's permissions, only once every
//! variable the template reads was supplied and exists.
//!
//! `gtmpl` functions are plain `fn` pointers, so what they read (the task's env, the
//! variables) is handed over in a thread-local for the duration of one render.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use drover_core::client::{ErrorKind, IoError, RenderReply, RenderRequest};
use gtmpl::{Context, Func, FuncError, Value};

/// What one render reads and finds.
#[derive(Default)]
struct Scope {
    env: BTreeMap<String, String>,
    variables: BTreeMap<String, Option<BTreeMap<String, String>>>,
    used: BTreeSet<String>,
    unknown: BTreeSet<String>,
    blocked: BTreeSet<String>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

fn with_scope<R>(f: impl FnOnce(&mut Scope) -> R) -> Result<R, FuncError> {
    SCOPE.with(|scope| {
        scope
            .borrow_mut()
            .as_mut()
            .map(f)
            .ok_or_else(|| FuncError::Generic("template function called outside a render".into()))
    })
}

fn string_arg(name: &str, args: &[Value], at: usize) -> Result<String, FuncError> {
    match args.get(at) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => Ok(other.to_string()),
        None => Err(FuncError::ExactlyXArgs(name.into(), at + 1)),
    }
}

/// `env "NAME"`: the task's environment variable, empty when unset.
fn env(args: &[Value]) -> Result<Value, FuncError> {
    let name = string_arg("env", args, 0)?;
    with_scope(|scope| Value::from(scope.env.get(&name).cloned().unwrap_or_default()))
}

/// A variable's items as a template sees them: `.key` reads an item, and `.Tuples` lists
/// them sorted by key as `{K, V}` pairs (Nomad's idiom for ranging in order).
fn variable_value(items: &BTreeMap<String, String>) -> Value {
    let mut map: HashMap<String, Value> = items
        .iter()
        .map(|(key, value)| (key.clone(), Value::from(value.clone())))
        .collect();
    if !items.contains_key("Tuples") {
        let tuples: Vec<Value> = items
            .iter()
            .map(|(key, value)| {
                Value::Map(HashMap::from([
                    ("K".to_string(), Value::from(key.clone())),
                    ("V".to_string(), Value::from(value.clone())),
                ]))
            })
            .collect();
        map.insert("Tuples".into(), Value::Array(tuples));
    }
    Value::Map(map)
}

/// `nomadVar "path"`: the variable's items. A path not supplied yet is recorded for the core
/// to fetch; one that holds no variable blocks the render, as Nomad's does.
fn nomad_var(args: &[Value]) -> Result<Value, FuncError> {
    let path = string_arg("nomadVar", args, 0)?;
    with_scope(|scope| {
        scope.used.insert(path.clone());
        match scope.variables.get(&path) {
            Some(Some(items)) => variable_value(items),
            Some(None) => {
                scope.blocked.insert(path);
                Value::Map(HashMap::new())
            }
            None => {
                scope.unknown.insert(path);
                Value::Map(HashMap::new())
            }
        }
    })
}

/// `nomadVarExists "path"`: whether a variable is there (never blocks).
fn nomad_var_exists(args: &[Value]) -> Result<Value, FuncError> {
    let path = string_arg("nomadVarExists", args, 0)?;
    with_scope(|scope| {
        scope.used.insert(path.clone());
        match scope.variables.get(&path) {
            Some(found) => Value::Bool(found.is_some()),
            None => {
                scope.unknown.insert(path);
                Value::Bool(false)
            }
        }
    })
}

fn to_upper(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(string_arg("toUpper", args, 0)?.to_uppercase()))
}

fn to_lower(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(string_arg("toLower", args, 0)?.to_lowercase()))
}

fn trim_space(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(string_arg("trimSpace", args, 0)?.trim().to_string()))
}

/// `split SEP STRING` (consul-template's order, so `{{ "a,b" | split "," }}` works).
fn split(args: &[Value]) -> Result<Value, FuncError> {
    let separator = string_arg("split", args, 0)?;
    let text = string_arg("split", args, 1)?;
    if text.is_empty() {
        return Ok(Value::Array(Vec::new()));
    }
    Ok(Value::Array(text.split(separator.as_str()).map(Value::from).collect()))
}

/// `join SEP LIST`.
fn join(args: &[Value]) -> Result<Value, FuncError> {
    let separator = string_arg("join", args, 0)?;
    match args.get(1) {
        Some(Value::Array(items)) => Ok(Value::from(
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(&separator),
        )),
        _ => Err(FuncError::Generic("join: the second argument must be a list".into())),
    }
}

/// `replaceAll OLD NEW STRING`.
fn replace_all(args: &[Value]) -> Result<Value, FuncError> {
    let old = string_arg("replaceAll", args, 0)?;
    let new = string_arg("replaceAll", args, 1)?;
    let text = string_arg("replaceAll", args, 2)?;
    Ok(Value::from(text.replace(&old, &new)))
}

fn parse_int(args: &[Value]) -> Result<Value, FuncError> {
    let text = string_arg("parseInt", args, 0)?;
    text.trim()
        .parse::<i64>()
        .map(Value::from)
        .map_err(|error| FuncError::Generic(format!("parseInt: {text:?}: {error}")))
}

fn to_json(args: &[Value]) -> Result<Value, FuncError> {
    let value = args
        .first()
        .ok_or_else(|| FuncError::ExactlyXArgs("toJSON".into(), 1))?;
    Ok(Value::from(json(value).to_string()))
}

/// A template value as JSON, object keys sorted (as Go's encoding/json sorts map keys).
fn json(value: &Value) -> serde_json::Value {
    match value {
        Value::Nil | Value::NoValue => serde_json::Value::Null,
        Value::Bool(flag) => serde_json::Value::Bool(*flag),
        Value::String(text) => serde_json::Value::String(text.clone()),
        Value::Number(number) => serde_json::from_str(&number.to_string()).unwrap_or(serde_json::Value::Null),
        Value::Array(items) => serde_json::Value::Array(items.iter().map(json).collect()),
        Value::Map(map) | Value::Object(map) => {
            let sorted: BTreeMap<&String, serde_json::Value> =
                map.iter().map(|(key, value)| (key, json(value))).collect();
            serde_json::Value::Object(sorted.into_iter().map(|(key, value)| (key.clone(), value)).collect())
        }
        Value::Function(_) => serde_json::Value::Null,
    }
}

const FUNCS: &[(&str, Func)] = &[
    ("env", env),
    ("nomadVar", nomad_var),
    ("nomadVarExists", nomad_var_exists),
    ("toUpper", to_upper),
    ("toLower", to_lower),
    ("trimSpace", trim_space),
    ("split", split),
    ("join", join),
    ("replaceAll", replace_all),
    ("parseInt", parse_int),
    ("toJSON", to_json),
];

/// Renders `text` with the task's `env` and the variables fetched so far.
pub fn render(
    text: &str,
    env: &BTreeMap<String, String>,
    variables: &BTreeMap<String, Option<BTreeMap<String, String>>>,
) -> Result<RenderReply, String> {
    let mut template = gtmpl::Template::default();
    template.add_funcs(FUNCS);
    template.parse(text).map_err(|error| format!("parse: {error}"))?;
    SCOPE.with(|scope| {
        *scope.borrow_mut() = Some(Scope {
            env: env.clone(),
            variables: variables.clone(),
            ..Scope::default()
        })
    });
    let rendered = template.render(&Context::empty());
    let scope = SCOPE.with(|scope| scope.borrow_mut().take()).unwrap_or_default();
    let content = rendered.map_err(|error| format!("execute: {error}"))?;
    Ok(RenderReply {
        content,
        used: scope.used,
        unknown: scope.unknown,
        blocked: scope.blocked,
    })
}

/// `path` (relative to the task directory; an absolute one too, as Nomad takes it) as a path
/// relative to the allocation directory, refusing to leave it.
fn inside(task_dir: &Path, path: &str) -> Result<PathBuf, IoError> {
    let task = task_dir.file_name().map(PathBuf::from).unwrap_or_default();
    crate::confined::normalize(&task.join(path.trim_start_matches('/'))).map_err(|_| {
        IoError::new(
            ErrorKind::FailedPrecondition,
            format!("template path {path:?} escapes the allocation directory"),
        )
    })
}

/// A file error while rendering: a path leading out of the allocation directory (a link the
/// task planted) is [`ErrorKind::FailedPrecondition`], anything else [`ErrorKind::Other`].
fn file_error(error: &std::io::Error, message: String) -> IoError {
    let kind = if crate::confined::is_escape(error) {
        ErrorKind::FailedPrecondition
    } else {
        ErrorKind::Other
    };
    IoError::new(kind, message)
}

/// Reads the template (inline or `source`), renders it, and when complete writes it to its
/// destination (a temporary file renamed over it, so a task never reads half a file). Both
/// are opened beneath the allocation directory, never through a link leading out of it
/// ([`crate::confined`]).
pub fn render_to_file(request: &RenderRequest) -> Result<RenderReply, IoError> {
    let task_dir = Path::new(&request.task_dir);
    let template = &request.template;
    let alloc_dir = task_dir.parent().unwrap_or(task_dir);
    let beneath = || {
        crate::confined::Beneath::open(alloc_dir)
            .map_err(|error| IoError::other(format!("open {}: {error}", alloc_dir.display())))
    };
    let text = if template.source_path.is_empty() {
        template.embedded_tmpl.clone()
    } else {
        let source = inside(task_dir, &template.source_path)?;
        beneath()?.read_to_string(&source).map_err(|error| {
            file_error(
                &error,
                format!("failed to read template source {}: {error}", source.display()),
            )
        })?
    };
    let reply = render(&text, &request.env, &request.variables).map_err(IoError::other)?;
    if !reply.complete() {
        return Ok(reply);
    }
    let destination = inside(task_dir, &template.dest_path)?;
    beneath()?
        .write_atomically(&destination, reply.content.as_bytes(), template.mode())
        .map_err(|error| {
            file_error(
                &error,
                format!("failed writing template {}: {error}", destination.display()),
            )
        })?;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Items<'a> = Option<&'a [(&'a str, &'a str)]>;

    fn vars(pairs: &[(&str, Items<'_>)]) -> BTreeMap<String, Option<BTreeMap<String, String>>> {
        pairs
            .iter()
            .map(|(path, items)| {
                (
                    path.to_string(),
                    items.map(|items| {
                        items
                            .iter()
                            .map(|(key, value)| (key.to_string(), value.to_string()))
                            .collect()
                    }),
                )
            })
            .collect()
    }

    #[test]
    fn env_and_variables_render_and_unknown_paths_are_reported() {
        let env = BTreeMap::from([("NOMAD_ALLOC_INDEX".to_string(), "2".to_string())]);
        let text =
            r#"index={{ env "NOMAD_ALLOC_INDEX" }} {{ with nomadVar "nomad/jobs/web" }}user={{ .user }}{{ end }}"#;
        let first = render(text, &env, &BTreeMap::new()).unwrap();
        assert_eq!(first.unknown, BTreeSet::from(["nomad/jobs/web".to_string()]));
        assert!(!first.complete());
        let missing = render(text, &env, &vars(&[("nomad/jobs/web", None)])).unwrap();
        assert_eq!(missing.blocked, BTreeSet::from(["nomad/jobs/web".to_string()]));
        let found = render(text, &env, &vars(&[("nomad/jobs/web", Some(&[("user", "admin")]))])).unwrap();
        assert!(found.complete());
        assert_eq!(found.content, "index=2 user=admin");
        assert_eq!(found.used, BTreeSet::from(["nomad/jobs/web".to_string()]));
    }

    #[test]
    fn tuples_range_in_key_order_and_common_functions_work() {
        let items: &[(&str, &str)] = &[("b", "2"), ("a", "1"), ("c", "3")];
        let text = r#"{{ range (nomadVar "v").Tuples }}{{ .K }}={{ .V }};{{ end }} {{ "a,b" | split "," | join "+" | toUpper }} {{ replaceAll "x" "y" "xox" }} {{ nomadVarExists "none" }}"#;
        let reply = render(text, &BTreeMap::new(), &vars(&[("v", Some(items)), ("none", None)])).unwrap();
        assert_eq!(reply.content, "a=1;b=2;c=3; A+B yoy false");
        assert!(reply.complete(), "nomadVarExists never blocks: {:?}", reply.blocked);
    }

    #[test]
    fn parse_errors_name_the_problem_and_files_are_written_with_their_mode() {
        let error = render("{{ nope }}", &BTreeMap::new(), &BTreeMap::new()).unwrap_err();
        assert!(error.contains("nope"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let task_dir = dir.path().join("web");
        std::fs::create_dir_all(&task_dir).unwrap();
        let request = RenderRequest {
            template: drover_core::structs::Template {
                embedded_tmpl: "A={{ env \"A\" }}\n".into(),
                dest_path: "secrets/app.env".into(),
                perms: "0600".into(),
                ..Default::default()
            },
            task_dir: task_dir.display().to_string(),
            env: BTreeMap::from([("A".to_string(), "1".to_string())]),
            variables: BTreeMap::new(),
        };
        render_to_file(&request).unwrap();
        let written = task_dir.join("secrets/app.env");
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "A=1\n");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&written).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        let escape = RenderRequest {
            template: drover_core::structs::Template {
                embedded_tmpl: "x".into(),
                dest_path: "../../outside".into(),
                ..Default::default()
            },
            ..request.clone()
        };
        assert_eq!(render_to_file(&escape).unwrap_err().kind, ErrorKind::FailedPrecondition);
        // Issue 54: the task made its secrets dir a link to a host directory; the template
        // is refused, not written there as root.
        let outside = tempfile::tempdir().unwrap();
        std::fs::remove_dir_all(task_dir.join("secrets")).unwrap();
        std::os::unix::fs::symlink(outside.path(), task_dir.join("secrets")).unwrap();
        let error = render_to_file(&request).unwrap_err();
        assert_eq!(error.kind, ErrorKind::FailedPrecondition, "{}", error.message);
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}
