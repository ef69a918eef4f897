//! Server membership by SWIM gossip (foca), carrying Nomad's server tags.
//!
//! Inputs: gossip packets ([`Membership::handle_packet`]), join requests for an address
//! ([`Membership::join`]) and timer expiry ([`Membership::handle_timeout`]).
//! Outputs: packets to send ([`Membership::poll_send`]) and a "members changed" flag that the
//! server uses to re-run its bootstrap decision and leader reconciliation.
//!
//! foca is sans-IO too: it writes packets and timer requests into an accumulating runtime that
//! this module drains, converting foca's relative timers into core [`Instant`]s.

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::net::SocketAddr;
use core::num::{NonZeroU8, NonZeroUsize};

use foca::{AccumulatingRuntime, Foca, Identity, NoCustomBroadcast, OwnedNotification, PostcardCodec, State, Timer};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::config::GossipTiming;
use crate::time::Instant;

/// The tags a Nomad server publishes through serf, typed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServerTags {
    pub region: String,
    pub datacenter: String,
    /// The server's Raft id.
    pub id: u64,
    pub rpc_addr: SocketAddr,
    /// `bootstrap_expect`; 0 is published as "no tag".
    pub expect: u32,
    /// Set when `bootstrap_expect == 1` (Nomad's `bootstrap=1`).
    pub bootstrap: bool,
    pub nonvoter: bool,
    pub build: String,
}

impl ServerTags {
    /// The string map Nomad shows in `/v1/agent/members`.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut tags = BTreeMap::new();
        tags.insert("role".to_string(), "nomad".to_string());
        tags.insert("region".to_string(), self.region.clone());
        tags.insert("dc".to_string(), self.datacenter.clone());
        tags.insert("build".to_string(), self.build.clone());
        tags.insert("id".to_string(), self.id.to_string());
        tags.insert("rpc_addr".to_string(), self.rpc_addr.ip().to_string());
        tags.insert("port".to_string(), self.rpc_addr.port().to_string());
        tags.insert("vsn".to_string(), "1".to_string());
        tags.insert("raft_vsn".to_string(), "3".to_string());
        if self.expect != 0 {
            tags.insert("expect".to_string(), self.expect.to_string());
        }
        if self.bootstrap {
            tags.insert("bootstrap".to_string(), "1".to_string());
        }
        if self.nonvoter {
            tags.insert("nonvoter".to_string(), "1".to_string());
        }
        tags
    }
}

/// A gossip identity: a server's name, gossip address, tags and generation.
///
/// `tags == None` marks a placeholder used to announce ourselves to a bare address (join);
/// it never becomes a member. The generation grows with every restart (boot count in the high
/// half) and every foca renewal (low half), so a restarted server supersedes its old self.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MemberId {
    pub name: String,
    pub addr: SocketAddr,
    pub generation: u64,
    pub tags: Option<ServerTags>,
}

impl MemberId {
    fn placeholder(addr: SocketAddr) -> Self {
        MemberId {
            name: String::new(),
            addr,
            generation: 0,
            tags: None,
        }
    }
}

impl Identity for MemberId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        self.tags.as_ref()?;
        Some(MemberId {
            generation: self.generation + 1,
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        (self.generation, &self.name) > (adversary.generation, &adversary.name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MemberStatus {
    Alive,
    Suspect,
    Failed,
    /// A failed member an operator forced out (`server force-leave`).
    Left,
}

impl MemberStatus {
    /// Serf's status words, as `/v1/agent/members` shows them.
    pub fn as_serf_str(self) -> &'static str {
        match self {
            MemberStatus::Alive | MemberStatus::Suspect => "alive",
            MemberStatus::Failed => "failed",
            MemberStatus::Left => "left",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub id: MemberId,
    pub status: MemberStatus,
}

type Gossip = Foca<MemberId, PostcardCodec, ChaCha8Rng, NoCustomBroadcast>;

pub struct Membership {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    me: MemberId,
    foca: Gossip,
    runtime: AccumulatingRuntime<MemberId>,
    timers: BTreeMap<(Instant, u64), Timer<MemberId>>,
    timer_seq: u64,
    outbox: VecDeque<(SocketAddr, Vec<u8>)>,
    changed: bool,
    /// Failed members an operator forced out, and whether to hide them (`-prune`).
    left: BTreeMap<MemberId, bool>,
}

impl core::fmt::Debug for Membership {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Membership")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Membership {
    pub fn new(me: MemberId, timing: &GossipTiming, seed: u64) -> Self {
        assert!(me.tags.is_some(), "a member identity carries tags");
        let mut config = foca::Config::new_lan(core::num::NonZeroU32::new(8).expect("non-zero"));
        config.probe_period = timing.probe_period;
        config.probe_rtt = timing.probe_rtt;
        config.suspect_to_down_after = timing.suspect_to_down_after;
        config.remove_down_after = Some(timing.remove_down_after);
        config.max_transmissions = NonZeroU8::new(6).expect("non-zero");
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: timing.gossip_period,
            num_members: NonZeroUsize::new(3).expect("non-zero"),
        });
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: timing.announce_period,
            num_members: NonZeroUsize::new(1).expect("non-zero"),
        });
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: timing.announce_down_period,
            num_members: NonZeroUsize::new(2).expect("non-zero"),
        });
        let foca = Foca::new(me.clone(), config, ChaCha8Rng::seed_from_u64(seed), PostcardCodec);
        Membership {
            clock: crate::time::Monotonic::default(),
            me,
            foca,
            runtime: AccumulatingRuntime::new(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            outbox: VecDeque::new(),
            changed: true,
            left: BTreeMap::new(),
        }
    }

    pub fn me(&self) -> &MemberId {
        &self.me
    }

    /// Announces ourselves to `addr`; the member there answers with the cluster's view.
    pub fn join(&mut self, now: Instant, addr: SocketAddr) {
        if addr == self.me.addr {
            return;
        }
        if let Err(error) = self.foca.announce(MemberId::placeholder(addr), &mut self.runtime) {
            tracing::debug!(%addr, %error, "gossip announce failed");
        }
        self.drain(now);
    }

    pub fn handle_packet(&mut self, now: Instant, data: &[u8]) {
        if let Err(error) = self.foca.handle_data(data, &mut self.runtime) {
            tracing::debug!(%error, "gossip packet ignored");
        }
        self.drain(now);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.clock.observe(now);
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let timer = entry.remove();
            if let Err(error) = self.foca.handle_timer(timer, &mut self.runtime) {
                tracing::debug!(%error, "gossip timer failed");
            }
        }
        self.drain(now);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    pub fn poll_send(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.outbox.pop_front()
    }

    /// True once after any member joined, changed identity or failed.
    pub fn take_changed(&mut self) -> bool {
        core::mem::take(&mut self.changed)
    }

    /// Live members (alive or suspect) including ourselves, ordered by name.
    pub fn live_members(&self) -> Vec<MemberId> {
        let mut members: Vec<MemberId> = self
            .foca
            .iter_members()
            .map(|member| member.id().clone())
            .filter(|id| id.tags.is_some())
            .collect();
        members.push(self.me.clone());
        members.sort();
        members
    }

    /// Marks a failed member as having left: shown `left`, or not at all when `prune`. Only
    /// this server's view changes; a member that comes back is alive again.
    pub fn force_leave(&mut self, id: &MemberId, prune: bool) {
        self.left.insert(id.clone(), prune);
        self.changed = true;
    }

    /// Every member foca still tracks (including failed ones) and ourselves, ordered by name.
    pub fn all_members(&self) -> Vec<MemberView> {
        let mut members: Vec<MemberView> = self
            .foca
            .iter_membership_state()
            .filter(|member| member.id().tags.is_some())
            .filter_map(|member| {
                let status = match (member.state(), self.left.get(member.id())) {
                    (State::Down, Some(true)) => return None,
                    (State::Down, Some(false)) => MemberStatus::Left,
                    (State::Down, None) => MemberStatus::Failed,
                    (State::Alive, _) => MemberStatus::Alive,
                    (State::Suspect, _) => MemberStatus::Suspect,
                };
                Some(MemberView {
                    id: member.id().clone(),
                    status,
                })
            })
            .collect();
        members.push(MemberView {
            id: self.me.clone(),
            status: MemberStatus::Alive,
        });
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members
    }

    /// Number of other members currently believed alive.
    pub fn peer_count(&self) -> usize {
        self.foca.num_members()
    }

    fn drain(&mut self, now: Instant) {
        while let Some((to, data)) = self.runtime.to_send() {
            self.outbox.push_back((to.addr, data.to_vec()));
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            self.timer_seq += 1;
            self.timers.insert((now + after, self.timer_seq), timer);
        }
        while let Some(notification) = self.runtime.to_notify() {
            match notification {
                OwnedNotification::MemberUp(id) => {
                    tracing::debug!(member = %id.name, addr = %id.addr, "member up");
                    self.changed = true;
                }
                OwnedNotification::MemberDown(id) => {
                    tracing::debug!(member = %id.name, addr = %id.addr, "member down");
                    self.changed = true;
                }
                OwnedNotification::Rename(old, new) => {
                    tracing::debug!(old = %old.name, new = %new.name, "member renamed");
                    self.changed = true;
                }
                OwnedNotification::Rejoin(id) => {
                    tracing::info!(generation = id.generation, "rejoined gossip with a renewed identity");
                    self.me = id;
                    self.changed = true;
                }
                OwnedNotification::Active | OwnedNotification::Idle | OwnedNotification::Defunct => {}
            }
        }
    }
}
