//! Which server a client-only agent calls, and what it does when none answers: Nomad's
//! client server manager in its simplest honest form.
//!
//! The agent knows its servers from `client { servers }`, or finds them in Consul's catalog
//! (`consul { client_auto_join }`). A call goes first to the server that answered last, then
//! round the list; when every server failed and the list came from Consul, the catalog is
//! asked once more (servers found that way may have moved) and the new list tried. A list
//! that was empty to begin with is looked up first. The driver carries out each step: it
//! sends the call, asks Consul, and reports back. Datadriven tests: `tests/testdata/servers`.

#[allow(unused_imports)]
use crate::prelude::*;

use core::time::Duration;

/// The servers one agent knows, and the one to try first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerList<A> {
    servers: Vec<A>,
    /// The position in `servers` of the last one that answered.
    preferred: usize,
    /// The servers may be looked up (in Consul) when none is known or none answers.
    discovery: bool,
}

/// One call's way through the list: its own copy of the list as it was when the call began
/// (another call may replace the shared one meanwhile), where it started and how far it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round<A> {
    list: Vec<A>,
    start: usize,
    step: usize,
    /// The list was empty: look it up before the first try.
    discover_first: bool,
    /// The lookup after every server failed has been made (it is made once per call).
    rediscovered: bool,
}

/// What the driver does next for a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next<A> {
    /// Send the call to this server; report with [`ServerList::answered`] if it answers.
    Call(A),
    /// Ask Consul for the servers; report with [`ServerList::discovered`].
    Discover,
    /// No server answered: the call fails.
    Exhausted,
}

impl<A: Clone + PartialEq> ServerList<A> {
    pub fn new(configured: Vec<A>, discovery: bool) -> Self {
        ServerList {
            servers: configured,
            preferred: 0,
            discovery,
        }
    }

    /// Whether this agent can reach servers at all: some known, or Consul to find them.
    pub fn is_known(&self) -> bool {
        self.discovery || !self.servers.is_empty()
    }

    pub fn servers(&self) -> &[A] {
        &self.servers
    }

    /// The server calls go to first (the one that answered last), if any is known.
    pub fn preferred(&self) -> Option<&A> {
        self.servers.get(self.preferred % self.servers.len().max(1))
    }

    /// An operator's new list (`PUT /v1/agent/servers`): calls start at its first.
    pub fn replace(&mut self, servers: Vec<A>) {
        self.servers = servers;
        self.preferred = 0;
    }

    /// A call begins: from the server that answered last.
    pub fn round(&self) -> Round<A> {
        Round {
            list: self.servers.clone(),
            start: self.preferred,
            step: 0,
            discover_first: self.servers.is_empty() && self.discovery,
            rediscovered: false,
        }
    }

    /// The call's next step: the next server round the list, a lookup, or the end.
    pub fn next(&self, round: &mut Round<A>) -> Next<A> {
        if round.discover_first {
            round.discover_first = false;
            return Next::Discover;
        }
        let count = round.list.len();
        if round.step < count {
            let server = round.list[(round.start + round.step) % count].clone();
            round.step += 1;
            return Next::Call(server);
        }
        // None of those answered: servers found through Consul may have moved.
        if !round.rediscovered && count > 0 && self.discovery {
            round.rediscovered = true;
            return Next::Discover;
        }
        Next::Exhausted
    }

    /// The server the call last went to answered: calls start there from now on.
    pub fn answered(&mut self, round: &Round<A>) {
        debug_assert!(round.step > 0, "an answer before any call");
        let count = round.list.len().max(1);
        self.preferred = (round.start + round.step.saturating_sub(1)) % count;
    }

    /// Consul's answer: the servers it lists replace the known ones (when it lists any), and
    /// the call goes round them from the first.
    pub fn discovered(&mut self, round: &mut Round<A>, found: Vec<A>) {
        if !found.is_empty() {
            self.servers = found.clone();
            self.preferred = 0;
        }
        round.start = self.preferred;
        round.step = 0;
        round.list = found;
    }
}

/// How long a client waits before attaching to its server again (`Agent.Attach`, the stream
/// servers call the client down): briefly at first — a client usually starts beside its
/// servers, and until it attaches, calls for it fall back to dialing its RPC address, which
/// may be unreachable — doubling up to [`REATTACH_PAUSE`] while attaching fails; at once
/// again after a stream that was up ends.
pub const REATTACH_FIRST: Duration = Duration::from_millis(50);
pub const REATTACH_PAUSE: Duration = Duration::from_secs(1);
const _: () = assert!(REATTACH_FIRST.as_nanos() < REATTACH_PAUSE.as_nanos(), "the pause grows");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachPause {
    next: Duration,
}

impl Default for AttachPause {
    fn default() -> Self {
        AttachPause { next: REATTACH_FIRST }
    }
}

impl AttachPause {
    /// A stream that was up ended: the next attach comes after the shortest pause.
    pub fn stream_ended(&mut self) {
        self.next = REATTACH_FIRST;
    }

    /// The pause before the next attempt; each one after it is twice as long, up to the cap.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(REATTACH_PAUSE);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_pauses_double_to_a_second_and_start_over_after_a_stream() {
        let mut pause = AttachPause::default();
        let ms = |n| Duration::from_millis(n);
        let taken: Vec<Duration> = (0..7).map(|_| pause.next_pause()).collect();
        assert_eq!(taken, [ms(50), ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]);
        pause.stream_ended();
        assert_eq!(pause.next_pause(), ms(50));
    }
}
