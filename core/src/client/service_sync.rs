//! When the client brings the local Consul agent's task services in line with the running
//! tasks (Nomad's `ServiceClient` sync loop): at once after any change of a task's state or of
//! the allocations, and every [`SERVICE_SYNC_PERIOD`] (anti-entropy). One pass reads what the
//! agent holds ([`ConsulOp::Services`]), asks [`plan_sync`] for the difference and carries it
//! out one call at a time. Consul being down fails nothing: the pass ends and the next one
//! tries again.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::String;
use core::time::Duration;

use crate::client::services::{RegisteredService, Wanted, plan_sync};
use crate::client::{ConsulOp, Io, Outcome, Reply};
use crate::op::{OpId, OpIds};
use crate::time::Instant;

/// Anti-entropy: the agent is compared with what should be there at least this often (Nomad's
/// service client syncs every 30 s).
pub const SERVICE_SYNC_PERIOD: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Default)]
pub struct ServiceSync {
    /// The address services are registered at; `None` while the client has no Consul.
    address: Option<String>,
    in_flight: Option<OpId>,
    /// The calls left in the current pass.
    queue: VecDeque<ConsulOp>,
    next_at: Option<Instant>,
    /// Something changed while a pass was running: another pass follows at once.
    dirty: bool,
    /// The regression switch `ClientFaults::no_service_anti_entropy`.
    no_anti_entropy: bool,
}

impl ServiceSync {
    /// Starts syncing, registering services at `address` (the node's address).
    pub fn enable(&mut self, now: Instant, address: String) {
        self.enable_with(now, address, false);
    }

    /// [`ServiceSync::enable`], optionally without the periodic pass (a regression switch).
    pub fn enable_with(&mut self, now: Instant, address: String, no_anti_entropy: bool) {
        self.no_anti_entropy = no_anti_entropy;
        self.address = Some(address);
        self.next_at = Some(now);
    }

    /// Whether the client has a Consul agent to sync with.
    pub fn enabled(&self) -> bool {
        self.address.is_some()
    }

    pub fn owns(&self, op: OpId) -> bool {
        self.in_flight == Some(op)
    }

    /// A task's state or the allocations changed: sync again as soon as possible.
    pub fn changed(&mut self, now: Instant) {
        if self.address.is_none() {
            return;
        }
        if self.in_flight.is_some() || !self.queue.is_empty() {
            self.dirty = true;
        } else {
            self.next_at = Some(now);
        }
    }

    /// The next call, if one is due (one at a time).
    pub fn poll(&mut self, now: Instant, ops: &mut OpIds) -> Option<(OpId, Io)> {
        if self.in_flight.is_some() {
            return None;
        }
        let call = match self.queue.pop_front() {
            Some(call) => call,
            None if self.next_at.is_some_and(|at| now >= at) => {
                self.next_at = None;
                ConsulOp::Services
            }
            None => return None,
        };
        let op = ops.allocate();
        self.in_flight = Some(op);
        Some((op, Io::Consul(call)))
    }

    /// The outcome of the call in flight; `wanted` is what should be registered now.
    pub fn outcome(&mut self, now: Instant, outcome: Outcome, wanted: impl FnOnce() -> Wanted) {
        self.in_flight = None;
        match outcome {
            Ok(Reply::Services(registered)) => self.plan(&wanted(), &registered),
            Ok(_) => {}
            // A failed read leaves nothing queued, so it ends the pass; a failed register or
            // deregister does not stop the calls after it.
            Err(error) => tracing::warn!(%error, "a consul call failed; the next sync tries again"),
        }
        if self.queue.is_empty() {
            self.finish(now);
        }
    }

    fn plan(&mut self, wanted: &Wanted, registered: &BTreeMap<String, RegisteredService>) {
        let plan = plan_sync(wanted, registered);
        let address = self.address.clone().unwrap_or_default();
        self.queue
            .extend(plan.register.into_iter().map(|registration| ConsulOp::Register {
                registration: alloc::boxed::Box::new(registration),
                address: address.clone(),
            }));
        self.queue
            .extend(plan.deregister.into_iter().map(|id| ConsulOp::Deregister { id }));
    }

    fn finish(&mut self, now: Instant) {
        let again = if core::mem::take(&mut self.dirty) {
            now
        } else if self.no_anti_entropy {
            return;
        } else {
            now + SERVICE_SYNC_PERIOD
        };
        self.next_at = Some(self.next_at.map_or(again, |at| at.min(again)));
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.in_flight.is_some() || !self.queue.is_empty() {
            return None;
        }
        self.next_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::services::registrations;
    use crate::structs::Service;

    fn desired() -> Wanted {
        let service = Service {
            name: "api".into(),
            port_label: "8080".into(),
            ..Service::default()
        };
        Wanted::only(
            registrations("a1", "web", &[service], &Default::default(), false)
                .into_iter()
                .map(|registration| (registration.id.clone(), registration))
                .collect(),
        )
    }

    fn step(sync: &mut ServiceSync, now: Instant, ops: &mut OpIds) -> Option<ConsulOp> {
        sync.poll(now, ops).map(|(_, io)| match io {
            Io::Consul(call) => call,
            other => panic!("not a consul call: {other:?}"),
        })
    }

    #[test]
    fn a_pass_reads_then_registers_then_waits_the_period() {
        let mut ops = OpIds::default();
        let mut sync = ServiceSync::default();
        let t0 = Instant::ZERO;
        assert_eq!(step(&mut sync, t0, &mut ops), None, "no consul, no sync");
        sync.enable(t0, "10.0.0.5".into());
        assert_eq!(step(&mut sync, t0, &mut ops), Some(ConsulOp::Services));
        assert_eq!(step(&mut sync, t0, &mut ops), None, "one call at a time");
        let stray = BTreeMap::from([(
            "_nomad-task-gone-web-api-8080".to_string(),
            RegisteredService::default(),
        )]);
        sync.outcome(t0, Ok(Reply::Services(stray)), desired);
        let Some(ConsulOp::Register { registration, address }) = step(&mut sync, t0, &mut ops) else {
            panic!("register first");
        };
        assert_eq!(
            (registration.id.as_str(), address.as_str()),
            ("_nomad-task-a1-web-api-8080", "10.0.0.5")
        );
        // A change during the pass: another pass right after this one.
        sync.changed(t0);
        sync.outcome(t0, Ok(Reply::Unit), desired);
        assert_eq!(
            step(&mut sync, t0, &mut ops),
            Some(ConsulOp::Deregister {
                id: "_nomad-task-gone-web-api-8080".into()
            })
        );
        sync.outcome(t0, Ok(Reply::Unit), desired);
        assert_eq!(sync.poll_timeout(), Some(t0));
        assert_eq!(step(&mut sync, t0, &mut ops), Some(ConsulOp::Services));
        sync.outcome(t0, Ok(Reply::Services(BTreeMap::new())), Wanted::default);
        assert_eq!(sync.poll_timeout(), Some(t0 + SERVICE_SYNC_PERIOD));
    }

    #[test]
    fn consul_down_ends_the_pass_and_the_period_retries() {
        let mut ops = OpIds::default();
        let mut sync = ServiceSync::default();
        let t0 = Instant::ZERO;
        sync.enable(t0, "10.0.0.5".into());
        assert_eq!(step(&mut sync, t0, &mut ops), Some(ConsulOp::Services));
        let refused = crate::client::IoError::new(crate::client::ErrorKind::Unavailable, "connection refused");
        sync.outcome(t0, Err(refused), desired);
        assert_eq!(sync.poll_timeout(), Some(t0 + SERVICE_SYNC_PERIOD));
        // A task change does not wait for the period.
        let t1 = t0 + Duration::from_secs(3);
        sync.changed(t1);
        assert_eq!(sync.poll_timeout(), Some(t1));
    }
}
