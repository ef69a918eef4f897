//! When the client fingerprints what lies outside its plugins: every driver and device plugin
//! every [`DRIVER_FINGERPRINT_INTERVAL`] (their health and attributes change under a running
//! agent), the local Consul agent every [`CONSUL_FINGERPRINT_INTERVAL`] (Nomad's consul
//! fingerprinter period) once Consul is in use. The driver takes each fingerprint on
//! [`ClientAction::Fingerprint`] and hands the result back as `ClientInput::Drivers` and
//! `Devices`, or `ConsulAttributes`.

use super::*;

/// How often drivers and device plugins are fingerprinted again.
pub const DRIVER_FINGERPRINT_INTERVAL: Duration = Duration::from_secs(30);
/// How often the local Consul agent is fingerprinted (Nomad's consul fingerprinter period).
pub const CONSUL_FINGERPRINT_INTERVAL: Duration = Duration::from_secs(15);

/// What a [`ClientAction::Fingerprint`] asks the driver to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fingerprint {
    /// Every driver, then every device plugin.
    Drivers,
    /// The local Consul agent's `consul.*` attributes.
    Consul,
}

/// The next fingerprint of each kind, once it is started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Cadences {
    next: BTreeMap<Fingerprint, Instant>,
}

impl Cadences {
    pub(super) fn start(&mut self, now: Instant, what: Fingerprint) {
        self.next.entry(what).or_insert(now + interval(what));
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.next.values().min().copied()
    }

    /// The fingerprints due now, each scheduled again one interval on.
    pub(super) fn due(&mut self, now: Instant) -> Vec<Fingerprint> {
        let due: Vec<Fingerprint> = self
            .next
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(what, _)| *what)
            .collect();
        for what in &due {
            self.next.insert(*what, now + interval(*what));
        }
        due
    }
}

fn interval(what: Fingerprint) -> Duration {
    match what {
        Fingerprint::Drivers => DRIVER_FINGERPRINT_INTERVAL,
        Fingerprint::Consul => CONSUL_FINGERPRINT_INTERVAL,
    }
}

impl Client {
    /// Fingerprints the local Consul agent from now on (the client uses Consul).
    pub fn enable_consul_fingerprint(&mut self, now: Instant) {
        self.cadences.start(now, Fingerprint::Consul);
    }

    pub(super) fn fingerprint_due(&mut self, now: Instant) {
        for what in self.cadences.due(now) {
            self.actions.push_back(ClientAction::Fingerprint(what));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_comes_round_at_its_own_interval_once_started() {
        let mut cadences = Cadences::default();
        assert_eq!(cadences.poll_timeout(), None);
        let t0 = Instant::ZERO;
        cadences.start(t0, Fingerprint::Drivers);
        cadences.start(t0, Fingerprint::Consul);
        assert_eq!(cadences.poll_timeout(), Some(t0 + CONSUL_FINGERPRINT_INTERVAL));
        assert_eq!(cadences.due(t0 + Duration::from_secs(14)), []);
        assert_eq!(cadences.due(t0 + Duration::from_secs(15)), [Fingerprint::Consul]);
        assert_eq!(
            cadences.due(t0 + Duration::from_secs(30)),
            [Fingerprint::Drivers, Fingerprint::Consul]
        );
        assert_eq!(cadences.poll_timeout(), Some(t0 + Duration::from_secs(45)));
        cadences.start(t0 + Duration::from_secs(31), Fingerprint::Drivers);
        // Drivers stay due at 60 s, whatever a second start says.
        assert_eq!(cadences.due(t0 + Duration::from_secs(59)), [Fingerprint::Consul]);
        assert_eq!(cadences.due(t0 + Duration::from_secs(60)), [Fingerprint::Drivers]);
    }
}
