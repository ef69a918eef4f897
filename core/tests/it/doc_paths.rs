//! The maps stay true: every repository path ARCHITECTURE.md, README.md and the decision
//! records in docs/decisions/ name in backticks
//! (`core/…`, `io-real/…`, `io-sim/…`, `sim-tests/…`, `proto/…`, `bin/…`, `scripts/…`,
//! `docs/…`, `.ci/…`) exists. A file moved or removed without its map following fails here.

use std::path::Path;

use regex_automata::meta::Regex;

#[test]
fn every_path_the_maps_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let path = Regex::new(r"`(core|io-real|io-sim|sim-tests|proto|bin|scripts|docs|\.ci)/[A-Za-z0-9_./-]+`")
        .expect("pattern compiles");
    let mut named = 0;
    let mut missing = Vec::new();
    let mut docs = vec![root.join("ARCHITECTURE.md"), root.join("README.md")];
    let decisions = root.join("docs/decisions");
    docs.extend(
        std::fs::read_dir(&decisions)
            .expect("docs/decisions is readable")
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "md")),
    );
    docs.sort();
    for file in &docs {
        let doc = file.strip_prefix(root).unwrap_or(file).display();
        let text = std::fs::read_to_string(file).expect("the map is readable");
        for found in path.find_iter(&text) {
            let name = text[found.range()].trim_matches('`').trim_end_matches('/');
            named += 1;
            if !root.join(name).exists() {
                missing.push(format!("{doc}: {name}"));
            }
        }
    }
    assert!(named > 20, "the maps name paths ({named} found)");
    assert!(
        missing.is_empty(),
        "paths the maps name that do not exist:\n{}",
        missing.join("\n")
    );
}
