//! Every committed entry is applied with the same content at the same index on every server
//! (so every server applies the same entries in the same order).

use std::collections::BTreeMap;

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct LogMatching {
    applied: BTreeMap<u64, (String, u64, u64)>,
}

impl Invariant for LogMatching {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::Applied { .. }))
    }

    fn name(&self) -> &'static str {
        "same committed entries in the same order on every server"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(event) = event else { return Ok(()) };
        if let AgentEvent::Applied { index, term, digest } = event {
            match self.applied.get(index) {
                Some((first, first_term, first_digest)) if (*first_term, *first_digest) != (*term, *digest) => {
                    return Err(format!(
                        "index {index}: {first} applied term {first_term} digest {first_digest:016x} \
                         but {node} applied term {term} digest {digest:016x}"
                    ));
                }
                Some(_) => {}
                None => {
                    self.applied.insert(*index, (node.to_string(), *term, *digest));
                }
            }
        }
        Ok(())
    }
}
