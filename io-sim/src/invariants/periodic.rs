//! Every time a periodic job's spec names is accounted for, once: on each server's apply
//! stream, a parent's scheduled launches come in strictly increasing order, each at a time the
//! spec names, and the due times between a launch and the one the state machine recorded
//! before it are exactly the ones it says it passed over (`skipped`). A leader that launches a
//! time twice, launches off the spec, or silently drops a time that fell due during a failover
//! or a clock step breaks it. The times are counted here with the cron calendar alone, not the
//! dispatcher's reasoning. (The previous launch comes with the fact: a server that caught up
//! by snapshot never saw the launches in between.)

use std::collections::BTreeMap;

use drover_core::periodic::Calendar;
use drover_core::structs::PeriodicConfig;
use drover_io_real::io::AgentEvent;
use drover_io_real::periodic::CronCalendar;

use crate::trace::SimEvent;

use super::Invariant;

/// How many of a spec's times one step of the oracle walks before giving up counting.
const COUNT_LIMIT: u32 = 100_000;

#[derive(Debug, Default)]
pub struct PeriodicLaunches {
    /// The last scheduled launch seen, by (server, parent): its log index and time.
    last: BTreeMap<(String, String), (u64, u64)>,
}

/// The times `periodic` names strictly between `after` and `before`.
fn times_between(periodic: &PeriodicConfig, after: u64, before: u64) -> Option<u32> {
    let mut count = 0;
    let mut at = after;
    while let Some(next) = CronCalendar.next_after(periodic, at) {
        if next >= before {
            return Some(count);
        }
        count += 1;
        if count > COUNT_LIMIT {
            return None;
        }
        at = next;
    }
    Some(count)
}

impl Invariant for PeriodicLaunches {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(
            event,
            SimEvent::Agent(AgentEvent::PeriodicLaunched { forced: false, .. })
        )
    }

    fn name(&self) -> &'static str {
        "every time a periodic spec names is launched once or counted as skipped"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(AgentEvent::PeriodicLaunched {
            index,
            job,
            spec,
            time_zone,
            launch_ms,
            previous_ms,
            skipped,
            forced: false,
        }) = event
        else {
            return Ok(());
        };
        let periodic = PeriodicConfig {
            spec: spec.clone(),
            time_zone: time_zone.clone(),
            ..PeriodicConfig::default()
        };
        if CronCalendar.next_after(&periodic, launch_ms.saturating_sub(1)) != Some(*launch_ms) {
            return Err(format!(
                "{node}: {job} launched at {launch_ms} ms, a time {spec:?} does not name"
            ));
        }
        let key = (node.to_string(), job.clone());
        match self.last.get(&key).copied() {
            // A restarted server applies entries it applied before: already judged.
            Some((last_index, _)) if *index <= last_index => return Ok(()),
            Some((_, last_ms)) if *launch_ms <= last_ms => {
                return Err(format!(
                    "{node}: {job} launched {launch_ms} ms after launching {last_ms} ms: a time launched twice or backwards"
                ));
            }
            _ => {}
        }
        let between = times_between(&periodic, *previous_ms, *launch_ms);
        if between != Some(*skipped) {
            return Err(format!(
                "{node}: {job}: {between:?} times of {spec:?} fell between {previous_ms} ms and the launch at {launch_ms} ms, which accounts for {skipped}"
            ));
        }
        self.last.insert(key, (*index, *launch_ms));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01T00:00:00Z.
    const T0: u64 = 1_767_225_600_000;

    fn launch(index: u64, previous_s: u64, at_s: u64, skipped: u32) -> SimEvent {
        SimEvent::Agent(AgentEvent::PeriodicLaunched {
            index,
            job: "default/cron".into(),
            spec: "*/5 * * * * * *".into(),
            time_zone: "UTC".into(),
            launch_ms: T0 + at_s * 1000,
            previous_ms: T0 + previous_s * 1000,
            skipped,
            forced: false,
        })
    }

    #[test]
    fn every_time_accounted_for_passes_and_a_replay_is_ignored() {
        let mut invariant = PeriodicLaunches::default();
        assert!(invariant.observe("s1", &launch(10, 1, 5, 0)).is_ok());
        assert!(invariant.observe("s1", &launch(12, 5, 10, 0)).is_ok());
        assert!(
            invariant.observe("s1", &launch(20, 10, 25, 2)).is_ok(),
            "15 and 20 skipped, said so"
        );
        assert!(
            invariant.observe("s1", &launch(12, 5, 10, 0)).is_ok(),
            "a restart replays index 12"
        );
        // A server that caught up by snapshot sees the next launch after a gap.
        assert!(invariant.observe("s2", &launch(20, 10, 25, 2)).is_ok());
    }

    #[test]
    fn a_dropped_time_a_double_launch_and_an_off_spec_time_are_caught() {
        let mut invariant = PeriodicLaunches::default();
        invariant.observe("s1", &launch(10, 1, 5, 0)).unwrap();
        let dropped = invariant.observe("s1", &launch(11, 5, 15, 0)).unwrap_err();
        assert!(dropped.contains("Some(1) times"), "{dropped}");
        let mut invariant = PeriodicLaunches::default();
        invariant.observe("s1", &launch(10, 1, 5, 0)).unwrap();
        let twice = invariant.observe("s1", &launch(11, 5, 5, 0)).unwrap_err();
        assert!(twice.contains("launched twice or backwards"), "{twice}");
        let off = invariant.observe("s2", &launch(3, 5, 7, 0)).unwrap_err();
        assert!(off.contains("does not name"), "{off}");
    }
}
