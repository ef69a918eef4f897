//! Data-driven tests of the core machines (the etcd/raft-rs style).
//!
//! Each file under `tests/testdata/<machine>/` is a script of directives. A directive is a line
//! (`name key=value ...`), optional input lines, a `----` line, and the expected output up to
//! the next blank line. The harness runs the directive and compares its output; with
//! `UPDATE_TESTDATA=1` it rewrites the files with what the machine did instead. Regenerate, then
//! read every diff: the expected output is reviewed, never hand-tuned.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use drover_core::Instant;
use drover_core::bootstrap::{BootState, Bootstrap, BootstrapAction};
use drover_core::config::{BootstrapFault, ServerTiming};
use drover_core::membership::{MemberId, ServerTags};
use drover_core::op::{OpId, OpIds};

struct Directive {
    line_no: usize,
    command: String,
    args: BTreeMap<String, String>,
    input: Vec<String>,
    expected: String,
}

fn parse(text: &str) -> Vec<(Vec<String>, Directive)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut comments = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() || line.starts_with('#') {
            comments.push(line.to_string());
            i += 1;
            continue;
        }
        let line_no = i + 1;
        let mut words = line.split_whitespace();
        let command = words.next().expect("directive").to_string();
        let args = words
            .map(|word| match word.split_once('=') {
                Some((key, value)) => (key.to_string(), value.to_string()),
                None => (word.to_string(), String::new()),
            })
            .collect();
        i += 1;
        let mut input = Vec::new();
        while i < lines.len() && lines[i] != "----" {
            input.push(lines[i].to_string());
            i += 1;
        }
        assert!(i < lines.len(), "line {line_no}: directive without ----");
        i += 1;
        let mut expected = String::new();
        while i < lines.len() && !lines[i].is_empty() {
            expected.push_str(lines[i]);
            expected.push('\n');
            i += 1;
        }
        out.push((
            std::mem::take(&mut comments),
            Directive {
                line_no,
                command,
                args,
                input,
                expected,
            },
        ));
    }
    out
}

fn render(parsed: &[(Vec<String>, Directive)], outputs: &[String]) -> String {
    let mut text = String::new();
    for ((comments, directive), output) in parsed.iter().zip(outputs) {
        for comment in comments {
            if !(comment.is_empty() && (text.is_empty() || text.ends_with("\n\n"))) {
                text.push_str(comment);
                text.push('\n');
            }
        }
        text.push_str(&directive.command);
        for (key, value) in &directive.args {
            text.push(' ');
            text.push_str(key);
            if !value.is_empty() {
                text.push('=');
                text.push_str(value);
            }
        }
        text.push('\n');
        for line in &directive.input {
            text.push_str(line);
            text.push('\n');
        }
        text.push_str("----\n");
        text.push_str(output);
        text.push('\n');
    }
    text
}

/// Runs every script in `dir` through `run`, comparing or (with UPDATE_TESTDATA) rewriting.
fn run_dir<S>(dir: &str, mut new_state: impl FnMut() -> S, mut run: impl FnMut(&mut S, &Directive) -> String) {
    let update = std::env::var_os("UPDATE_TESTDATA").is_some();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata").join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata dir")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scripts in {}", dir.display());
    let mut failures = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let parsed = parse(&text);
        let mut state = new_state();
        let outputs: Vec<String> = parsed.iter().map(|(_, directive)| run(&mut state, directive)).collect();
        if update {
            std::fs::write(&file, render(&parsed, &outputs)).unwrap();
            continue;
        }
        for ((_, directive), output) in parsed.iter().zip(&outputs) {
            if *output != directive.expected {
                failures.push(format!(
                    "{}:{}: {}\n--- expected\n{}--- actual\n{}",
                    file.display(),
                    directive.line_no,
                    directive.command,
                    directive.expected,
                    output
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(rerun with UPDATE_TESTDATA=1 to regenerate, then review the diff)",
        failures.join("\n")
    );
}

struct BootstrapHarness {
    now: Instant,
    ops: OpIds,
    machine: Option<Bootstrap>,
    members: Vec<MemberId>,
}

fn member(line: &str) -> MemberId {
    let mut words = line.split_whitespace();
    let name = words.next().expect("member name").to_string();
    let mut tags = ServerTags {
        region: "global".into(),
        datacenter: "dc1".into(),
        id: 0,
        rpc_addr: "127.0.0.1:4647".parse().unwrap(),
        expect: 0,
        bootstrap: false,
        nonvoter: false,
        build: "test".into(),
    };
    for word in words {
        let (key, value) = word.split_once('=').unwrap_or((word, ""));
        match key {
            "id" => {
                tags.id = value.parse().unwrap();
                tags.rpc_addr = format!("10.0.0.{}:4647", tags.id).parse().unwrap();
            }
            "expect" => tags.expect = value.parse().unwrap(),
            "region" => tags.region = value.into(),
            "bootstrap" => tags.bootstrap = true,
            "nonvoter" => tags.nonvoter = true,
            other => panic!("unknown member attribute {other}"),
        }
    }
    MemberId {
        name,
        addr: format!("10.0.0.{}:4648", tags.id).parse().unwrap(),
        generation: 0,
        tags: Some(tags),
    }
}

fn describe(machine: &mut Bootstrap, now: Instant) -> String {
    let mut out = String::new();
    while let Some(action) = machine.poll_action() {
        match action {
            BootstrapAction::QueryPeers { op, peer } => {
                writeln!(out, "action: query-peers {op} {}", peer.name)
            }
            BootstrapAction::Initialize { op, servers } => {
                let names: Vec<String> = servers
                    .iter()
                    .map(|peer| {
                        if peer.nonvoter {
                            format!("{}(nonvoter)", peer.name)
                        } else {
                            peer.name.clone()
                        }
                    })
                    .collect();
                writeln!(out, "action: initialize {op} [{}]", names.join(" "))
            }
            BootstrapAction::PersistBootstrapped => writeln!(out, "action: persist-bootstrapped"),
        }
        .unwrap();
    }
    let timeout = machine
        .poll_timeout()
        .map(|at| format!(" timeout=+{}ms", at.saturating_duration_since(now).as_millis()))
        .unwrap_or_default();
    writeln!(out, "phase: {}{timeout}", machine.phase()).unwrap();
    out
}

fn op(directive: &Directive) -> OpId {
    OpId(directive.args["op"].parse().expect("op=N"))
}

#[test]
fn bootstrap() {
    run_dir(
        "bootstrap",
        || BootstrapHarness {
            now: Instant::ZERO,
            ops: OpIds::default(),
            machine: None,
            members: Vec::new(),
        },
        |harness, directive| {
            let args = &directive.args;
            match directive.command.as_str() {
                "new" => {
                    let boot = BootState {
                        last_log_index: args.get("log").map(|index| index.parse().unwrap()),
                        bootstrapped: args.contains_key("bootstrapped"),
                    };
                    let fault = args
                        .contains_key("fault")
                        .then_some(BootstrapFault::SelfElectAfterElectionTimeout);
                    let machine = Bootstrap::new(
                        harness.now,
                        args["expect"].parse().unwrap(),
                        "global".into(),
                        args["id"].parse().unwrap(),
                        ServerTiming::default(),
                        fault,
                        boot,
                    );
                    harness.machine = Some(machine);
                }
                "members" => {
                    harness.members = directive.input.iter().map(|line| member(line)).collect();
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.evaluate(harness.now, &harness.members, &mut harness.ops);
                }
                "peers" => {
                    let result = match (args.get("ok"), args.get("err")) {
                        (Some(list), _) => Ok(list.split(',').filter(|p| !p.is_empty()).map(String::from).collect()),
                        (None, Some(error)) => Err(error.replace('_', " ")),
                        _ => panic!("peers needs ok= or err="),
                    };
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.handle_peers(harness.now, op(directive), result, &mut harness.ops);
                }
                "initialized" => {
                    let result = args.get("err").map_or(Ok(()), |error| Err(error.replace('_', " ")));
                    harness
                        .machine
                        .as_mut()
                        .expect("new first")
                        .handle_initialized(op(directive), result);
                }
                "advance" => {
                    let ms: u64 = args["ms"].parse().unwrap();
                    harness.now = harness.now + Duration::from_millis(ms);
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.handle_timeout(harness.now, &harness.members, &mut harness.ops);
                }
                "raft" => {
                    let log = args.get("log").map(|index| index.parse().unwrap());
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.observe_raft(log, args.contains_key("leader"));
                }
                other => panic!("line {}: unknown directive {other}", directive.line_no),
            }
            describe(harness.machine.as_mut().expect("new first"), harness.now)
        },
    );
}
