//! Claim capacity per access mode and the claim transition, with Nomad's error texts (§3.4,
//! HEAD behaviour: capacity is enforced strictly at claim time, #12112).

#[allow(unused_imports)]
use crate::prelude::*;

use crate::error::ErrorKind;
use crate::structs::{AccessMode, Allocation, AttachmentMode, ClaimMode, ClaimState, CsiVolume, CsiVolumeClaim};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("volume max claims reached")]
    MaxClaimsReached,
    #[error("volume is currently unschedulable")]
    Unschedulable,
    #[error("cannot change attachment mode of claimed volume")]
    AttachmentModeChange,
    #[error("cannot change access mode of claimed volume")]
    AccessModeChange,
    #[error("Unknown allocation: {0}")]
    UnknownAllocation(String),
}

impl ClaimError {
    /// Claims exhausted and an unschedulable volume pass by themselves (the holder leaves,
    /// the plugin turns healthy): [`ErrorKind::Busy`], which a claiming client retries.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClaimError::MaxClaimsReached | ClaimError::Unschedulable => ErrorKind::Busy,
            ClaimError::AttachmentModeChange | ClaimError::AccessModeChange | ClaimError::UnknownAllocation(_) => {
                ErrorKind::Refused
            }
        }
    }
}

impl CsiVolume {
    fn is_claimed(&self) -> bool {
        !self.read_claims.is_empty() || !self.write_claims.is_empty()
    }

    /// Writable: a writer access mode, or (unclaimed) a writer among the requested capabilities.
    pub fn writable(&self) -> bool {
        match self.access_mode {
            AccessMode::Unknown => self
                .requested_capabilities
                .iter()
                .any(|cap| cap.access_mode.is_writer()),
            mode => mode.is_writer(),
        }
    }

    pub fn read_schedulable(&self) -> bool {
        self.plugin_health.schedulable && self.resource_exhausted_ms == 0
    }

    pub fn write_schedulable(&self) -> bool {
        self.read_schedulable() && self.writable()
    }

    pub fn has_free_read_claims(&self) -> bool {
        match self.access_mode {
            AccessMode::SingleNodeReader => self.read_claims.is_empty(),
            AccessMode::SingleNodeWriter => self.read_claims.is_empty() && self.write_claims.is_empty(),
            AccessMode::MultiNodeReader
            | AccessMode::MultiNodeSingleWriter
            | AccessMode::MultiNodeMultiWriter
            | AccessMode::Unknown => true,
        }
    }

    pub fn has_free_write_claims(&self) -> bool {
        match self.access_mode {
            AccessMode::SingleNodeReader | AccessMode::MultiNodeReader => false,
            AccessMode::SingleNodeWriter | AccessMode::MultiNodeSingleWriter => self.write_claims.is_empty(),
            AccessMode::MultiNodeMultiWriter | AccessMode::Unknown => true,
        }
    }

    /// How many writers the access mode allows at once (`None` = unbounded).
    pub fn writers_max(&self) -> Option<usize> {
        match self.access_mode {
            AccessMode::SingleNodeReader | AccessMode::MultiNodeReader => Some(0),
            AccessMode::SingleNodeWriter | AccessMode::MultiNodeSingleWriter => Some(1),
            AccessMode::MultiNodeMultiWriter | AccessMode::Unknown => None,
        }
    }

    /// Applies a claim (taken, or a release checkpoint). `alloc` is the claiming allocation as
    /// the state store knows it, `None` when it does not exist (GC'd or never registered).
    /// Idempotent per allocation.
    pub fn claim(&mut self, claim: CsiVolumeClaim, alloc: Option<&Allocation>) -> Result<(), ClaimError> {
        if claim.mode == ClaimMode::Gc {
            return Ok(());
        }
        if claim.state != ClaimState::Taken {
            self.release(claim);
            return Ok(());
        }
        let is_current =
            self.read_claims.contains_key(&claim.allocation_id) || self.write_claims.contains_key(&claim.allocation_id);
        if self.is_claimed() && !is_current {
            if claim.attachment_mode != AttachmentMode::Unknown
                && self.attachment_mode != AttachmentMode::Unknown
                && claim.attachment_mode != self.attachment_mode
            {
                return Err(ClaimError::AttachmentModeChange);
            }
            if claim.access_mode != AccessMode::Unknown
                && self.access_mode != AccessMode::Unknown
                && claim.access_mode != self.access_mode
            {
                return Err(ClaimError::AccessModeChange);
            }
        }
        match claim.mode {
            ClaimMode::Read => self.claim_read(claim, alloc),
            ClaimMode::Write => self.claim_write(claim, alloc),
            ClaimMode::Gc => Ok(()),
        }
    }

    fn claim_read(&mut self, claim: CsiVolumeClaim, alloc: Option<&Allocation>) -> Result<(), ClaimError> {
        if self.read_claims.contains_key(&claim.allocation_id) {
            return Ok(());
        }
        if alloc.is_none() {
            return Err(ClaimError::UnknownAllocation(claim.allocation_id));
        }
        if !self.read_schedulable() {
            return Err(ClaimError::Unschedulable);
        }
        if !self.has_free_read_claims() {
            return Err(ClaimError::MaxClaimsReached);
        }
        self.take(claim, false);
        Ok(())
    }

    fn claim_write(&mut self, claim: CsiVolumeClaim, alloc: Option<&Allocation>) -> Result<(), ClaimError> {
        if self.write_claims.contains_key(&claim.allocation_id) {
            return Ok(());
        }
        if alloc.is_none() {
            return Err(ClaimError::UnknownAllocation(claim.allocation_id));
        }
        if !self.write_schedulable() {
            return Err(ClaimError::Unschedulable);
        }
        if !self.has_free_write_claims() {
            return Err(ClaimError::MaxClaimsReached);
        }
        self.take(claim, true);
        Ok(())
    }

    fn take(&mut self, claim: CsiVolumeClaim, write: bool) {
        if self.access_mode == AccessMode::Unknown {
            self.access_mode = claim.access_mode;
        }
        if self.attachment_mode == AttachmentMode::Unknown {
            self.attachment_mode = claim.attachment_mode;
        }
        let alloc_id = claim.allocation_id.clone();
        self.past_claims.remove(&alloc_id);
        if write {
            self.read_claims.remove(&alloc_id);
            self.write_claims.insert(alloc_id, claim);
        } else {
            self.write_claims.remove(&alloc_id);
            self.read_claims.insert(alloc_id, claim);
        }
    }

    /// A release checkpoint: `ReadyToFree` frees the claim; any other state records progress
    /// in `past_claims` while the claim keeps its capacity until freed.
    fn release(&mut self, claim: CsiVolumeClaim) {
        let alloc_id = claim.allocation_id.clone();
        if claim.state == ClaimState::ReadyToFree {
            self.read_claims.remove(&alloc_id);
            self.write_claims.remove(&alloc_id);
            self.past_claims.remove(&alloc_id);
            if self.read_claims.is_empty() && self.write_claims.is_empty() && self.past_claims.is_empty() {
                self.access_mode = AccessMode::Unknown;
                self.attachment_mode = AttachmentMode::Unknown;
            }
        } else {
            self.past_claims.insert(alloc_id, claim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use crate::prelude::*;
    use crate::structs::{CsiCapability, PluginHealth};

    fn volume(access: AccessMode) -> CsiVolume {
        CsiVolume {
            id: "vol".into(),
            namespace: "default".into(),
            plugin_id: "p".into(),
            access_mode: access,
            requested_capabilities: vec![CsiCapability {
                access_mode: AccessMode::MultiNodeMultiWriter,
                attachment_mode: AttachmentMode::FileSystem,
            }],
            plugin_health: PluginHealth {
                schedulable: true,
                ..PluginHealth::default()
            },
            ..CsiVolume::default()
        }
    }

    fn claim(alloc: &str, mode: ClaimMode, access: AccessMode) -> CsiVolumeClaim {
        CsiVolumeClaim {
            allocation_id: alloc.into(),
            node_id: "n1".into(),
            external_node_id: String::new(),
            mode,
            access_mode: access,
            attachment_mode: AttachmentMode::FileSystem,
            state: ClaimState::Taken,
        }
    }

    fn alloc(id: &str) -> Allocation {
        Allocation {
            id: id.into(),
            ..Allocation::default()
        }
    }

    /// Every access mode × (existing claims) × (new claim mode), against the table of §3.4.
    #[test]
    fn capacity_table() {
        use AccessMode::*;
        use ClaimMode::{Read, Write};
        // (mode, existing readers, existing writers, new claim, expected)
        type Case = (AccessMode, usize, usize, ClaimMode, Result<(), ClaimError>);
        let cases: &[Case] = &[
            (SingleNodeReader, 0, 0, Read, Ok(())),
            (SingleNodeReader, 1, 0, Read, Err(ClaimError::MaxClaimsReached)),
            (SingleNodeReader, 0, 0, Write, Err(ClaimError::Unschedulable)),
            (SingleNodeWriter, 0, 0, Read, Ok(())),
            (SingleNodeWriter, 1, 0, Read, Err(ClaimError::MaxClaimsReached)),
            (SingleNodeWriter, 0, 1, Read, Err(ClaimError::MaxClaimsReached)),
            (SingleNodeWriter, 0, 0, Write, Ok(())),
            (SingleNodeWriter, 1, 0, Write, Ok(())),
            (SingleNodeWriter, 0, 1, Write, Err(ClaimError::MaxClaimsReached)),
            (MultiNodeReader, 0, 0, Read, Ok(())),
            (MultiNodeReader, 5, 0, Read, Ok(())),
            (MultiNodeReader, 0, 0, Write, Err(ClaimError::Unschedulable)),
            (MultiNodeSingleWriter, 3, 0, Read, Ok(())),
            (MultiNodeSingleWriter, 3, 1, Read, Ok(())),
            (MultiNodeSingleWriter, 3, 0, Write, Ok(())),
            (MultiNodeSingleWriter, 0, 1, Write, Err(ClaimError::MaxClaimsReached)),
            (MultiNodeMultiWriter, 2, 2, Read, Ok(())),
            (MultiNodeMultiWriter, 2, 2, Write, Ok(())),
            (Unknown, 0, 0, Read, Ok(())),
            (Unknown, 0, 0, Write, Ok(())),
        ];
        for (mode, readers, writers, new, expected) in cases {
            let mut vol = volume(*mode);
            for i in 0..*readers {
                vol.read_claims
                    .insert(format!("r{i}"), claim(&format!("r{i}"), Read, *mode));
            }
            for i in 0..*writers {
                vol.write_claims
                    .insert(format!("w{i}"), claim(&format!("w{i}"), Write, *mode));
            }
            let before = vol.clone();
            let result = vol.claim(claim("new", *new, *mode), Some(&alloc("new")));
            assert_eq!(
                &result, expected,
                "{mode:?} readers={readers} writers={writers} claim={new:?}"
            );
            if result.is_err() {
                assert_eq!(vol, before, "a refused claim changes nothing");
            }
        }
    }

    #[test]
    fn unknown_mode_is_writable_only_with_a_writer_capability() {
        let mut vol = volume(AccessMode::Unknown);
        vol.requested_capabilities[0].access_mode = AccessMode::MultiNodeReader;
        assert!(!vol.writable());
        assert_eq!(
            vol.claim(claim("a", ClaimMode::Write, AccessMode::Unknown), Some(&alloc("a"))),
            Err(ClaimError::Unschedulable)
        );
    }

    #[test]
    fn claims_are_idempotent_per_alloc() {
        let mut vol = volume(AccessMode::SingleNodeWriter);
        let first = claim("a", ClaimMode::Write, AccessMode::SingleNodeWriter);
        assert_eq!(vol.claim(first.clone(), Some(&alloc("a"))), Ok(()));
        let after_first = vol.clone();
        assert_eq!(vol.claim(first, Some(&alloc("a"))), Ok(()));
        assert_eq!(vol, after_first);
    }

    #[test]
    fn first_claim_sets_modes_and_the_last_release_resets_them() {
        let mut vol = volume(AccessMode::Unknown);
        vol.claim(
            claim("a", ClaimMode::Write, AccessMode::SingleNodeWriter),
            Some(&alloc("a")),
        )
        .unwrap();
        assert_eq!(
            (vol.access_mode, vol.attachment_mode),
            (AccessMode::SingleNodeWriter, AttachmentMode::FileSystem)
        );
        // While releasing, the write claim keeps its capacity: no second writer.
        let mut releasing = claim("a", ClaimMode::Write, AccessMode::SingleNodeWriter);
        releasing.state = ClaimState::Unpublishing;
        vol.claim(releasing.clone(), None).unwrap();
        assert!(vol.write_claims.contains_key("a") && vol.past_claims.contains_key("a"));
        assert_eq!(
            vol.claim(
                claim("b", ClaimMode::Write, AccessMode::SingleNodeWriter),
                Some(&alloc("b"))
            ),
            Err(ClaimError::MaxClaimsReached)
        );
        releasing.state = ClaimState::ReadyToFree;
        vol.claim(releasing, None).unwrap();
        assert!(vol.write_claims.is_empty() && vol.past_claims.is_empty());
        assert_eq!(
            (vol.access_mode, vol.attachment_mode),
            (AccessMode::Unknown, AttachmentMode::Unknown)
        );
        assert_eq!(
            vol.claim(
                claim("b", ClaimMode::Write, AccessMode::SingleNodeWriter),
                Some(&alloc("b"))
            ),
            Ok(())
        );
    }

    #[test]
    fn modes_cannot_change_while_claimed() {
        let mut vol = volume(AccessMode::Unknown);
        vol.claim(
            claim("a", ClaimMode::Read, AccessMode::MultiNodeMultiWriter),
            Some(&alloc("a")),
        )
        .unwrap();
        let mut block = claim("b", ClaimMode::Read, AccessMode::MultiNodeMultiWriter);
        block.attachment_mode = AttachmentMode::BlockDevice;
        assert_eq!(
            vol.claim(block, Some(&alloc("b"))),
            Err(ClaimError::AttachmentModeChange)
        );
        assert_eq!(
            ClaimError::AttachmentModeChange.to_string(),
            "cannot change attachment mode of claimed volume"
        );
        let other_access = claim("c", ClaimMode::Read, AccessMode::MultiNodeReader);
        assert_eq!(
            vol.claim(other_access, Some(&alloc("c"))),
            Err(ClaimError::AccessModeChange)
        );
    }

    #[test]
    fn refusals_that_pass_by_themselves_are_busy() {
        assert_eq!(ClaimError::MaxClaimsReached.kind(), ErrorKind::Busy);
        assert_eq!(ClaimError::Unschedulable.kind(), ErrorKind::Busy);
        assert_eq!(ClaimError::AccessModeChange.kind(), ErrorKind::Refused);
        assert_eq!(ClaimError::UnknownAllocation("a".into()).kind(), ErrorKind::Refused);
    }

    #[test]
    fn unschedulable_and_unknown_allocs_are_refused() {
        let mut vol = volume(AccessMode::MultiNodeMultiWriter);
        assert_eq!(
            vol.claim(claim("a", ClaimMode::Read, AccessMode::MultiNodeMultiWriter), None),
            Err(ClaimError::UnknownAllocation("a".into()))
        );
        vol.plugin_health.schedulable = false;
        assert_eq!(
            vol.claim(
                claim("a", ClaimMode::Read, AccessMode::MultiNodeMultiWriter),
                Some(&alloc("a"))
            ),
            Err(ClaimError::Unschedulable)
        );
        assert_eq!(
            ClaimError::Unschedulable.to_string(),
            "volume is currently unschedulable"
        );
        assert_eq!(ClaimError::MaxClaimsReached.to_string(), "volume max claims reached");
    }
}
