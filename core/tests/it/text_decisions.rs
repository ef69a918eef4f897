//! Architecture invariant: no decision is taken from an error's text. What a failure means
//! travels as a kind (`ErrorKind`, `CsiCallFailure`, `AllocCallFailure`, an HTTP status), and
//! the message is only for people to read (issue 56 §2).
//!
//! Read from the sources of the crates that decide (core, io-real with its nested crates, the
//! CLI): a line that asks an error or message variable whether it contains, starts or ends
//! with, or equals some text is refused, outside test code. Text a foreign service answers
//! with and no status distinguishes may be matched where the line (or the one above it) says
//! why with a `text-match:` comment.

use std::path::{Path, PathBuf};

use regex_automata::meta::Regex;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            // Test trees and generated code are not where decisions live.
            if !matches!(
                name.to_str(),
                Some("tests" | "target" | "generated" | "benches" | "fuzz")
            ) {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|ext| ext == "rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The file's lines outside `#[cfg(test)]` items (a test module's braces counted through).
fn non_test_lines(text: &str) -> Vec<(usize, &str)> {
    let mut lines = Vec::new();
    let mut skipping: Option<i64> = None;
    let mut armed = false;
    for (number, line) in text.lines().enumerate() {
        if let Some(depth) = skipping.as_mut() {
            *depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            if *depth <= 0 && line.contains('}') {
                skipping = None;
            }
            continue;
        }
        if line.trim_start().starts_with("#[cfg(test)]") {
            armed = true;
            continue;
        }
        if armed {
            armed = false;
            let depth = line.matches('{').count() as i64 - line.matches('}').count() as i64;
            if depth > 0 {
                skipping = Some(depth);
            }
            continue;
        }
        lines.push((number + 1, line));
    }
    lines
}

/// A variable that holds a failure's text, asked about its text.
fn matcher() -> Regex {
    let holder = r"\b\w*(error|err|message|msg|reason|failure|refusal|refused|status_text)\w*(\(\))?";
    Regex::new_many(&[
        format!(r"{holder}(\.\w+(\(\))?)*\s*\.\s*(contains|starts_with|ends_with|find|strip_prefix)\("),
        format!(r"{holder}(\.(message|msg|text|0|1))?\s*==\s*(\x22|[A-Z_]{{3,}}\b)"),
        r"to_string\(\)\s*\.\s*(contains|starts_with|ends_with)\(".to_string(),
    ])
    .expect("patterns compile")
}

#[test]
fn no_decision_reads_an_error_message() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let mut files = Vec::new();
    for crate_dir in ["core/src", "io-real", "bin/src"] {
        rust_files(&root.join(crate_dir), &mut files);
    }
    files.sort();
    assert!(files.len() > 100, "the sources were found ({} files)", files.len());
    let matcher = matcher();
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        let lines = non_test_lines(&text);
        let mut previous = "";
        for (number, line) in lines {
            let code = line.split("//").next().unwrap_or_default();
            let excused = line.contains("text-match:") || previous.contains("text-match:");
            previous = line;
            if excused || code.trim_start().starts_with("assert") {
                continue;
            }
            if matcher.is_match(code) {
                let shown = file.strip_prefix(root).unwrap_or(file).display();
                found.push(format!("{shown}:{number}: {}", line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "decisions read from an error's text (carry a kind instead, or say `text-match:` why a \
         foreign service's text must be read):\n{}",
        found.join("\n")
    );
}

/// The lint's own cases, as data: `tests/testdata/text_decisions/flagged.txt` holds lines it
/// must refuse, `fine.txt` lines it must let through (one per line, `#` comments).
fn cases(name: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/text_decisions")
        .join(name);
    std::fs::read_to_string(path)
        .expect("the lint's cases")
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(String::from)
        .collect()
}

#[test]
fn the_lint_sees_what_it_looks_for() {
    let matcher = matcher();
    let (flagged, fine) = (cases("flagged.txt"), cases("fine.txt"));
    assert!(flagged.len() >= 5 && fine.len() >= 4, "the cases were read");
    for line in &flagged {
        assert!(matcher.is_match(line), "not flagged: {line}");
    }
    for line in &fine {
        assert!(!matcher.is_match(line), "flagged: {line}");
    }
    let code = "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn b() { x.contains(\"y\") }\n}\nfn c() {}\n";
    let kept: Vec<&str> = non_test_lines(code).into_iter().map(|(_, line)| line).collect();
    assert_eq!(kept, ["fn a() {}", "fn c() {}"]);
}
