//! Fuzz targets for everything Drover reads from outside: HTTP write bodies, HCL jobspecs and
//! agent configs, the agent RPC envelope, CSI plugin replies, the state records and the Raft
//! log. Each must refuse bad input with an error: no panic, no unbounded allocation, no hang.
//!
//! On stable Rust, with proptest: each case is a seed (the checked-in corpus under
//! `io-real/http/fuzz/corpus/<target>/`, plus records the encoders make fresh) with a few byte- or
//! structure-level mutations; a failing case is shrunk to the fewest mutations and written to
//! `target/fuzz-crashes/<target>/`, ready to be checked in as a corpus file once fixed.
//!
//! ```text
//! cargo test -p drover-http --test fuzz                          # corpus + 4096 cases each (the fast lane)
//! cargo test -p drover-http --test fuzz -- --secs 180            # the long lane, a fresh seed
//! cargo test -p drover-http --test fuzz -- --target jobspec_hcl --secs 3600 --seed 7
//! cargo test -p drover-http --test fuzz -- --replay target/fuzz-crashes/<target>/<file>
//! cargo test -p drover-http --test fuzz -- --write-seeds   # check in this build's records
//! ```
//!
//! Allocation is counted per thread by the global allocator below: a case whose live bytes
//! grow past [`CASE_ALLOC_MAX`] fails (and shrinks); one that asks for more than
//! [`ABORT_ALLOC`] at once is written out and the process stops before the allocation is
//! attempted. A case running longer than [`HANG_SECS`] is written out the same way.

mod csi_plugin;
mod mutate;
mod targets;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use mutate::{Case, Pool};
use targets::Target;

/// A case may grow its thread's live heap by this much.
const CASE_ALLOC_MAX: isize = 256 << 20;
/// One allocation this large is a bug even if the machine could grant it.
const ABORT_ALLOC: usize = 2 << 30;
const HANG_SECS: u64 = 30;

struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    let _ = TRACKING.try_with(|tracking| {
        if tracking.get() {
            let live = LIVE.get() + delta;
            LIVE.set(live);
            if live > PEAK.get() {
                PEAK.set(live);
            }
        }
    });
}

fn too_big(size: usize) -> bool {
    size > ABORT_ALLOC && TRACKING.try_with(Cell::get).unwrap_or(false)
}

// SAFETY: every call is forwarded to `System` unchanged; the counting only reads and writes
// this thread's cells, which allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if too_big(layout.size()) {
            give_up("allocation", layout.size());
        }
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            track(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if too_big(layout.size()) {
            give_up("allocation", layout.size());
        }
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            track(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        track(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if too_big(new_size) {
            give_up("reallocation", new_size);
        }
        let grown = unsafe { System.realloc(pointer, layout, new_size) };
        if !grown.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        grown
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The case each worker is running, for the allocator and the watchdog to write out.
struct Running {
    target: &'static str,
    case: Option<Case>,
    started: Option<Instant>,
}

static RUNNING: Mutex<Vec<Running>> = Mutex::new(Vec::new());
thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Stops the process over a case that cannot be allowed to continue, after writing it out.
/// Called from the allocator: the case is written with tracking off, so the few small
/// allocations this makes are not counted and cannot recurse here.
fn give_up(what: &str, size: usize) -> ! {
    let _ = TRACKING.try_with(|tracking| tracking.set(false));
    let worker = WORKER.try_with(Cell::get).unwrap_or(usize::MAX);
    let running = RUNNING.try_lock().ok().and_then(|running| {
        running
            .get(worker)
            .and_then(|run| run.case.clone().map(|case| (run.target, case)))
    });
    eprintln!("fuzz: a case asked for one {what} of {size} bytes");
    if let Some((target, case)) = running {
        save(target, &case, "alloc");
    }
    std::process::abort();
}

fn crash_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("io-real sits in the workspace")
        .join("target/fuzz-crashes")
        .join(target)
}

/// Writes a failing case where `--replay` reads it, named by its variant and a hash.
fn save(target: &'static str, case: &Case, why: &str) -> PathBuf {
    let variant = targets::by_name(target).map_or("0", |target| target.variants[case.variant]);
    let hash = fnv(&case.bytes);
    let dir = crash_dir(target);
    let path = dir.join(format!("{variant}--{why}-{hash:016x}"));
    let _ = std::fs::create_dir_all(&dir);
    match std::fs::write(&path, &case.bytes) {
        Ok(()) => eprintln!(
            "fuzz: {target}: input written to {}\n      replay: cargo test -p drover-http --test fuzz -- --replay {}",
            path.display(),
            path.display()
        ),
        Err(error) => eprintln!("fuzz: {target}: cannot write {}: {error}", path.display()),
    }
    path
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3)
    })
}

thread_local! {
    static IN_CASE: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Runs one case under the allocation count; an error names what went wrong.
fn run_case(target: &Target, case: &Case) -> Result<(), String> {
    let worker = WORKER.get();
    if let Some(running) = RUNNING.lock().expect("running lock").get_mut(worker) {
        running.target = target.name;
        running.case = Some(case.clone());
        running.started = Some(Instant::now());
    }
    LIVE.set(0);
    PEAK.set(0);
    IN_CASE.set(true);
    TRACKING.set(true);
    let outcome = std::panic::catch_unwind(|| (target.run)(case.variant, &case.bytes));
    TRACKING.set(false);
    IN_CASE.set(false);
    if let Some(running) = RUNNING.lock().expect("running lock").get_mut(worker) {
        running.started = None;
    }
    if outcome.is_err() {
        return Err(format!("panicked: {}", LAST_PANIC.with_borrow(Clone::clone)));
    }
    let peak = PEAK.get();
    if peak > CASE_ALLOC_MAX {
        return Err(format!("allocated {} MiB for one input", peak >> 20));
    }
    Ok(())
}

struct Options {
    /// A time budget per target; without one, a fixed number of cases from a fixed seed, so a
    /// plain `cargo test` is the same run every time.
    secs: Option<u64>,
    seed: u64,
    jobs: usize,
    targets: Vec<String>,
    replay: Vec<PathBuf>,
}

fn options() -> Options {
    let mut options = Options {
        secs: None,
        seed: 0,
        jobs: std::thread::available_parallelism().map_or(1, usize::from),
        targets: Vec::new(),
        replay: Vec::new(),
    };
    let mut seed = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--secs" => options.secs = Some(value().parse().expect("--secs takes whole seconds")),
            "--seed" => seed = Some(value().parse().expect("--seed takes a number")),
            "--jobs" => options.jobs = value().parse().expect("--jobs takes a number"),
            "--target" => options.targets.push(value()),
            "--replay" => options.replay.push(PathBuf::from(value())),
            "--write-seeds" => {
                write_seeds();
                std::process::exit(0);
            }
            "--list" => {
                for target in targets::ALL {
                    println!("{:<18} {}", target.name, target.about);
                }
                std::process::exit(0);
            }
            // What cargo and libtest-minded scripts pass to every test binary.
            "--nocapture" | "--quiet" | "-q" | "--show-output" => {}
            other => panic!("unknown argument {other:?} (see io-real/http/fuzz/main.rs)"),
        }
    }
    // A timed run explores: a new seed each time unless one is given (it is printed).
    options.seed = seed.unwrap_or_else(|| {
        if options.secs.is_some() {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs())
        } else {
            0
        }
    });
    options
}

/// Each batch of cases runs from its own seed (the run's seed, the batch number, the target).
const CASES_PER_BATCH: u64 = 256;
/// Batches per target of an untimed run.
const UNTIMED_BATCHES: u64 = 16;

/// A corpus file's variant is the part of its name before `--`.
fn read_corpus(target: &Target) -> Vec<(PathBuf, Case)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target.name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let case = read_case(target, &path);
            (path, case)
        })
        .collect()
}

fn read_case(target: &Target, path: &Path) -> Case {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let variant_name = name.split("--").next().unwrap_or_default();
    let variant = target
        .variants
        .iter()
        .position(|variant| *variant == variant_name)
        .unwrap_or_else(|| panic!("{}: no variant {variant_name:?} of {}", path.display(), target.name));
    let bytes = std::fs::read(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    Case { variant, bytes }
}

struct Outcome {
    target: &'static str,
    corpus: usize,
    cases: u64,
    failures: Vec<String>,
}

fn fuzz_target(target: &'static Target, options: &Options) -> Outcome {
    let mut outcome = Outcome {
        target: target.name,
        corpus: 0,
        cases: 0,
        failures: Vec::new(),
    };
    let mut seeds = Vec::new();
    for (path, case) in read_corpus(target) {
        outcome.corpus += 1;
        if let Err(error) = run_case(target, &case) {
            outcome
                .failures
                .push(format!("corpus file {}: {error}", path.display()));
        }
        seeds.push(case);
    }
    for case in (target.seeds)() {
        if let Err(error) = run_case(target, &case) {
            outcome.failures.push(format!("built-in seed: {error}"));
        }
        seeds.push(case);
    }
    if seeds.is_empty() {
        seeds.push(Case {
            variant: 0,
            bytes: Vec::new(),
        });
    }
    let pool = Arc::new(Pool::new(seeds, target.variants.len()));
    let strategy = mutate::cases(pool);
    let deadline = options.secs.map(|secs| Instant::now() + Duration::from_secs(secs));
    let mut batch = 0u64;
    let more = |batch: u64| match deadline {
        Some(deadline) => Instant::now() < deadline,
        None => batch < UNTIMED_BATCHES,
    };
    while outcome.failures.is_empty() && more(batch) {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&options.seed.to_le_bytes());
        seed[8..16].copy_from_slice(&batch.to_le_bytes());
        seed[16..24].copy_from_slice(&fnv(target.name.as_bytes()).to_le_bytes());
        let config = Config {
            cases: CASES_PER_BATCH as u32,
            failure_persistence: None,
            max_shrink_iters: 20_000,
            max_shrink_time: 60_000,
            max_global_rejects: u32::MAX,
            ..Config::default()
        };
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
        let result = runner.run(&strategy, |case| run_case(target, &case).map_err(TestCaseError::fail));
        outcome.cases += CASES_PER_BATCH;
        if let Err(TestError::Fail(reason, case)) = result {
            let path = save(target.name, &case, "fail");
            outcome.failures.push(format!(
                "{reason} (seed {} batch {batch}; input {})",
                options.seed,
                path.display()
            ));
        }
        batch += 1;
    }
    outcome
}

fn main() {
    let options = options();
    // A panic in a case is a finding, reported once with its input; any other is a harness bug.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if IN_CASE.try_with(Cell::get).unwrap_or(false) {
            let text = info.to_string();
            let _ = LAST_PANIC.try_with(|last| *last.borrow_mut() = text);
        } else {
            report(info);
        }
    }));
    if !options.replay.is_empty() {
        replay(&options.replay);
        return;
    }
    let chosen: Vec<&'static Target> = if options.targets.is_empty() {
        targets::ALL.iter().collect()
    } else {
        options
            .targets
            .iter()
            .map(|name| targets::by_name(name).unwrap_or_else(|| panic!("no fuzz target {name:?} (--list)")))
            .collect()
    };
    let jobs = options.jobs.clamp(1, chosen.len());
    let budget = match options.secs {
        Some(secs) => format!("{secs} s each"),
        None => format!("{} cases each", UNTIMED_BATCHES * CASES_PER_BATCH),
    };
    println!(
        "fuzz: {} targets, {budget}, seed {}, {jobs} at a time",
        chosen.len(),
        options.seed
    );
    *RUNNING.lock().expect("running lock") = (0..jobs)
        .map(|_| Running {
            target: "",
            case: None,
            started: None,
        })
        .collect();
    watchdog();
    let queue = Mutex::new(chosen.into_iter());
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for worker in 0..jobs {
            let (queue, outcomes, options) = (&queue, &outcomes, &options);
            scope.spawn(move || {
                WORKER.set(worker);
                loop {
                    let Some(target) = queue.lock().expect("queue lock").next() else {
                        break;
                    };
                    let started = Instant::now();
                    let outcome = fuzz_target(target, options);
                    println!(
                        "fuzz: {:<18} {:>4} corpus files, {:>8} cases in {:>5.1} s = {:>6.0} cases/s{}",
                        outcome.target,
                        outcome.corpus,
                        outcome.cases,
                        started.elapsed().as_secs_f64(),
                        outcome.cases as f64 / started.elapsed().as_secs_f64(),
                        if outcome.failures.is_empty() { "" } else { "  FAILED" }
                    );
                    outcomes.lock().expect("outcomes lock").push(outcome);
                }
            });
        }
    });
    let failures: Vec<String> = outcomes
        .into_inner()
        .expect("outcomes lock")
        .into_iter()
        .flat_map(|outcome| {
            outcome
                .failures
                .into_iter()
                .map(move |failure| format!("{}: {failure}", outcome.target))
        })
        .collect();
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("fuzz: {failure}");
        }
        std::process::exit(1);
    }
}

/// Writes each target's built-in seeds into its corpus directory: records in this build's
/// formats, kept so later builds go on reading them.
fn write_seeds() {
    for target in targets::ALL {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target.name);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        for case in (target.seeds)() {
            let path = dir.join(format!(
                "{}--seed-{:016x}",
                target.variants[case.variant],
                fnv(&case.bytes)
            ));
            std::fs::write(&path, &case.bytes).expect("write a seed");
            println!("{}", path.display());
        }
    }
}

/// Aborts with the running case written out when one runs longer than [`HANG_SECS`].
fn watchdog() {
    std::thread::spawn(|| {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let running = RUNNING.lock().expect("running lock");
            for run in running.iter() {
                if let (Some(started), Some(case)) = (run.started, &run.case)
                    && started.elapsed() > Duration::from_secs(HANG_SECS)
                {
                    eprintln!("fuzz: {}: a case ran for more than {HANG_SECS} s", run.target);
                    save(run.target, case, "hang");
                    std::process::abort();
                }
            }
        }
    });
}

fn replay(files: &[PathBuf]) {
    *RUNNING.lock().expect("running lock") = vec![Running {
        target: "",
        case: None,
        started: None,
    }];
    WORKER.set(0);
    let mut failed = false;
    for path in files {
        // cargo runs tests in the package's directory; a path may be given from the workspace's.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("io-real sits in the workspace");
        let path = &if path.exists() { path.clone() } else { root.join(path) };
        let target_name = path
            .parent()
            .and_then(Path::file_name)
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let target = targets::by_name(&target_name)
            .unwrap_or_else(|| panic!("{}: its directory names no fuzz target", path.display()));
        let case = read_case(target, path);
        match run_case(target, &case) {
            Ok(()) => println!("fuzz: {}: ok", path.display()),
            Err(error) => {
                failed = true;
                println!("fuzz: {}: {error}", path.display());
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
