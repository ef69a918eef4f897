//! Architecture invariant: drover-core is sans-IO. Its normal (non-dev) dependency tree must
//! not contain a runtime, a network stack, a consensus engine, a storage engine, a simulator,
//! or an OS entropy source (`getrandom`: without it no thread RNG can exist in core, so every
//! random choice comes from the seeded generator handed in).

use std::process::Command;

const FORBIDDEN: &[&str] = &[
    "tokio", "tonic", "openraft", "redb", "madsim", "turmoil", "hyper", "axum", "mio",
];

#[test]
fn core_dependency_tree_has_no_io_crates() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "drover-core",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8(output.stdout).expect("utf-8");
    let crates: Vec<&str> = tree.lines().filter_map(|line| line.split_whitespace().next()).collect();
    assert!(crates.contains(&"drover-core"), "unexpected cargo tree output:\n{tree}");
    let found: Vec<&str> = crates
        .iter()
        .copied()
        .filter(|name| {
            FORBIDDEN
                .iter()
                .any(|forbidden| name == forbidden || name.starts_with(&format!("{forbidden}-")))
        })
        .collect();
    assert!(found.is_empty(), "drover-core depends on {found:?}:\n{tree}");
}

#[test]
fn core_is_no_std_so_std_io_is_unreachable() {
    let lib = include_str!("../../src/lib.rs");
    assert!(lib.contains("#![no_std]"), "drover-core must stay #![no_std]");
    assert!(
        lib.contains("#[cfg(test)]\nextern crate std;"),
        "std may only be linked for unit tests"
    );
}
