//! Architecture invariant: the core is layered. Each top-level module of `core/src` sits in
//! one layer, and its (non-test) code names only modules of its own layer or below; within a
//! layer there is no cycle. A module added to the core must be placed here.
//!
//! Read from the sources, as `use crate::<module>` and `crate::<module>::` paths (comments
//! and test modules aside): what the compiler links, not what a doc comment mentions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &[
            "error",
            "time",
            "op",
            "hash",
            "goduration",
            "humanize",
            "codec",
            "cover",
            "bexpr",
        ],
    ),
    ("data", &["structs", "autopilot", "election"]),
    ("job language", &["connect", "taskenv", "driverspec", "jobspec"]),
    ("policies and settings", &["acl", "config"]),
    // Builders of data and settings for tests and benches (`testkit` feature).
    ("test data", &["testkit"]),
    ("state machine", &["fsm"]),
    (
        "decisions over the state",
        &[
            "scheduler",
            "csi",
            "deploy",
            "drainer",
            "gc",
            "periodic",
            "heartbeat",
            "membership",
            "bootstrap",
        ],
    ),
    ("endpoints and the client", &["rpc", "client"]),
    ("the server", &["server"]),
    ("the agent", &["agent"]),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            // Test-only modules.
            if path.file_name().is_some_and(|name| name == "tests") {
                continue;
            }
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs")
            && path.file_name().is_some_and(|name| name != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The top-level modules each top-level module's code names, with one place each.
fn edges(root: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut files = Vec::new();
    sources(root, &mut files);
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(root).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let from = first.trim_end_matches(".rs").to_string();
        if from == "lib" || from == "prelude" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        for (number, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name != from && modules.contains(&name) {
                    edges
                        .entry(from.clone())
                        .or_default()
                        .entry(name)
                        .or_insert_with(|| format!("{}:{}", relative.display(), number + 1));
                }
            }
        }
    }
    edges
}

fn top_level_modules(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs").map(str::to_string)
            }
        })
        .filter(|name| name != "lib" && name != "prelude")
        .collect()
}

#[test]
fn every_core_module_names_only_its_own_layer_or_below_and_no_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = top_level_modules(&root);
    let layer: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(index, (_, members))| members.iter().map(move |member| (*member, index)))
        .collect();
    let unplaced: Vec<&String> = modules
        .iter()
        .filter(|name| !layer.contains_key(name.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules placed in no layer (add them to LAYERS): {unplaced:?}"
    );
    let edges = edges(&root, &modules);
    let mut upward = Vec::new();
    for (from, targets) in &edges {
        for (to, at) in targets {
            let (from_layer, to_layer) = (layer[from.as_str()], layer[to.as_str()]);
            if to_layer > from_layer {
                upward.push(format!(
                    "{from} ({}) names {to} ({}) at {at}",
                    LAYERS[from_layer].0, LAYERS[to_layer].0
                ));
            }
        }
    }
    assert!(upward.is_empty(), "upward edges:\n{}", upward.join("\n"));
    // Within a layer: no cycle (a depth-first search that meets a module on its own path).
    fn visit<'a>(
        module: &'a str,
        edges: &'a BTreeMap<String, BTreeMap<String, String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|on| *on == module) {
            return Some(
                path[start..]
                    .iter()
                    .map(|m| m.to_string())
                    .chain([module.to_string()])
                    .collect(),
            );
        }
        if !done.insert(module) {
            return None;
        }
        path.push(module);
        for to in edges.get(module).into_iter().flat_map(|targets| targets.keys()) {
            if let Some(cycle) = visit(to, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in &modules {
        let cycle = visit(module, &edges, &mut Vec::new(), &mut done);
        assert!(cycle.is_none(), "a module cycle: {}", cycle.unwrap().join(" -> "));
    }
}
