use super::*;
use crate::fsm::{Entry, Response};
use crate::structs::{JobType, PeriodicConfig, TaskGroup};

/// Specs are `every <seconds>`: every multiple of that many seconds since the epoch.
#[derive(Debug)]
struct Every;

impl Calendar for Every {
    fn next_after(&self, periodic: &PeriodicConfig, after_ms: u64) -> Option<u64> {
        let secs: u64 = periodic.spec.strip_prefix("every ")?.parse().ok()?;
        let step = secs * 1000;
        Some((after_ms / step + 1) * step)
    }
}

fn parent(spec: &str, prohibit_overlap: bool) -> Job {
    Job {
        id: "report".into(),
        namespace: "default".into(),
        job_type: JobType::Batch,
        task_groups: vec![TaskGroup {
            name: "g".into(),
            count: 1,
            ..TaskGroup::default()
        }],
        periodic: Some(alloc::boxed::Box::new(PeriodicConfig {
            spec: spec.into(),
            prohibit_overlap,
            ..PeriodicConfig::default()
        })),
        ..Job::default()
    }
}

/// One leader's dispatcher over a state store; the wall clock and the monotonic clock move
/// together unless a test steps the wall clock.
struct World {
    state: ServerState,
    leader: PeriodicDispatcher,
    now: Instant,
    wall_ms: u64,
    ids: u64,
    launched: Vec<(String, u32)>,
}

impl World {
    fn new(spec: &str, prohibit_overlap: bool, registered_at_ms: u64) -> Self {
        let mut world = World {
            state: ServerState::default(),
            leader: PeriodicDispatcher::new(Arc::new(Every)),
            now: Instant::ZERO,
            wall_ms: registered_at_ms,
            ids: 0,
            launched: Vec::new(),
        };
        let register = Command::JobRegister {
            job: parent(spec, prohibit_overlap),
            eval: None,
            enforce_index: None,
        };
        assert_eq!(world.apply(register), Response::Done);
        world.leader.set_enabled(true);
        world
    }

    fn apply(&mut self, command: Command) -> Response {
        let index = self.state.last_applied().map_or(1, |last| last + 1);
        let entry = Entry {
            at_unix_ms: self.wall_ms,
            command,
        };
        self.state.apply(index, &entry)
    }

    /// Time passes on both clocks; the leader steps until it has nothing to propose.
    fn advance_to(&mut self, wall_ms: u64) {
        self.now = self.now + Duration::from_millis(wall_ms.saturating_sub(self.wall_ms));
        self.wall_ms = wall_ms;
        self.step();
    }

    fn step(&mut self) {
        loop {
            self.leader.set_wall_clock(self.now, self.wall_ms);
            let ids = &mut self.ids;
            let mut new_id = || {
                *ids += 1;
                format!("id-{ids}")
            };
            let Some(command) = self.leader.run(self.now, &self.state, &mut new_id) else {
                return;
            };
            if let Command::PeriodicLaunch {
                child,
                skipped,
                launch_ms,
                ..
            } = &command
            {
                let name = child
                    .as_ref()
                    .map_or(format!("skip@{launch_ms}"), |child| child.0.id.clone());
                self.launched.push((name, *skipped));
            }
            let response = self.apply(command);
            assert_eq!(response, Response::Done);
            self.leader.proposed();
        }
    }

    fn launched(&self) -> Vec<&str> {
        self.launched.iter().map(|(name, _)| name.as_str()).collect()
    }
}

#[test]
fn each_time_the_spec_names_launches_one_child_and_not_before() {
    let mut world = World::new("every 10", false, 1_000);
    world.advance_to(9_999);
    assert!(world.launched().is_empty());
    assert_eq!(world.leader.poll_timeout(), Some(world.now + Duration::from_millis(1)));
    world.advance_to(10_000);
    world.advance_to(15_000);
    world.advance_to(20_000);
    assert_eq!(world.launched(), ["report/periodic-10", "report/periodic-20"]);
    let child = world.state.job("default", "report/periodic-20").expect("child stored");
    assert_eq!(child.parent_id, "report");
    let evals: Vec<_> = world.state.evals().filter(|eval| eval.job_id == child.id).collect();
    assert_eq!(evals.len(), 1);
    assert_eq!(evals[0].triggered_by, crate::structs::EvalTrigger::PeriodicJob);
    assert!(
        world.state.evals().all(|eval| eval.job_id != "report"),
        "the parent is never evaluated"
    );
}

#[test]
fn a_new_leader_launches_the_time_it_missed_once_under_its_own_name() {
    let mut world = World::new("every 10", false, 1_000);
    world.advance_to(10_000);
    // The leader goes away before 20 s; a new one takes over at 24 s.
    world.leader.set_enabled(false);
    world.advance_to(24_000);
    assert_eq!(world.launched(), ["report/periodic-10"]);
    world.leader = PeriodicDispatcher::new(Arc::new(Every));
    world.leader.set_enabled(true);
    world.step();
    world.advance_to(25_000);
    assert_eq!(world.launched(), ["report/periodic-10", "report/periodic-20"]);
    assert_eq!(world.launched[1].1, 0, "nothing was skipped");
}

#[test]
fn times_missed_together_launch_only_the_latest_and_count_the_rest() {
    let mut world = World::new("every 10", false, 1_000);
    world.advance_to(10_000);
    world.advance_to(20_000);
    // The wall clock steps 45 s ahead (the monotonic clock does not).
    world.wall_ms = 65_000;
    world.step();
    assert_eq!(
        world.launched(),
        ["report/periodic-10", "report/periodic-20", "report/periodic-60"]
    );
    assert_eq!(world.launched[2].1, 3, "30, 40 and 50 were skipped");
}

#[test]
fn a_wall_clock_stepped_back_launches_nothing_twice() {
    let mut world = World::new("every 10", false, 1_000);
    for wall_ms in [10_000, 20_000, 30_000] {
        world.advance_to(wall_ms);
    }
    world.wall_ms = 12_000;
    world.step();
    world.advance_to(39_999);
    assert_eq!(
        world.launched(),
        ["report/periodic-10", "report/periodic-20", "report/periodic-30"]
    );
    world.advance_to(40_000);
    assert_eq!(world.launched().last(), Some(&"report/periodic-40"));
}

#[test]
fn prohibit_overlap_records_the_time_without_a_child_while_one_runs() {
    let mut world = World::new("every 10", true, 1_000);
    world.advance_to(10_000);
    // The first child has not finished (it has not even been placed): the next is skipped.
    world.advance_to(20_000);
    assert_eq!(world.launched(), ["report/periodic-10", "skip@20000"]);
    assert_eq!(
        world.state.periodic_launch("default", "report").map(|l| l.launch_ms),
        Some(20_000)
    );
    // The child is stopped (dead): the next time launches again.
    let stop = Command::JobStop {
        namespace: "default".into(),
        job_id: "report/periodic-10".into(),
        purge: false,
        eval: Evaluation::default(),
    };
    world.apply(stop);
    world.advance_to(30_000);
    assert_eq!(world.launched().last(), Some(&"report/periodic-30"));
}

#[test]
fn two_leaders_proposing_the_same_time_launch_it_once() {
    let mut world = World::new("every 10", false, 1_000);
    let mut stale = PeriodicDispatcher::new(Arc::new(Every));
    stale.set_enabled(true);
    world.now = world.now + Duration::from_millis(9_000);
    world.wall_ms = 10_000;
    stale.set_wall_clock(world.now, world.wall_ms);
    let mut n = 0;
    let stale_launch = stale
        .run(world.now, &world.state, &mut || {
            n += 1;
            format!("stale-{n}")
        })
        .expect("the stale leader sees 10 s due");
    world.step();
    let response = world.apply(stale_launch);
    assert!(
        matches!(response, Response::Error(crate::error::ErrorKind::Refused, _)),
        "{response:?}"
    );
    assert_eq!(world.state.children("default", "report").count(), 1);
}

#[test]
fn a_disabled_or_stopped_parent_is_not_launched() {
    let mut world = World::new("every 10", false, 1_000);
    let mut disabled = parent("every 10", false);
    if let Some(periodic) = disabled.periodic.as_mut() {
        periodic.enabled = false;
    }
    world.apply(Command::JobRegister {
        job: disabled,
        eval: None,
        enforce_index: None,
    });
    world.advance_to(30_000);
    assert!(world.launched().is_empty());
    assert_eq!(world.leader.poll_timeout(), None);
}
