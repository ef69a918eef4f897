//! The replicated autopilot settings (`Command::AutopilotSetConfig`).

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Response, ServerState, Table};
use crate::autopilot::{AutopilotConfig, CAS_MISMATCH};
use crate::error::ErrorKind;

impl ServerState {
    /// The autopilot settings an operator set, if any.
    pub fn autopilot_config(&self) -> Option<&AutopilotConfig> {
        self.autopilot.as_ref()
    }

    pub(super) fn apply_autopilot(&mut self, index: u64, config: &AutopilotConfig, cas: Option<u64>) -> Response {
        let current = self.autopilot.as_ref().map_or(0, |config| config.modify_index);
        if cas.is_some_and(|cas| cas != current) {
            return Response::Error(ErrorKind::Conflict, CAS_MISMATCH.into());
        }
        let create_index = self.autopilot.as_ref().map_or(index, |config| config.create_index);
        self.autopilot = Some(AutopilotConfig {
            create_index,
            modify_index: index,
            ..*config
        });
        self.touch(Table::Autopilot, index);
        Response::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::{Command, Entry};

    fn set(state: &mut ServerState, index: u64, stabilization_secs: u64, cas: Option<u64>) -> Response {
        let config = AutopilotConfig {
            server_stabilization_time: core::time::Duration::from_secs(stabilization_secs),
            ..AutopilotConfig::default()
        };
        let entry = Entry {
            at_unix_ms: 0,
            command: Command::AutopilotSetConfig { config, cas },
        };
        state.apply(index, &entry)
    }

    #[test]
    fn settings_are_replaced_and_a_stale_check_and_set_changes_nothing() {
        let mut state = ServerState::default();
        assert!(state.autopilot_config().is_none());
        assert_eq!(set(&mut state, 1, 20, Some(0)), Response::Done);
        assert_eq!(set(&mut state, 2, 30, None), Response::Done);
        let stored = *state.autopilot_config().unwrap();
        assert_eq!((stored.create_index, stored.modify_index), (1, 2));
        assert_eq!(stored.server_stabilization_time.as_secs(), 30);
        assert_eq!(
            set(&mut state, 3, 40, Some(1)),
            Response::Error(ErrorKind::Conflict, CAS_MISMATCH.into())
        );
        assert_eq!(
            state.autopilot_config().unwrap().server_stabilization_time.as_secs(),
            30
        );
        assert_eq!(set(&mut state, 4, 40, Some(2)), Response::Done);
        assert_eq!(state.autopilot_config().unwrap().modify_index, 4);
    }
}
