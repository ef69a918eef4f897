//! Scheduler figures. Prints; asserts nothing.
//!
//!   cargo bench -p drover --bench scheduler
//!
//! The scheduler is a pure function of the state store and one evaluation, so it is measured
//! directly: a service job of 1, 100, 1,000 and 10,000 allocations placed across 100 or 1,000
//! nodes (drivers, resources and bin-packing checked on every node for every placement).
//! Figures: time per evaluation, placements per second, and the time per placement as a
//! ratio against the single-allocation job measured in the same run.

use std::time::{Duration, Instant};

use drover_core::fsm::{Command, Entry, ServerState};
use drover_core::scheduler::schedule;
use drover_core::structs::{EvalStatus, Evaluation, Job, JobType, NetworkResource, Port};

fn state_with_nodes(nodes: usize) -> ServerState {
    let mut state = ServerState::default();
    for i in 0..nodes {
        let node = drover_core::testkit::node(&format!("node-{i:05}"))
            .with_cpu(64_000)
            .with_memory(256_000);
        state.apply(
            i as u64 + 1,
            &Entry {
                at_unix_ms: 0,
                command: Command::NodeRegister { node },
            },
        );
    }
    state
}

fn job(count: u32, ports: bool) -> Job {
    let networks = if ports {
        vec![NetworkResource {
            dynamic_ports: vec![Port {
                label: "http".into(),
                ..Port::default()
            }],
            ..NetworkResource::default()
        }]
    } else {
        Vec::new()
    };
    let mut job = drover_core::testkit::job("web", JobType::Service)
        .with_count(count)
        .with_memory(128);
    job.task_groups[0].networks = networks;
    job
}

/// Registers the job and times one evaluation (best of `rounds`).
fn measure(nodes: usize, count: u32, rounds: usize, ports: bool) -> (Duration, usize) {
    let mut state = state_with_nodes(nodes);
    let eval = Evaluation {
        id: "e1".into(),
        namespace: "default".into(),
        job_id: "web".into(),
        status: EvalStatus::Pending,
        ..Evaluation::default()
    };
    let index = state.last_applied().unwrap_or(0) + 1;
    state.apply(
        index,
        &Entry {
            at_unix_ms: 0,
            command: Command::JobRegister {
                job: job(count, ports),
                eval: Some(eval.clone()),
                enforce_index: None,
            },
        },
    );
    let mut best = Duration::MAX;
    let mut placed = 0;
    for _ in 0..rounds {
        let mut next = 0u64;
        let started = Instant::now();
        let plan = schedule(&state, &eval, &mut || {
            next += 1;
            format!("alloc-{next}")
        });
        best = best.min(started.elapsed());
        placed = plan.allocs.len();
    }
    (best, placed)
}

fn main() {
    let (baseline, _) = measure(100, 1, 20, false);
    let per_baseline = baseline.as_secs_f64();
    println!("scheduler: one evaluation of a service job (best of several rounds)");
    println!(
        "{:>7} {:>7} {:>12} {:>16} {:>22} {:>24}",
        "nodes", "allocs", "eval ms", "placements/s", "per placement vs 1", "with a dynamic port vs"
    );
    for (nodes, count, rounds) in [(100, 1, 20), (100, 100, 10), (1000, 1000, 3), (1000, 10_000, 1)] {
        let (time, placed) = measure(nodes, count, rounds, false);
        let (with_port, _) = measure(nodes, count, rounds, true);
        let per_placement = time.as_secs_f64() / placed.max(1) as f64;
        println!(
            "{:>7} {:>7} {:>12.3} {:>16.0} {:>21.2}x {:>23.2}x",
            nodes,
            placed,
            time.as_secs_f64() * 1000.0,
            placed as f64 / time.as_secs_f64(),
            per_placement / per_baseline,
            with_port.as_secs_f64() / time.as_secs_f64()
        );
    }
}
