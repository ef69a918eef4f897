//! A rollout never has more allocations in flight than its `max_parallel`: after every applied
//! plan of a job with a running deployment, the deployment's live allocations that replaced
//! one stopped for the update and are not healthy yet number at most `max_parallel`.

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct Rollout;

impl Invariant for Rollout {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::Rollout { .. }))
    }

    fn name(&self) -> &'static str {
        "a rollout never has more than max_parallel unhealthy replacements"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        if let SimEvent::Agent(AgentEvent::Rollout {
            deployment,
            job,
            group,
            max_parallel,
            replacing,
        }) = event
            && replacing.len() > *max_parallel as usize
        {
            return Err(format!(
                "{node}: deployment {deployment} of {job}.{group} (max_parallel {max_parallel}) has {} replacements in flight: {replacing:?}",
                replacing.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_in_flight_than_max_parallel_is_caught() {
        let event = |replacing: &[&str]| {
            SimEvent::Agent(AgentEvent::Rollout {
                deployment: "d".into(),
                job: "web".into(),
                group: "g".into(),
                max_parallel: 1,
                replacing: replacing.iter().map(|id| id.to_string()).collect(),
            })
        };
        let mut invariant = Rollout;
        assert!(invariant.observe("s1", &event(&["a"])).is_ok());
        let error = invariant.observe("s1", &event(&["a", "b"])).unwrap_err();
        assert!(error.contains("has 2 replacements in flight"), "{error}");
    }
}
