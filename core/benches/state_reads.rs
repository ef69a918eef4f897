//! What listing every job costs against the size of the state: `GET /v1/jobs` reads each
//! job's allocations and evaluations (status and summary). With the by-job indexes
//! (`ServerState::job_allocs`, `job_evals`) a job costs what it holds; the baseline, in the
//! same run, is the scan every job did before them (each job filtering every allocation and
//! evaluation). Prints figures, asserts nothing.
//!
//!   cargo bench -p drover-core --bench state_reads [-- JOBS]     (default 6,000)

// A bench measures wall time around the core; the core itself never reads a clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::Instant;

use drover_core::fsm::{Command, Entry, ServerState};
use drover_core::structs::{Allocation, Evaluation, Job};

fn main() {
    let jobs: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(6_000);
    let mut state = ServerState::default();
    let mut index = 0;
    let mut apply = |state: &mut ServerState, command: Command| {
        index += 1;
        state.apply(
            index,
            &Entry {
                at_unix_ms: index,
                command,
            },
        );
    };
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(500) {
        for j in chunk {
            let job = Job {
                id: format!("job-{j}"),
                namespace: "default".into(),
                name: format!("job-{j}"),
                ..Job::default()
            };
            let eval = Evaluation {
                id: format!("eval-{j}-register"),
                namespace: "default".into(),
                job_id: format!("job-{j}"),
                ..Evaluation::default()
            };
            apply(
                &mut state,
                Command::JobRegister {
                    job,
                    eval: Some(eval),
                    enforce_index: None,
                },
            );
        }
        let allocs: Vec<Allocation> = chunk
            .iter()
            .flat_map(|j| {
                (0..3).map(move |n| Allocation {
                    id: format!("alloc-{j}-{n}"),
                    namespace: "default".into(),
                    job_id: format!("job-{j}"),
                    node_id: format!("node-{}", (j + n) % 100),
                    ..Allocation::default()
                })
            })
            .collect();
        apply(&mut state, Command::AllocUpsert { allocs });
        let evals: Vec<Evaluation> = chunk
            .iter()
            .flat_map(|j| {
                (0..2).map(move |n| Evaluation {
                    id: format!("eval-{j}-{n}"),
                    namespace: "default".into(),
                    job_id: format!("job-{j}"),
                    ..Evaluation::default()
                })
            })
            .collect();
        apply(&mut state, Command::EvalUpsert { evals });
    }
    println!(
        "state: {jobs} jobs, {} allocations, {} evaluations",
        state.allocs().count(),
        state.evals().count()
    );
    let time = |label: &str, list: &dyn Fn() -> usize| {
        let started = Instant::now();
        let seen = list();
        let elapsed = started.elapsed();
        println!(
            "{label:<52} {:>10.2} ms  ({seen} rows read)",
            elapsed.as_secs_f64() * 1000.0
        );
        elapsed
    };
    // The scan is quadratic: measure it on a tenth of the jobs and scale.
    let sample = (jobs / 10).max(1);
    let scan = time(&format!("baseline: scan per job, first {sample} jobs"), &|| {
        state
            .jobs()
            .take(sample)
            .map(|job| {
                state
                    .allocs()
                    .filter(|a| a.namespace == job.namespace && a.job_id == job.id)
                    .count()
                    + state
                        .evals()
                        .filter(|e| e.namespace == job.namespace && e.job_id == job.id)
                        .count()
            })
            .sum()
    });
    let indexed = time("indexed, every job", &|| {
        state
            .jobs()
            .map(|job| {
                state.job_allocs(&job.namespace, &job.id).count() + state.job_evals(&job.namespace, &job.id).count()
            })
            .sum()
    });
    let scan_all = scan.as_secs_f64() * (jobs as f64 / sample as f64);
    println!(
        "every job: scan ~{:.0} ms (scaled) against indexed {:.2} ms = {:.4}x the scan",
        scan_all * 1000.0,
        indexed.as_secs_f64() * 1000.0,
        indexed.as_secs_f64() / scan_all
    );
}
