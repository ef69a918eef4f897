//! The scheduler against hand-built states: placement and bin-packing, updates, lost nodes,
//! system jobs, the feasibility checks with Nomad's filter reasons, blocked evaluations.

use super::*;
use crate::fsm::Command;
use crate::fsm::csi::tests::{Fixture, volume};
use crate::structs::{
    AccessMode, AttachmentMode, ClaimMode, ClaimState, ClientStatus, CsiInfo, CsiNodeInfo, CsiVolumeClaim, EvalStatus,
    VolumeRequest,
};
use alloc::collections::BTreeSet;

mod dry_run;
mod rollout;

/// A ready `exec` node with `cpu` MHz and 4,096 MB.
fn node(id: &str, cpu: u64) -> Node {
    crate::testkit::node(id).with_cpu(cpu)
}

/// One group `g` of `count` allocations of task `t` on `exec`, each asking `cpu` MHz and 100 MB.
fn job(id: &str, job_type: JobType, count: u32, cpu: u32) -> Job {
    crate::testkit::job(id, job_type).with_count(count).with_cpu(cpu)
}

struct World {
    fx: Fixture,
    next: u64,
}

impl World {
    fn new(nodes: &[Node]) -> World {
        let mut fx = Fixture::new();
        for node in nodes {
            fx.ok(Command::NodeRegister { node: node.clone() });
        }
        World { fx, next: 0 }
    }

    fn eval(&mut self, job_id: &str) -> Evaluation {
        self.next += 1;
        Evaluation {
            id: format!("e{}", self.next),
            namespace: "default".into(),
            job_id: job_id.into(),
            status: EvalStatus::Pending,
            ..Evaluation::default()
        }
    }

    fn register(&mut self, job: &Job) -> Evaluation {
        let eval = self.eval(&job.id);
        self.fx.ok(Command::JobRegister {
            job: job.clone(),
            eval: Some(eval.clone()),
            enforce_index: None,
        });
        eval
    }

    /// Schedules `eval` and applies the plan.
    fn run(&mut self, eval: &Evaluation) -> Plan {
        let mut counter = 0;
        let prefix = eval.id.clone();
        let plan = schedule(&self.fx.state, eval, &mut || {
            counter += 1;
            format!("{prefix}-{counter}")
        });
        self.fx.ok(Command::PlanApply {
            allocs: plan.allocs.clone(),
            evals: plan.evals.clone(),
            deployment: plan.deployment.clone(),
            deployment_updates: plan.deployment_updates.clone(),
        });
        plan
    }

    /// Stores the evaluations `worker` proposed and returns the allocations of the plan it
    /// proposes next.
    fn plan_after(
        &mut self,
        worker: &mut worker::Worker,
        now: crate::time::Instant,
        evals: Vec<Evaluation>,
    ) -> Vec<Allocation> {
        self.fx.ok(Command::EvalUpsert { evals });
        worker.proposed();
        let Some(Command::PlanApply { allocs, .. }) = worker.run(now, &self.fx.state) else {
            panic!("the plan")
        };
        allocs
    }

    fn live(&self, job_id: &str) -> Vec<(String, String)> {
        self.fx
            .state
            .allocs()
            .filter(|alloc| alloc.job_id == job_id && !alloc.terminal())
            .map(|alloc| (alloc.name.clone(), alloc.node_id.clone()))
            .collect()
    }

    /// Cluster time moves on `secs` (an entry applied that much later).
    fn advance(&mut self, secs: u64) {
        self.fx.index += secs;
        self.fx.ok(Command::EvalUpsert { evals: Vec::new() });
    }

    fn set_client_status(&mut self, alloc_id: &str, status: ClientStatus) {
        self.fx.ok(Command::AllocClientUpdate {
            alloc_id: alloc_id.into(),
            client_status: status,
        });
    }
}

#[test]
fn a_service_job_gets_its_count_bin_packed_onto_the_fullest_node() {
    let mut world = World::new(&[node("n1", 4000), node("n2", 4000)]);
    // Something already runs on n2: bin-packing prefers it.
    let filler = job("filler", JobType::Service, 1, 1000);
    let mut filler_with_node = filler.clone();
    filler_with_node.datacenters = vec!["dc1".into()];
    let eval = world.register(&filler_with_node);
    world.run(&eval);
    let filler_node = world.live("filler")[0].1.clone();
    let web = job("web", JobType::Service, 3, 500);
    let eval = world.register(&web);
    let plan = world.run(&eval);
    assert_eq!(plan.allocs.len(), 3);
    let live = world.live("web");
    assert_eq!(
        live.iter().map(|(name, _)| name.as_str()).collect::<BTreeSet<_>>(),
        BTreeSet::from(["web.g[0]", "web.g[1]", "web.g[2]"])
    );
    assert!(
        live.iter().all(|(_, node)| *node == filler_node),
        "packed onto {filler_node}: {live:?}"
    );
    assert_eq!(plan.evals[0].status, EvalStatus::Complete);
    // Scheduling again changes nothing.
    let again = world.eval("web");
    assert!(world.run(&again).allocs.is_empty());
}

#[test]
fn an_update_replaces_every_allocation_and_hands_over_to_the_old_one() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = job("web", JobType::Service, 2, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let before: BTreeMap<String, String> = world
        .fx
        .state
        .allocs()
        .map(|alloc| (alloc.name.clone(), alloc.id.clone()))
        .collect();
    web.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    let eval = world.register(&web);
    assert_eq!(world.fx.state.job("default", "web").unwrap().version, 1);
    let plan = world.run(&eval);
    let stopped: Vec<&Allocation> = plan
        .allocs
        .iter()
        .filter(|a| a.desired_status == DesiredStatus::Stop)
        .collect();
    assert_eq!(stopped.len(), 2);
    assert!(stopped.iter().all(|a| a.desired_description == ALLOC_UPDATING));
    for placed in plan.allocs.iter().filter(|a| a.desired_status == DesiredStatus::Run) {
        assert_eq!(placed.job_version, 1);
        assert_eq!(placed.previous_allocation.as_ref(), before.get(&placed.name));
    }
    // The same spec again is not a new version and moves nothing.
    let eval = world.register(&web);
    assert_eq!(world.fx.state.job("default", "web").unwrap().version, 1);
    assert!(world.run(&eval).allocs.is_empty());
}

#[test]
fn a_plan_computed_before_a_client_report_keeps_the_reported_status() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = job("web", JobType::Service, 1, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let first = world.fx.state.allocs().next().unwrap().id.clone();
    // An update is scheduled while the allocation still reads pending...
    web.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    let eval = world.register(&web);
    let prefix = eval.id.clone();
    let mut counter = 0;
    let plan = schedule(&world.fx.state, &eval, &mut || {
        counter += 1;
        format!("{prefix}-{counter}")
    });
    let stale = plan.allocs.iter().find(|a| a.id == first).unwrap();
    assert_eq!(
        (stale.desired_status, stale.client_status),
        (DesiredStatus::Stop, ClientStatus::Pending)
    );
    // ...its client reports it failed before the plan is applied: the report stands.
    world.set_client_status(&first, ClientStatus::Failed);
    world.fx.ok(Command::PlanApply {
        allocs: plan.allocs.clone(),
        evals: plan.evals.clone(),
        deployment: None,
        deployment_updates: Vec::new(),
    });
    let alloc = world.fx.state.alloc(&first).unwrap();
    assert_eq!(
        (alloc.desired_status, alloc.client_status),
        (DesiredStatus::Stop, ClientStatus::Failed)
    );
    // A plan that marks an allocation lost does override what its client said last.
    let mut lost = alloc.clone();
    lost.client_status = ClientStatus::Lost;
    world.fx.ok(Command::PlanApply {
        allocs: vec![lost],
        evals: Vec::new(),
        deployment: None,
        deployment_updates: Vec::new(),
    });
    assert_eq!(world.fx.state.alloc(&first).unwrap().client_status, ClientStatus::Lost);
}

/// `web` placed on n1, then n2 joins and n1 goes down: the world and the first allocation.
fn placed_then_node_down(web: &Job) -> (World, String) {
    let mut world = World::new(&[node("n1", 4000)]);
    let eval = world.register(web);
    world.run(&eval);
    let first = world.fx.state.allocs().next().unwrap().id.clone();
    world.fx.ok(Command::NodeRegister { node: node("n2", 4000) });
    world.fx.ok(Command::NodeUpdateStatus {
        node_id: "n1".into(),
        status: NodeStatus::Down,
        event: None,
    });
    (world, first)
}

#[test]
fn allocations_on_a_down_node_are_lost_and_replaced_elsewhere() {
    let (mut world, first) = placed_then_node_down(&job("web", JobType::Service, 1, 100));
    let eval = world.eval("web");
    let plan = world.run(&eval);
    let lost = plan.allocs.iter().find(|a| a.id == first).unwrap();
    assert_eq!(
        (
            lost.desired_status,
            lost.client_status,
            lost.desired_description.as_str()
        ),
        (DesiredStatus::Stop, ClientStatus::Lost, ALLOC_LOST)
    );
    assert_eq!(world.live("web"), [("web.g[0]".to_string(), "n2".to_string())]);
}

/// `stop_after_client_disconnect`: an allocation on a node found down is marked lost at once,
/// but its replacement waits until its client, out of touch, has surely stopped it — that
/// long after it was found lost — through a follow-up evaluation; then it is replaced.
#[test]
fn a_lost_allocation_is_replaced_only_after_its_client_stopped_it() {
    let mut web = job("web", JobType::Service, 1, 100);
    web.task_groups[0].stop_after_client_disconnect = Some(core::time::Duration::from_secs(5));
    let (mut world, first) = placed_then_node_down(&web);
    let eval = world.eval("web");
    let plan = world.run(&eval);
    let lost = plan.allocs.iter().find(|a| a.id == first).unwrap();
    assert_eq!(
        (lost.desired_status, lost.client_status),
        (DesiredStatus::Stop, ClientStatus::Lost)
    );
    assert!(
        world.live("web").is_empty(),
        "nothing placed yet: {:?}",
        world.live("web")
    );
    let follow_up = plan
        .evals
        .iter()
        .find(|e| e.triggered_by == crate::structs::EvalTrigger::AllocFailure)
        .expect("a follow-up evaluation");
    assert_eq!(follow_up.wait_ms, 5_000);
    // Two seconds on (two entries), another evaluation still waits, for what is left.
    world.fx.ok(Command::NodeRegister { node: node("n3", 4000) });
    world.fx.ok(Command::NodeRegister { node: node("n4", 4000) });
    let eval = world.eval("web");
    let plan = world.run(&eval);
    assert!(world.live("web").is_empty());
    let waits: Vec<u64> = plan.evals.iter().map(|e| e.wait_ms).filter(|w| *w > 0).collect();
    assert!(matches!(waits[..], [w] if w < 5_000), "{waits:?}");
    // Past the wait: replaced, as the lost allocation's replacement.
    for name in ["n5", "n6", "n7", "n8"] {
        world.fx.ok(Command::NodeRegister { node: node(name, 4000) });
    }
    let eval = world.eval("web");
    let plan = world.run(&eval);
    let placed = plan.allocs.iter().find(|a| a.id != first).expect("a replacement");
    assert_eq!(placed.previous_allocation.as_deref(), Some(first.as_str()));
    assert_eq!(world.live("web").len(), 1);
}

#[test]
fn a_stopped_allocation_still_running_on_a_node_that_goes_down_is_lost() {
    let mut world = World::new(&[node("n1", 4000), node("n2", 4000)]);
    let web = job("web", JobType::Service, 1, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let old = world.fx.state.allocs().next().unwrap().clone();
    // Stopped by an update while its client still runs it...
    let mut stopping = old.clone();
    stopping.desired_status = DesiredStatus::Stop;
    stopping.client_status = ClientStatus::Running;
    world.fx.ok(Command::AllocUpsert { allocs: vec![stopping] });
    // ...when its node goes down: nobody will report it finished.
    world.fx.ok(Command::NodeUpdateStatus {
        node_id: old.node_id.clone(),
        status: NodeStatus::Down,
        event: None,
    });
    let eval = world.eval("web");
    let plan = world.run(&eval);
    let lost = plan.allocs.iter().find(|a| a.id == old.id).expect("in the plan");
    assert_eq!(
        (lost.desired_status, lost.client_status),
        (DesiredStatus::Stop, ClientStatus::Lost)
    );
}

#[test]
fn batch_allocations_that_completed_stay_done_and_failed_ones_are_replaced() {
    let mut world = World::new(&[node("n1", 4000)]);
    let batch = job("report", JobType::Batch, 2, 100);
    let eval = world.register(&batch);
    world.run(&eval);
    let ids: Vec<(String, String)> = world
        .fx
        .state
        .allocs()
        .map(|alloc| (alloc.name.clone(), alloc.id.clone()))
        .collect();
    let find = |name: &str| ids.iter().find(|(n, _)| n == name).unwrap().1.clone();
    world.set_client_status(&find("report.g[0]"), ClientStatus::Complete);
    world.set_client_status(&find("report.g[1]"), ClientStatus::Failed);
    // The worker's evaluation for the failure, once its delay has passed.
    let mut eval = world.eval("report");
    eval.triggered_by = crate::structs::EvalTrigger::AllocFailure;
    let plan = world.run(&eval);
    let placed: Vec<&Allocation> = plan
        .allocs
        .iter()
        .filter(|a| a.desired_status == DesiredStatus::Run)
        .collect();
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].name, "report.g[1]");
    assert_eq!(
        placed[0].previous_allocation.as_deref(),
        Some(find("report.g[1]").as_str())
    );
}

#[test]
fn a_drain_migrates_service_allocations_away_and_stops_system_ones_without_replacing_them() {
    let mut world = World::new(&[node("n1", 4000)]);
    let web = job("web", JobType::Service, 1, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let agent = job("agent", JobType::System, 1, 100);
    let eval = world.register(&agent);
    world.run(&eval);
    world.fx.ok(Command::NodeRegister { node: node("n2", 4000) });
    let eval = world.eval("agent");
    world.run(&eval);
    world.fx.ok(Command::NodeUpdateDrain {
        node_id: "n1".into(),
        strategy: Some(crate::structs::DrainStrategy::default()),
        mark_eligible: false,
        complete: false,
    });
    // Ineligible alone moves nothing: a system allocation stays, no update reaches it.
    let eval = world.eval("agent");
    let plan = world.run(&eval);
    assert!(plan.allocs.is_empty(), "{plan:?}");
    let on_n1: BTreeMap<String, String> = world
        .fx
        .state
        .allocs()
        .filter(|alloc| alloc.node_id == "n1")
        .map(|alloc| (alloc.job_id.clone(), alloc.id.clone()))
        .collect();
    world.fx.ok(Command::AllocUpdateDesiredTransition {
        transitions: on_n1
            .values()
            .map(|id| (id.clone(), crate::structs::DesiredTransition { migrate: true }))
            .collect(),
        evals: Vec::new(),
    });
    let eval = world.eval("web");
    let plan = world.run(&eval);
    let old = plan.allocs.iter().find(|alloc| alloc.id == on_n1["web"]).unwrap();
    assert_eq!(
        (old.desired_status, old.desired_description.as_str()),
        (DesiredStatus::Stop, ALLOC_MIGRATING)
    );
    let new = plan.placed().next().unwrap();
    assert_eq!(new.node_id, "n2", "never the draining node");
    assert_eq!(new.previous_allocation.as_deref(), Some(on_n1["web"].as_str()));
    let eval = world.eval("agent");
    let plan = world.run(&eval);
    assert_eq!(plan.allocs.len(), 1, "stopped, not replaced: {plan:?}");
    assert_eq!(plan.allocs[0].desired_description, ALLOC_MIGRATING);
    let mut live: Vec<(String, String)> = world.live("agent");
    live.sort();
    assert_eq!(live, [("agent.g[0]".to_string(), "n2".to_string())]);
}

#[test]
fn a_system_job_runs_once_on_every_feasible_node_and_follows_a_late_node() {
    let mut no_exec = node("n3", 4000);
    no_exec.drivers.clear();
    let mut world = World::new(&[node("n1", 4000), node("n2", 4000), no_exec]);
    let plugin = job("plugin", JobType::System, 1, 100);
    let eval = world.register(&plugin);
    let plan = world.run(&eval);
    let mut nodes: Vec<String> = world.live("plugin").into_iter().map(|(_, node)| node).collect();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2"]);
    // n3 lacks the driver: recorded as a filter reason, but nothing is blocked for it.
    assert_eq!(
        plan.evals[0].failed_tg_allocs["g"].constraint_filtered["missing drivers"],
        1
    );
    world.fx.ok(Command::NodeRegister { node: node("n4", 4000) });
    let eval = world.eval("plugin");
    let plan = world.run(&eval);
    assert_eq!(plan.allocs.len(), 1);
    assert_eq!(plan.allocs[0].node_id, "n4");
}

/// `ephemeral_disk { size }` counts against the node's disk: two of 600 MB do not fit on a
/// node with 1000 MB, and the one that does not is refused for "disk".
#[test]
fn ephemeral_disk_counts_against_the_nodes_disk() {
    let mut small = node("n1", 4000);
    small.resources.disk_mb = 1000;
    let mut world = World::new(&[small]);
    let mut web = job("web", JobType::Service, 2, 100);
    web.task_groups[0].ephemeral_disk = Some(crate::structs::EphemeralDisk {
        size_mb: 600,
        ..Default::default()
    });
    let eval = world.register(&web);
    let plan = world.run(&eval);
    assert_eq!(plan.allocs.len(), 1);
    assert_eq!(plan.allocs[0].resources.disk_mb, 600);
    let metric = &plan.evals[0].failed_tg_allocs["g"];
    assert_eq!(metric.dimension_exhausted["disk"], 1);
}

#[test]
fn reserved_cores_are_never_shared_and_count_as_their_mhz() {
    // 4 cores of 1,000 MHz; something already uses 1,500 MHz without cores.
    let mut four = node("n1", 4_000);
    four.attributes.insert("cpu.numcores".into(), "4".into());
    let mut world = World::new(&[four]);
    let eval = world.register(&job("filler", JobType::Service, 1, 1_500));
    world.run(&eval);
    let mut pinned = job("pinned", JobType::Service, 3, 0);
    pinned.task_groups[0].tasks[0].resources.cores = 1;
    let eval = world.register(&pinned);
    let plan = world.run(&eval);
    // 1,500 + 2 x 1,000 fits in 4,000 MHz; a third core would not.
    let placed: Vec<&Allocation> = plan.allocs.iter().filter(|alloc| !alloc.terminal()).collect();
    assert_eq!(placed.len(), 2, "{:?}", plan.allocs);
    let mut taken = BTreeSet::new();
    for alloc in &placed {
        assert_eq!(alloc.resources.cpu, 1_000);
        let cores = &alloc.resources.task_cores["t"];
        assert_eq!(cores.len(), 1);
        assert!(taken.insert(cores[0]), "core {} given twice", cores[0]);
    }
    assert_eq!(taken, BTreeSet::from([0, 1]));
    assert_eq!(plan.evals[0].failed_tg_allocs["g"].dimension_exhausted["cpu"], 1);

    // A bigger ask than the free cores is refused as "cores", whatever the MHz left.
    let mut eight = node("n2", 64_000);
    eight.attributes.insert("cpu.numcores".into(), "2".into());
    let mut world = World::new(&[eight]);
    let mut wide = job("wide", JobType::Service, 1, 0);
    wide.task_groups[0].tasks[0].resources.cores = 3;
    let eval = world.register(&wide);
    let plan = world.run(&eval);
    assert!(plan.allocs.is_empty());
    assert_eq!(plan.evals[0].failed_tg_allocs["g"].dimension_exhausted["cores"], 1);

    // A stopped allocation's cores go to the next one.
    let mut world = World::new(&[{
        let mut two = node("n3", 4_000);
        two.attributes.insert("cpu.numcores".into(), "2".into());
        two
    }]);
    let mut both = job("both", JobType::Service, 1, 0);
    both.task_groups[0].tasks[0].resources.cores = 2;
    let eval = world.register(&both);
    let first = world.run(&eval).allocs[0].clone();
    assert_eq!(first.resources.task_cores["t"], [0, 1]);
    let mut again = both.clone();
    again.meta.insert("v".into(), "2".into());
    let eval = world.register(&again);
    let plan = world.run(&eval);
    let replacement = plan
        .allocs
        .iter()
        .find(|alloc| !alloc.terminal())
        .expect("a replacement");
    assert_eq!(replacement.resources.task_cores["t"], [0, 1]);
}

#[test]
fn an_unplaceable_group_records_why_and_blocks() {
    let mut world = World::new(&[node("n1", 1000)]);
    let big = job("big", JobType::Service, 1, 5000);
    let eval = world.register(&big);
    let plan = world.run(&eval);
    assert!(plan.allocs.is_empty());
    let processed = &plan.evals[0];
    assert_eq!(processed.status, EvalStatus::Complete);
    assert_eq!(processed.queued_allocations["g"], 1);
    let metric = &processed.failed_tg_allocs["g"];
    assert_eq!((metric.nodes_evaluated, metric.nodes_exhausted), (1, 1));
    assert_eq!(metric.dimension_exhausted["cpu"], 1);
    let blocked = &plan.evals[1];
    assert_eq!(
        (blocked.status, blocked.triggered_by.as_str()),
        (EvalStatus::Blocked, "queued-allocs")
    );
    assert_eq!(processed.blocked_eval, blocked.id);
    // Retried once a bigger node joins: it places, and the blocked evaluation completes.
    world.fx.ok(Command::NodeRegister { node: node("n2", 8000) });
    let mut retry = world.fx.state.eval(&blocked.id).unwrap().clone();
    retry.status = EvalStatus::Pending;
    let plan = world.run(&retry);
    assert_eq!(plan.allocs.len(), 1);
    assert_eq!(plan.allocs[0].node_id, "n2");
    assert_eq!(plan.evals[0].status, EvalStatus::Complete);
}

fn csi_node(id: &str, healthy: bool, max_volumes: u64) -> Node {
    let mut node = node(id, 4000);
    node.csi_node_plugins.insert(
        "p".into(),
        CsiInfo {
            plugin_id: "p".into(),
            healthy,
            node_info: Some(CsiNodeInfo {
                id: id.into(),
                max_volumes,
                ..CsiNodeInfo::default()
            }),
            ..CsiInfo::default()
        },
    );
    node
}

fn csi_job(id: &str, source: &str, read_only: bool) -> Job {
    let mut job = job(id, JobType::Service, 1, 100);
    job.task_groups[0].volumes.insert(
        "data".into(),
        VolumeRequest {
            name: "data".into(),
            volume_type: VolumeType::Csi,
            source: source.into(),
            read_only,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            ..VolumeRequest::default()
        },
    );
    job
}

fn reasons(plan: &Plan) -> BTreeMap<String, u32> {
    plan.evals[0]
        .failed_tg_allocs
        .get("g")
        .map(|metric| metric.constraint_filtered.clone())
        .unwrap_or_default()
}

#[test]
fn csi_feasibility_uses_nomads_filter_reasons() {
    // The plugin exists (it was healthy once) but is unhealthy on n1 now.
    let mut world = World::new(&[csi_node("n1", true, 0), node("n2", 4000)]);
    world.fx.ok(Command::NodeRegister {
        node: csi_node("n1", false, 0),
    });
    // No such volume.
    let eval = world.register(&csi_job("a", "vol0", false));
    let plan = world.run(&eval);
    assert_eq!(
        reasons(&plan),
        BTreeMap::from([("missing CSI volume(s) vol0".to_string(), 2)])
    );

    world.fx.ok(Command::CsiVolumeRegister {
        volumes: vec![volume("vol0")],
    });
    let eval = world.eval("a");
    let plan = world.run(&eval);
    assert_eq!(
        reasons(&plan),
        BTreeMap::from([
            ("CSI plugin p is missing from client n2".to_string(), 1),
            ("CSI plugin p is unhealthy on client n1".to_string(), 1),
        ])
    );

    // Healthy, but at its maximum number of volumes: another job's allocation holds vol9.
    world.fx.ok(Command::NodeRegister {
        node: csi_node("n1", true, 1),
    });
    world.fx.ok(Command::CsiVolumeRegister {
        volumes: vec![volume("vol9")],
    });
    world.fx.ok(Command::AllocUpsert {
        allocs: vec![Allocation {
            id: "x1".into(),
            namespace: "default".into(),
            node_id: "n1".into(),
            job_id: "other".into(),
            task_group: "g".into(),
            ..Allocation::default()
        }],
    });
    world.fx.ok(Command::CsiVolumeClaim {
        namespace: "default".into(),
        volume_id: "vol9".into(),
        claim: CsiVolumeClaim {
            allocation_id: "x1".into(),
            node_id: "n1".into(),
            external_node_id: String::new(),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            state: ClaimState::Taken,
        },
    });
    let eval = world.eval("a");
    let plan = world.run(&eval);
    assert_eq!(
        reasons(&plan)
            .get("CSI plugin p has the maximum number of volumes on client n1")
            .copied(),
        Some(1),
        "{:?}",
        reasons(&plan)
    );

    // Room again: placed on n1.
    world.fx.ok(Command::NodeRegister {
        node: csi_node("n1", true, 0),
    });
    let eval = world.eval("a");
    let plan = world.run(&eval);
    assert_eq!(plan.allocs.len(), 1, "{:?}", reasons(&plan));
    assert_eq!(plan.allocs[0].node_id, "n1");
}

#[test]
fn a_volume_is_placed_only_inside_its_accessible_topology() {
    let zoned = |id: &str, zone: &str| {
        let mut node = csi_node(id, true, 0);
        let info = node.csi_node_plugins.get_mut("p").unwrap().node_info.as_mut().unwrap();
        info.accessible_topology = Some(crate::structs::CsiTopology {
            segments: [("zone".to_string(), zone.to_string())].into(),
        });
        node
    };
    // n3's plugin reports no topology at all: it cannot reach a zonal volume either.
    let mut world = World::new(&[zoned("n1", "a"), zoned("n2", "b"), csi_node("n3", true, 0)]);
    let mut vol = volume("vol0");
    vol.topologies = vec![crate::structs::CsiTopology {
        segments: [("zone".to_string(), "b".to_string())].into(),
    }];
    world.fx.ok(Command::CsiVolumeRegister { volumes: vec![vol] });
    let eval = world.register(&csi_job("a", "vol0", false));
    let plan = world.run(&eval);
    assert_eq!(plan.allocs.len(), 1, "{:?}", reasons(&plan));
    assert_eq!(plan.allocs[0].node_id, "n2");

    // Its zone's node moves away: nowhere to go, with Nomad's reason for every node.
    world.fx.ok(Command::AllocDelete {
        alloc_ids: vec![plan.allocs[0].id.clone()],
    });
    world.fx.ok(Command::NodeRegister { node: zoned("n2", "c") });
    let eval = world.eval("a");
    let plan = world.run(&eval);
    assert!(
        plan.allocs
            .iter()
            .all(|alloc| alloc.desired_status != DesiredStatus::Run)
    );
    assert_eq!(
        reasons(&plan),
        BTreeMap::from([("did not meet topology requirement".to_string(), 3)])
    );
}

#[test]
fn a_claimed_single_writer_volume_blocks_other_jobs_but_not_the_same_job() {
    let mut world = World::new(&[csi_node("n1", true, 0)]);
    let mut vol = volume("vol0");
    vol.access_mode = AccessMode::SingleNodeWriter;
    world.fx.ok(Command::CsiVolumeRegister { volumes: vec![vol] });
    let writer = csi_job("writer", "vol0", false);
    let eval = world.register(&writer);
    world.run(&eval);
    let holder = world.fx.state.allocs().next().unwrap().clone();
    world.fx.ok(Command::CsiVolumeClaim {
        namespace: "default".into(),
        volume_id: "vol0".into(),
        claim: CsiVolumeClaim {
            allocation_id: holder.id.clone(),
            node_id: "n1".into(),
            external_node_id: String::new(),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            state: ClaimState::Taken,
        },
    });
    // Another job's writer is filtered.
    let eval = world.register(&csi_job("intruder", "vol0", false));
    let plan = world.run(&eval);
    assert_eq!(
        reasons(&plan),
        BTreeMap::from([(
            "CSI volume vol0 has exhausted its available writer claims".to_string(),
            1
        )])
    );
    // An update of the holder's own job places its replacement (the claim waits on the
    // client for the old allocation to let go — Nomad #8609).
    let mut updated = writer.clone();
    updated.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    let eval = world.register(&updated);
    let plan = world.run(&eval);
    let placed: Vec<&Allocation> = plan
        .allocs
        .iter()
        .filter(|a| a.desired_status == DesiredStatus::Run)
        .collect();
    assert_eq!(placed.len(), 1, "{:?}", reasons(&plan));
    assert_eq!(placed[0].previous_allocation.as_deref(), Some(holder.id.as_str()));
}

#[test]
fn stopping_and_purging_a_job_stops_its_allocations() {
    let mut world = World::new(&[node("n1", 4000)]);
    let web = job("web", JobType::Service, 2, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let stop = world.eval("web");
    world.fx.ok(Command::JobStop {
        namespace: "default".into(),
        job_id: "web".into(),
        purge: false,
        eval: stop.clone(),
    });
    let stored = world.fx.state.job("default", "web").unwrap();
    assert!(stored.stop);
    assert_eq!(stored.version, 1);
    let plan = world.run(&stop);
    assert_eq!(plan.allocs.len(), 2);
    assert!(plan.allocs.iter().all(|a| a.desired_status == DesiredStatus::Stop));
    let purge = world.eval("web");
    world.fx.ok(Command::JobStop {
        namespace: "default".into(),
        job_id: "web".into(),
        purge: true,
        eval: purge.clone(),
    });
    assert!(world.fx.state.job("default", "web").is_none());
    assert!(world.fx.state.job_versions("default", "web").is_empty());
    assert!(world.run(&purge).allocs.is_empty(), "already stopped");
}

/// A plan made before its job was purged and applied after: it places nothing, or its
/// allocations would belong to no job and stay pending for good (issue 54 §9).
#[test]
fn a_plan_applied_after_its_job_was_purged_places_nothing() {
    let mut world = World::new(&[node("n1", 4000)]);
    let web = job("web", JobType::Service, 2, 100);
    let eval = world.register(&web);
    let mut counter = 0;
    let plan = schedule(&world.fx.state, &eval, &mut || {
        counter += 1;
        format!("late-{counter}")
    });
    assert_eq!(plan.allocs.len(), 2, "the plan places two");
    let purge = world.eval("web");
    world.fx.ok(Command::JobStop {
        namespace: "default".into(),
        job_id: "web".into(),
        purge: true,
        eval: purge,
    });
    world.fx.ok(Command::PlanApply {
        allocs: plan.allocs.clone(),
        evals: plan.evals.clone(),
        deployment: plan.deployment.clone(),
        deployment_updates: plan.deployment_updates.clone(),
    });
    assert_eq!(world.fx.state.allocs().count(), 0, "nothing placed for a purged job");
}

#[test]
fn a_job_registered_again_after_a_purge_never_adopts_the_old_allocations() {
    let mut world = World::new(&[node("n1", 4000)]);
    let web = job("web", JobType::Service, 2, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let old: BTreeSet<String> = world.fx.state.allocs().map(|alloc| alloc.id.clone()).collect();
    // Purged, and registered again before the purge's evaluation ran: the old allocations
    // still run, under the same job ID.
    let purge = world.eval("web");
    world.fx.ok(Command::JobStop {
        namespace: "default".into(),
        job_id: "web".into(),
        purge: true,
        eval: purge.clone(),
    });
    let again = world.register(&web);
    assert_eq!(
        world.fx.state.job_allocs("default", "web").count(),
        0,
        "none is the new job's"
    );
    let plan = world.run(&again);
    for id in &old {
        let stopped = plan
            .allocs
            .iter()
            .find(|alloc| &alloc.id == id)
            .expect("the old one is stopped");
        assert_eq!(stopped.desired_status, DesiredStatus::Stop);
    }
    assert_eq!(plan.placed().count(), 2, "the new job gets its own count");
    let mine: BTreeSet<String> = world
        .fx
        .state
        .job_allocs("default", "web")
        .map(|alloc| alloc.id.clone())
        .collect();
    assert_eq!(mine.len(), 2);
    assert!(mine.is_disjoint(&old));
    assert!(
        world.run(&purge).allocs.is_empty(),
        "the purge's own evaluation has nothing left to do"
    );
}

#[test]
fn a_failed_service_allocation_is_placed_again_only_once_its_delay_has_passed() {
    let mut world = World::new(&[node("n1", 4000)]);
    let web = job("web", JobType::Service, 1, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let failed = world.fx.state.allocs().next().unwrap().id.clone();
    world.set_client_status(&failed, ClientStatus::Failed);
    // Any other evaluation within the 30 s leaves it failed (cluster time moves 1 s an entry).
    let eval = world.eval("web");
    let plan = world.run(&eval);
    assert!(plan.allocs.is_empty(), "{:?}", plan.allocs);
    world.advance(30);
    let eval = world.eval("web");
    let plan = world.run(&eval);
    let stopped = plan.allocs.iter().find(|alloc| alloc.id == failed).expect("stopped");
    assert_eq!(stopped.desired_description, reschedule::ALLOC_RESCHEDULED);
    let replacement = plan
        .allocs
        .iter()
        .find(|alloc| alloc.desired_status == DesiredStatus::Run)
        .expect("placed again");
    assert_eq!(replacement.previous_allocation.as_deref(), Some(failed.as_str()));
    // Its failure in turn waits twice as long.
    let second = replacement.id.clone();
    world.set_client_status(&second, ClientStatus::Failed);
    world.advance(40);
    let eval = world.eval("web");
    assert!(world.run(&eval).allocs.is_empty(), "60 s for a second failure in a row");
    world.advance(25);
    let eval = world.eval("web");
    assert_eq!(world.run(&eval).allocs.len(), 2);
}

#[test]
fn the_worker_evaluates_a_failed_allocation_when_its_delay_has_passed() {
    let mut world = World::new(&[node("n1", 4000)]);
    let web = job("web", JobType::Service, 1, 100);
    let eval = world.register(&web);
    world.run(&eval);
    let failed = world.fx.state.allocs().next().unwrap().id.clone();
    world.set_client_status(&failed, ClientStatus::Failed);
    let mut worker = worker::Worker::new(7);
    let start = crate::time::Instant::ZERO;
    worker.set_enabled(start, true);
    // Seeds what it has seen of the nodes, then has nothing due yet.
    for _ in 0..3 {
        if let Some(command) = worker.run(start, &world.fx.state) {
            world.fx.ok(command);
            worker.proposed();
        }
    }
    assert!(
        !world
            .fx
            .state
            .evals()
            .any(|eval| eval.triggered_by == crate::structs::EvalTrigger::AllocFailure),
        "not before its delay"
    );
    let due = worker.poll_timeout().expect("a timer for the reschedule");
    // 30 s after the failure in cluster time, less what has been applied since.
    assert!(
        due > start + core::time::Duration::from_secs(25) && due <= start + core::time::Duration::from_secs(30),
        "{due:?}"
    );
    let Some(Command::EvalUpsert { evals }) = worker.run(due, &world.fx.state) else {
        panic!("an evaluation when due")
    };
    assert_eq!(evals.len(), 1);
    assert_eq!(evals[0].triggered_by, crate::structs::EvalTrigger::AllocFailure);
    let allocs = world.plan_after(&mut worker, due, evals);
    assert!(
        allocs
            .iter()
            .any(|alloc| alloc.id == failed && alloc.desired_status == DesiredStatus::Stop)
    );
}

fn with_node_values(mut node: Node, attributes: &[(&str, &str)], meta: &[(&str, &str)]) -> Node {
    node.attributes = attributes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    node.meta = meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    node
}

fn constraint(ltarget: &str, operand: &str, rtarget: &str) -> crate::structs::Constraint {
    crate::structs::Constraint {
        ltarget: ltarget.into(),
        rtarget: rtarget.into(),
        operand: operand.into(),
    }
}

#[test]
fn constraints_filter_nodes_with_nomads_reasons_at_every_level() {
    let linux = with_node_values(node("n1", 4000), &[("kernel.name", "linux")], &[("rack", "r1")]);
    let other = with_node_values(node("n2", 4000), &[("kernel.name", "plan9")], &[("rack", "r2")]);
    let mut world = World::new(&[linux, other]);
    let mut web = job("web", JobType::Service, 2, 100);
    web.constraints.push(constraint("${attr.kernel.name}", "=", "linux"));
    let eval = world.register(&web);
    let plan = world.run(&eval);
    assert_eq!(plan.placed().count(), 2);
    assert!(plan.placed().all(|alloc| alloc.node_id == "n1"));
    let metric = plan.placed().next().unwrap().metrics.clone().unwrap();
    assert_eq!(metric.constraint_filtered["${attr.kernel.name} = linux"], 1);

    // A task-level constraint no node meets: nothing is placed, the reason is counted.
    let mut picky = job("picky", JobType::Service, 1, 100);
    picky.task_groups[0].tasks[0]
        .constraints
        .push(constraint("${meta.rack}", "regexp", "^r[3-9]$"));
    let eval = world.register(&picky);
    let plan = world.run(&eval);
    assert_eq!(plan.placed().count(), 0);
    assert_eq!(
        plan.evals[0].failed_tg_allocs["g"].constraint_filtered["${meta.rack} regexp ^r[3-9]$"],
        2
    );
}

/// Bin-packing alone stacks a group on the fullest node; a `spread` over racks places it
/// by the targets' percentages (3 of 4 on r1 here), or evenly without targets.
#[test]
fn spreads_place_a_group_over_node_values_as_asked() {
    let nodes = [
        with_node_values(node("n1", 4000), &[], &[("rack", "r1")]),
        with_node_values(node("n2", 4000), &[], &[("rack", "r2")]),
    ];
    let rack_of = |alloc: &Allocation| nodes.iter().find(|n| n.id == alloc.node_id).unwrap().meta["rack"].clone();
    let mut world = World::new(&nodes);
    let packed = job("packed", JobType::Service, 4, 100);
    let eval = world.register(&packed);
    let plan = world.run(&eval);
    let hosts: BTreeSet<String> = plan.placed().map(|alloc| alloc.node_id.clone()).collect();
    assert_eq!(hosts.len(), 1, "bin-packing stacks them");

    let mut even = job("even", JobType::Service, 4, 100);
    even.task_groups[0].spreads.push(crate::structs::Spread {
        attribute: "${meta.rack}".into(),
        weight: 50,
        targets: Vec::new(),
    });
    let eval = world.register(&even);
    let plan = world.run(&eval);
    let on_r1 = plan.placed().filter(|alloc| rack_of(alloc) == "r1").count();
    assert_eq!((plan.placed().count(), on_r1), (4, 2), "two per rack");

    let mut weighted = job("weighted", JobType::Service, 4, 100);
    weighted.spreads.push(crate::structs::Spread {
        attribute: "${meta.rack}".into(),
        weight: 100,
        targets: vec![crate::structs::SpreadTarget {
            value: "r1".into(),
            percent: 75,
        }],
    });
    let eval = world.register(&weighted);
    let plan = world.run(&eval);
    let on_r1 = plan.placed().filter(|alloc| rack_of(alloc) == "r1").count();
    assert_eq!((plan.placed().count(), on_r1), (4, 3), "75% on r1");
}

#[test]
fn distinct_hosts_places_at_most_one_per_node_and_distinct_property_counts_values() {
    let nodes = [
        with_node_values(node("n1", 4000), &[], &[("rack", "r1")]),
        with_node_values(node("n2", 4000), &[], &[("rack", "r1")]),
        with_node_values(node("n3", 4000), &[], &[("rack", "r2")]),
    ];
    let mut world = World::new(&nodes);
    let mut spread = job("spread", JobType::Service, 4, 100);
    spread.task_groups[0]
        .constraints
        .push(constraint("", "distinct_hosts", ""));
    let eval = world.register(&spread);
    let plan = world.run(&eval);
    let hosts: BTreeSet<String> = plan.placed().map(|alloc| alloc.node_id.clone()).collect();
    assert_eq!(hosts.len(), 3, "one per node");
    assert_eq!(plan.placed().count(), 3, "the fourth has no node left");
    assert_eq!(
        plan.evals[0].failed_tg_allocs["g"].constraint_filtered["distinct_hosts"],
        3
    );

    let mut racks = job("racks", JobType::Service, 3, 100);
    racks
        .constraints
        .push(constraint("${meta.rack}", "distinct_property", "1"));
    let eval = world.register(&racks);
    let plan = world.run(&eval);
    let racks_used: BTreeSet<&str> = plan
        .placed()
        .map(|alloc| nodes.iter().find(|n| n.id == alloc.node_id).unwrap().meta["rack"].as_str())
        .collect();
    assert_eq!(plan.placed().count(), 2, "one per rack value");
    assert_eq!(racks_used, BTreeSet::from(["r1", "r2"]));
}

#[test]
fn affinities_outweigh_bin_packing_and_anti_affinities_push_away() {
    let nodes = [
        with_node_values(node("n1", 4000), &[], &[("rack", "r1")]),
        with_node_values(node("n2", 4000), &[], &[("rack", "r2")]),
    ];
    let mut world = World::new(&nodes);
    // Something already runs on n1: bin-packing alone would choose it.
    let filler = job("filler", JobType::Service, 1, 2000);
    let eval = world.register(&filler);
    world.run(&eval);
    assert_eq!(world.live("filler")[0].1, "n1");
    let mut fond = job("fond", JobType::Service, 1, 100);
    fond.affinities.push(crate::structs::Affinity {
        ltarget: "${meta.rack}".into(),
        rtarget: "r2".into(),
        operand: "=".into(),
        weight: 100,
    });
    let eval = world.register(&fond);
    assert_eq!(world.run(&eval).placed().next().unwrap().node_id, "n2");
    let mut averse = job("averse", JobType::Service, 1, 100);
    averse.task_groups[0].affinities.push(crate::structs::Affinity {
        ltarget: "${meta.rack}".into(),
        rtarget: "r1".into(),
        operand: "=".into(),
        weight: -100,
    });
    let eval = world.register(&averse);
    assert_eq!(world.run(&eval).placed().next().unwrap().node_id, "n2");
}

fn with_ports(mut job: Job, statics: &[(&str, u16)], dynamics: &[&str]) -> Job {
    use crate::structs::{NetworkResource, Port};
    let port = |label: &str, value: u16| Port {
        label: label.into(),
        value,
        ..Port::default()
    };
    job.task_groups[0].networks = vec![NetworkResource {
        reserved_ports: statics.iter().map(|(label, value)| port(label, *value)).collect(),
        dynamic_ports: dynamics.iter().map(|label| port(label, 0)).collect(),
        ..NetworkResource::default()
    }];
    job
}

fn ports_on(world: &World, node_id: &str) -> Vec<u16> {
    world
        .fx
        .state
        .allocs()
        .filter(|alloc| alloc.node_id == node_id && !alloc.terminal())
        .flat_map(|alloc| alloc.resources.host_ports().collect::<Vec<_>>())
        .collect()
}

#[test]
fn fifty_allocations_on_one_node_never_share_a_port() {
    let mut big = node("n1", 100_000);
    big.resources.memory_mb = 100_000;
    let mut world = World::new(&[big]);
    let web = with_ports(job("web", JobType::Service, 50, 10), &[], &["http", "admin"]);
    let eval = world.register(&web);
    let plan = world.run(&eval);
    assert_eq!(plan.placed().count(), 50, "{:?}", reasons(&plan));
    let ports = ports_on(&world, "n1");
    assert_eq!(ports.len(), 100);
    assert_eq!(
        ports.iter().collect::<BTreeSet<_>>().len(),
        100,
        "a port was handed out twice"
    );
    assert!(ports.iter().all(|port| (20000..=32000).contains(port)));
    let alloc = world.fx.state.allocs().next().unwrap();
    assert_eq!(alloc.resources.ports[0].label, "http");
    assert_eq!(
        alloc.resources.ports[0].host_ip, "127.0.0.1",
        "a node without addresses: loopback"
    );
}

#[test]
fn a_static_port_collision_and_an_exhausted_range_are_reported_as_nomad_does() {
    let mut narrow = node("n1", 100_000);
    narrow.resources.min_dynamic_port = 21000;
    narrow.resources.max_dynamic_port = 21002;
    narrow.resources.reserved_ports = [21001].into();
    let mut world = World::new(&[narrow]);
    let fixed = with_ports(job("fixed", JobType::Service, 2, 10), &[("http", 8080)], &[]);
    let eval = world.register(&fixed);
    let plan = world.run(&eval);
    assert_eq!(plan.placed().count(), 1);
    let metric = &plan.evals[0].failed_tg_allocs["g"];
    assert_eq!(
        metric.dimension_exhausted["network: reserved port collision http=8080"],
        1
    );
    // Two free dynamic ports (21001 is reserved): the third allocation cannot have one.
    let dynamic = with_ports(job("dynamic", JobType::Service, 3, 10), &[], &["any"]);
    let eval = world.register(&dynamic);
    let plan = world.run(&eval);
    assert_eq!(plan.placed().count(), 2);
    assert_eq!(
        plan.evals[0].failed_tg_allocs["g"].dimension_exhausted["network: dynamic port selection failed"],
        1
    );
    let mut ports = ports_on(&world, "n1");
    ports.sort();
    assert_eq!(ports, [8080, 21000, 21002]);
    // Stopping the job that holds 8080 frees it for the next placement.
    let stop = world.eval("fixed");
    world.fx.ok(Command::JobStop {
        namespace: "default".into(),
        job_id: "fixed".into(),
        purge: false,
        eval: stop.clone(),
    });
    world.run(&stop);
    let again = with_ports(job("again", JobType::Service, 1, 10), &[("web", 8080)], &[]);
    let eval = world.register(&again);
    assert_eq!(world.run(&eval).placed().count(), 1);
}

#[test]
fn a_stored_job_above_the_count_limit_is_scheduled_up_to_the_limit_not_built_in_full() {
    let mut world = World::new(&[node("n1", 1000)]);
    // Stored by a build without the limit: validation refuses it today, the log still has it.
    let poison = job("poison", JobType::Service, u32::MAX, 100);
    assert!(
        !crate::jobspec::validate(&poison).is_empty(),
        "validation refuses the count"
    );
    let eval = world.register(&poison);
    let plan = world.run(&eval);
    assert_eq!(plan.placed().count(), 10, "ten fit on the node");
    let metric = &plan.evals[0].failed_tg_allocs["g"];
    assert_eq!(
        metric.coalesced_failures,
        crate::jobspec::GROUP_COUNT_MAX - 10 - 1,
        "the failures up to the limit coalesce into one metric"
    );
}

#[test]
fn configured_job_limits_bound_validation_and_scheduling_alike() {
    let mut world = World::new(&[node("n1", 100_000)]);
    let eval = world.register(&job("big", JobType::Service, 12, 10));
    let limits = crate::jobspec::limits::JobLimits {
        group_count: 5,
        job_count: 8,
        groups: 2,
        tasks: 3,
    };
    let errors = crate::jobspec::validate_within(&job("big", JobType::Service, 12, 10), &limits);
    assert!(
        errors
            .iter()
            .any(|error| error.contains("Task group count 12 is more than the limit of 5 allocations per group")),
        "{errors:?}"
    );
    // Raised above the default, the same job is valid.
    let raised = crate::jobspec::limits::JobLimits {
        group_count: 20_000,
        job_count: 20_000,
        ..Default::default()
    };
    let mut large = job("large", JobType::Service, 15_000, 10);
    large.task_groups[0].count = 15_000;
    assert!(
        crate::jobspec::validate(&large)
            .iter()
            .any(|e| e.contains("limit of 10000"))
    );
    assert_eq!(crate::jobspec::validate_within(&large, &raised), Vec::<String>::new());
    // The scheduler keeps the configured promise for a job stored above it.
    let mut next = 0;
    let mut new_id = || {
        next += 1;
        format!("a{next}")
    };
    let plan = crate::scheduler::schedule_within(&world.fx.state, &eval, &mut new_id, &limits);
    assert_eq!(plan.placed().count(), 5);
}

#[test]
fn a_stored_job_above_the_group_limit_is_scheduled_up_to_the_limit() {
    let mut world = World::new(&[node("n1", 100_000)]);
    let mut wide = job("wide", JobType::Service, 1, 10);
    let group = wide.task_groups[0].clone();
    wide.task_groups = (0..crate::jobspec::limits::GROUPS_MAX + 50)
        .map(|index| crate::structs::TaskGroup {
            name: format!("g{index}"),
            ..group.clone()
        })
        .collect();
    assert!(!crate::jobspec::validate(&wide).is_empty(), "validation refuses it");
    let eval = world.register(&wide);
    let plan = world.run(&eval);
    // Placed where the node has room, recorded as failed past it: one group each, and no
    // group past the limit either way.
    let failed = plan.evals[0].failed_tg_allocs.len();
    assert_eq!(plan.placed().count() + failed, crate::jobspec::limits::GROUPS_MAX);
    let limit = crate::jobspec::limits::GROUPS_MAX;
    assert!(
        plan.evals[0]
            .failed_tg_allocs
            .keys()
            .all(|group| group[1..].parse::<usize>().is_ok_and(|index| index < limit)),
        "{:?}",
        plan.evals[0].failed_tg_allocs.keys()
    );
}

/// A node that came back (ready again) just before its leader fell has its system
/// allocations placed by the next leader, although that leader never saw the node change.
#[test]
fn a_new_leaders_worker_evaluates_system_jobs_it_saw_no_node_change_for() {
    let mut world = World::new(&[node("n1", 4000), node("n2", 4000)]);
    let plugin = job("plugin", JobType::System, 1, 100);
    let eval = world.register(&plugin);
    world.run(&eval);
    // n2's allocation was lost while it was down; it is ready again, and no evaluation
    // followed (the leader that applied the change fell before proposing one).
    let mut lost = world
        .fx
        .state
        .allocs_on_node("n2")
        .next()
        .cloned()
        .expect("placed on n2");
    lost.desired_status = DesiredStatus::Stop;
    lost.client_status = ClientStatus::Lost;
    world.fx.ok(Command::PlanApply {
        allocs: vec![lost],
        evals: Vec::new(),
        deployment: None,
        deployment_updates: Vec::new(),
    });
    assert_eq!(world.live("plugin").len(), 1);
    let mut worker = worker::Worker::new(7);
    let start = crate::time::Instant::ZERO;
    worker.set_enabled(start, true);
    let Some(Command::EvalUpsert { evals }) = worker.run(start, &world.fx.state) else {
        panic!("a new leader evaluates the system job")
    };
    assert_eq!(
        evals.iter().map(|eval| eval.job_id.as_str()).collect::<Vec<_>>(),
        ["plugin"]
    );
    let allocs = world.plan_after(&mut worker, start, evals);
    assert!(
        allocs
            .iter()
            .any(|alloc| alloc.node_id == "n2" && alloc.desired_status == DesiredStatus::Run)
    );
}

/// Runs `worker` at `now` until it proposes nothing more, applying each proposal.
fn drain_worker(world: &mut World, worker: &mut worker::Worker, now: crate::time::Instant) {
    for _ in 0..50 {
        let Some(command) = worker.run(now, &world.fx.state) else {
            return;
        };
        world.fx.ok(command);
        worker.proposed();
    }
    panic!("the worker never settles");
}

#[test]
fn a_system_jobs_update_replaces_max_parallel_allocations_every_stagger() {
    use core::time::Duration;
    let mut world = World::new(&[node("n1", 4000), node("n2", 4000), node("n3", 4000)]);
    let mut agent = job("agent", JobType::System, 1, 100);
    agent.task_groups[0].update = Some(alloc::boxed::Box::new(crate::structs::UpdateStrategy {
        max_parallel: 1,
        stagger: Duration::from_secs(30),
        ..Default::default()
    }));
    let eval = world.register(&agent);
    world.run(&eval);
    let mut worker = worker::Worker::new(7);
    let start = crate::time::Instant::ZERO;
    worker.set_enabled(start, true);
    drain_worker(&mut world, &mut worker, start);
    let version = |world: &World, version: u64| {
        world
            .fx
            .state
            .allocs()
            .filter(|alloc| alloc.job_id == "agent" && !alloc.terminal() && alloc.job_version == version)
            .count()
    };
    assert_eq!(version(&world, 0), 3);

    // A new version: one node per evaluation, the next evaluation `stagger` later.
    agent.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    let register = world.register(&agent);
    drain_worker(&mut world, &mut worker, start);
    assert_eq!((version(&world, 1), version(&world, 0)), (1, 2));
    let processed = world.fx.state.eval(&register.id).unwrap().clone();
    let next = world
        .fx
        .state
        .eval(&processed.next_eval)
        .expect("a follow-up evaluation")
        .clone();
    assert_eq!(
        (
            next.triggered_by,
            next.status,
            next.wait_ms,
            next.previous_eval.as_str()
        ),
        (
            crate::structs::EvalTrigger::RollingUpdate,
            EvalStatus::Pending,
            30_000,
            register.id.as_str()
        )
    );
    let due = worker.poll_timeout().expect("a timer for the next batch");
    assert!(
        due > start + Duration::from_secs(25) && due <= start + Duration::from_secs(30),
        "{due:?}"
    );
    let just_before = crate::time::Instant::from_millis(due.as_nanos() / 1_000_000 - 1);
    drain_worker(&mut world, &mut worker, just_before);
    assert_eq!(version(&world, 1), 1, "not before the stagger has passed");
    drain_worker(&mut world, &mut worker, due);
    assert_eq!((version(&world, 1), version(&world, 0)), (2, 1));
    let due = worker.poll_timeout().expect("a timer for the last batch");
    drain_worker(&mut world, &mut worker, due);
    assert_eq!((version(&world, 1), version(&world, 0)), (3, 0));
    assert!(
        world.fx.state.pending_evals().next().is_none(),
        "no follow-up once every node runs the new version"
    );

    // Without an update block, every node at once.
    agent.task_groups[0].update = None;
    agent.task_groups[0].tasks[0].env.insert("V".into(), "3".into());
    let register = world.register(&agent);
    world.run(&register);
    assert_eq!(version(&world, 2), 3);
}
