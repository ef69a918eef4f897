//! Never more writers than a volume's access mode allows, checked on every applied claim.

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct Writers;

/// Writers allowed by an access mode (`None` = no limit).
pub fn writers_max(access_mode: &str) -> Option<usize> {
    match access_mode {
        "single-node-reader-only" | "multi-node-reader-only" => Some(0),
        "single-node-writer" | "multi-node-single-writer" => Some(1),
        _ => None,
    }
}

impl Invariant for Writers {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::VolumeClaims { .. }))
    }

    fn name(&self) -> &'static str {
        "never more writers than the access mode allows"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        if let SimEvent::Agent(AgentEvent::VolumeClaims {
            volume,
            access_mode,
            writers,
            ..
        }) = event
            && writers_max(access_mode).is_some_and(|max| writers.len() > max)
        {
            return Err(format!(
                "{node}: volume {volume} ({access_mode}) has writers {writers:?}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_writers_on_a_single_writer_volume_are_caught() {
        let event = |writers: &[&str]| {
            SimEvent::Agent(AgentEvent::VolumeClaims {
                volume: "default/v".into(),
                access_mode: "single-node-writer".into(),
                writers: writers.iter().map(|w| w.to_string()).collect(),
                readers: 0,
            })
        };
        let mut invariant = Writers;
        assert!(invariant.observe("s1", &event(&["a"])).is_ok());
        assert!(invariant.observe("s1", &event(&["a", "b"])).is_err());
    }
}
