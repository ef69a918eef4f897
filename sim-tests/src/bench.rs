//! Job register → every allocation running, across simulated clients (`--bench-jobs`).
//!
//! Three servers and N client nodes in the simulation (real agents: openraft, the core, the
//! scheduler); the clients run the production client driver on simulated hosts (alloc sync
//! by blocking query, tasks started, running reported). For each size it prints the simulated time from `Job.Register` to the last
//! allocation reported running (the protocol's latency: Raft commits, the worker's plans,
//! the clients' syncs), and the wall time of the whole run against a baseline run of the same
//! cluster whose job has no allocations (best of three each) — their difference is what
//! placing and running the allocations cost this machine.
//!
//!   cargo test -p sim-tests -- --bench-jobs

use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::structs::ClientStatus;
use drover_io_sim::cluster::SimCluster;
use drover_io_sim::consul::SimConsul;
use drover_io_sim::trace::Recorder;

use crate::real_clients::{self, RealClientPlan};
use crate::runner::{real_client_spec, wait_for_leader};
use crate::scenarios;

/// One simulated run: returns the simulated register → all running time (None if it never
/// got there within ten simulated minutes).
fn run(allocs: u32, clients: usize, seed: u64) -> Option<Duration> {
    let result: Arc<Mutex<Option<Duration>>> = Arc::new(Mutex::new(None));
    let out = result.clone();
    std::thread::spawn(move || {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
        runtime.block_on(async move {
            let recorder = Recorder::new();
            let mut cluster = SimCluster::new(recorder, SimConsul::default());
            for spec in scenarios::bench_servers() {
                cluster.add_server(spec);
            }
            let servers = scenarios::bench_servers();
            for index in 0..clients {
                cluster.add_client(real_client_spec(&servers, index));
            }
            wait_for_leader(&cluster, Duration::from_secs(60)).await;
            let plan = RealClientPlan::one_job(clients, allocs, None);
            let registered = tokio::time::Instant::now();
            if real_clients::register(&cluster, &plan).await.is_err() {
                return;
            }
            while registered.elapsed() < Duration::from_secs(600) {
                let running = cluster.gateways().iter().find_map(|gateway| {
                    gateway.read_state(|state| {
                        state
                            .allocs()
                            .filter(|alloc| alloc.job_id == "web" && alloc.client_status == ClientStatus::Running)
                            .count()
                    })
                });
                if running.is_some_and(|running| running >= allocs as usize) {
                    *out.lock().expect("result lock") = Some(registered.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            cluster.shutdown().await;
        });
    })
    .join()
    .expect("bench run");
    let guard = result.lock().expect("result lock");
    *guard
}

pub fn jobs_bench() -> bool {
    println!("jobs: register -> every allocation running, 3 servers, production clients on simulated hosts");
    println!("  allocs  clients  simulated s  wall s (run)  wall s (baseline)  wall per alloc ms");
    let mut ok = true;
    for (allocs, clients) in [(1u32, 10usize), (100, 50), (1_000, 100)] {
        // Best of three of each, interleaved, so warm-up favours neither.
        let (mut baseline, mut simulated) = (None, None);
        let (mut baseline_wall, mut run_wall) = (Duration::MAX, Duration::MAX);
        for _ in 0..3 {
            let wall = std::time::Instant::now();
            baseline = run(0, clients, 7);
            baseline_wall = baseline_wall.min(wall.elapsed());
            let wall = std::time::Instant::now();
            simulated = run(allocs, clients, 7);
            run_wall = run_wall.min(wall.elapsed());
        }
        match (simulated, baseline) {
            (Some(simulated), Some(_)) => {
                let per_alloc = run_wall.saturating_sub(baseline_wall).as_secs_f64() * 1_000.0 / f64::from(allocs);
                println!(
                    "  {allocs:>6}  {clients:>7}  {:>11.3}  {:>12.2}  {:>17.2}  {per_alloc:>17.2}",
                    simulated.as_secs_f64(),
                    run_wall.as_secs_f64(),
                    baseline_wall.as_secs_f64()
                );
            }
            _ => {
                println!("  {allocs:>6}  {clients:>7}  did not finish within 600 simulated s");
                ok = false;
            }
        }
    }
    ok
}

/// One idle cluster: three servers and `clients` production clients, `secs` simulated seconds
/// after the first leader. Returns the wall time of the whole run (madsim's clock is virtual
/// inside the runtime, so it is read outside).
fn idle(clients: usize, secs: u64, seed: u64) -> Duration {
    std::thread::spawn(move || {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
        let wall = std::time::Instant::now();
        runtime.block_on(async move {
            let mut cluster = SimCluster::new(Recorder::new(), SimConsul::default());
            let servers = scenarios::bench_servers();
            for spec in scenarios::bench_servers() {
                cluster.add_server(spec);
            }
            for index in 0..clients {
                cluster.add_client(real_client_spec(&servers, index));
            }
            wait_for_leader(&cluster, Duration::from_secs(60)).await;
            tokio::time::sleep(Duration::from_secs(secs)).await;
            cluster.shutdown().await;
        });
        wall.elapsed()
    })
    .join()
    .expect("bench run")
}

/// What a simulated second of an idle cluster costs (`--bench-idle`): the floor under every
/// scenario's run time, paid for heartbeats, gossip and timers. Each figure is a 60 s run less
/// the same run cut at the first leader, best of three seeds each.
pub fn idle_bench() {
    println!("idle: wall ms per simulated second of an idle cluster, 3 servers (best of three)");
    println!("  clients  ms per simulated s");
    let only: Option<usize> = std::env::var("DROVER_IDLE_CLIENTS")
        .ok()
        .and_then(|value| value.parse().ok());
    for clients in [0usize, 2, 10]
        .into_iter()
        .filter(|clients| only.is_none_or(|only| only == *clients))
    {
        let best = |secs| (0..3).map(|seed| idle(clients, secs, seed)).min().unwrap_or_default();
        let (long, short) = (best(60), best(0));
        println!(
            "  {clients:>7}  {:>18.2}",
            long.saturating_sub(short).as_secs_f64() * 1_000.0 / 60.0
        );
    }
}
