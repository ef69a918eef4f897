//! Only servers write to the state directly: no direct write (`Apply`, the server-only RPC
//! behind ACL and variable writes) reaches the log for a caller whose certificate proves
//! another role (a client's, or one naming neither). In the madsim world every agent proves
//! its role, so a client's write here is one the servers let through. Over plaintext (the
//! turmoil lane) nothing is proved and nothing is held against the caller, as in Nomad
//! without TLS.

use drover_io_real::io::{AgentEvent, Identity};

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct DirectWrites;

impl Invariant for DirectWrites {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::DirectWrite { .. }))
    }

    fn name(&self) -> &'static str {
        "only servers write directly"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        if let SimEvent::Agent(AgentEvent::DirectWrite { caller, index }) = event
            && matches!(caller, Identity::Client | Identity::Other)
        {
            return Err(format!(
                "{node} committed a direct write at index {index} for a caller proving {caller:?}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_direct_write_is_caught() {
        let write = |caller| SimEvent::Agent(AgentEvent::DirectWrite { caller, index: 7 });
        let mut invariant = DirectWrites;
        assert!(invariant.observe("s1", &write(Identity::Server)).is_ok());
        assert!(invariant.observe("s1", &write(Identity::Unverified)).is_ok());
        assert!(invariant.observe("s1", &write(Identity::Client)).is_err());
        assert!(invariant.observe("s1", &write(Identity::Other)).is_err());
    }
}
