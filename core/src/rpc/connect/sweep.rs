//! Anti-entropy for service identity tokens: tokens Consul holds for this cluster that the
//! state does not know are revoked.
//!
//! Such tokens exist when a leader is lost between creating tokens and committing their
//! accessors, or when Consul created a token after the call had been given up. Every
//! [`SWEEP_INTERVAL`] the leader lists Consul's tokens (`GET /v1/acl/tokens`) and keeps those
//! whose description carries this cluster's `_nomad_si [<cluster id>]` prefix. A token is
//! revoked only when two listings in a row found it unknown — to the state, and to this
//! leader's derivations and revocations. A derivation in flight at the first listing has
//! either committed its accessors or failed (its tokens committed as orphans) long before the
//! second, [`SWEEP_INTERVAL`] later, since every Consul call ends within its deadline.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeSet;
use core::time::Duration;

use super::{ConsulAclError, ConsulAclReply};
use crate::op::OpId;
use crate::time::Instant;

/// How often the leader compares Consul's tokens with the state.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub(super) struct Sweep {
    next_at: Option<Instant>,
    in_flight: Option<OpId>,
    /// Accessors of this cluster's tokens the last listing found unknown.
    suspects: BTreeSet<String>,
}

impl Sweep {
    /// Leadership lost: the next leader starts afresh (one interval after it leads).
    pub fn reset(&mut self) {
        *self = Sweep::default();
    }

    /// Whether a listing is due now (the first one an interval after leadership began).
    pub fn due(&mut self, now: Instant) -> bool {
        let next = *self.next_at.get_or_insert(now + SWEEP_INTERVAL);
        self.in_flight.is_none() && now >= next
    }

    pub fn started(&mut self, op: OpId) {
        self.in_flight = Some(op);
    }

    /// The listing came back: the accessors to revoke, those unknown twice in a row.
    pub fn listed(
        &mut self,
        now: Instant,
        result: Result<ConsulAclReply, ConsulAclError>,
        cluster_id: &str,
        known: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        self.in_flight = None;
        self.next_at = Some(now + SWEEP_INTERVAL);
        let tokens = match result {
            Ok(ConsulAclReply::Tokens(tokens)) => tokens,
            Ok(other) => {
                tracing::warn!(reply = ?other, "unexpected answer to a Consul token listing");
                return Vec::new();
            }
            Err(error) => {
                tracing::warn!(error = %error.message, "listing Consul's tokens failed; the next sweep tries again");
                return Vec::new();
            }
        };
        let prefix = format!("_nomad_si [{cluster_id}] ");
        let unknown: BTreeSet<String> = tokens
            .into_iter()
            .filter(|token| token.description.starts_with(&prefix) && !known(&token.accessor_id))
            .map(|token| token.accessor_id)
            .collect();
        let strays = unknown.intersection(&self.suspects).cloned().collect();
        self.suspects = unknown;
        strays
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_at.filter(|_| self.in_flight.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::super::ConsulToken;
    use super::*;

    fn listing(tokens: &[(&str, &str)]) -> Result<ConsulAclReply, ConsulAclError> {
        Ok(ConsulAclReply::Tokens(
            tokens
                .iter()
                .map(|(accessor, description)| ConsulToken {
                    accessor_id: accessor.to_string(),
                    description: description.to_string(),
                })
                .collect(),
        ))
    }

    #[test]
    fn only_tokens_of_this_cluster_unknown_twice_in_a_row_are_revoked() {
        let mut sweep = Sweep::default();
        let t0 = Instant::ZERO;
        assert!(!sweep.due(t0), "not at once after gaining leadership");
        let t1 = t0 + SWEEP_INTERVAL;
        assert!(sweep.due(t1));
        sweep.started(OpId(1));
        assert!(!sweep.due(t1), "one listing at a time");
        let tokens = [
            ("known", "_nomad_si [c1] [a1] [web]"),
            ("stray", "_nomad_si [c1] [a2] [web]"),
            ("late", "_nomad_si [c1] [a3] [web]"),
            ("other-cluster", "_nomad_si [c2] [a9] [web]"),
            ("operator", "my token"),
        ];
        let known = |id: &str| id == "known";
        assert!(
            sweep.listed(t1, listing(&tokens), "c1", known).is_empty(),
            "first sighting"
        );
        assert_eq!(sweep.poll_timeout(), Some(t1 + SWEEP_INTERVAL));
        // By the next listing `late` was committed (known now); `stray` is revoked.
        let t2 = t1 + SWEEP_INTERVAL;
        assert!(sweep.due(t2));
        sweep.started(OpId(2));
        let known = |id: &str| id == "known" || id == "late";
        assert_eq!(sweep.listed(t2, listing(&tokens), "c1", known), ["stray"]);
        // A failed listing forgets nothing and revokes nothing.
        let failed = Err(ConsulAclError {
            message: "down".into(),
            retryable: true,
            not_found: false,
        });
        assert!(sweep.listed(t2, failed, "c1", known).is_empty());
    }
}
