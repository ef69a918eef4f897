//! Consul service identity token accessors in the state store: written once the leader has
//! created the tokens in Consul, removed once it has revoked them.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Command, Response, ServerState, Table};
use crate::connect::SiTokenAccessor;

impl ServerState {
    pub(super) fn apply_si_accessors(&mut self, index: u64, command: &Command) -> Response {
        match command {
            Command::SiAccessorsUpsert { accessors } => {
                for accessor in accessors {
                    let mut accessor = accessor.clone();
                    accessor.create_index = self
                        .si_accessors
                        .get(&accessor.accessor_id)
                        .map_or(index, |existing| existing.create_index);
                    self.si_accessors.insert(accessor.accessor_id.clone(), accessor);
                }
            }
            Command::SiAccessorsDelete { accessor_ids } => {
                for id in accessor_ids {
                    self.si_accessors.delete(id);
                }
            }
            other => unreachable!("{} is not routed here", other.name()),
        }
        self.touch(Table::SiTokenAccessors, index);
        Response::Done
    }

    pub fn si_accessor(&self, accessor_id: &str) -> Option<&SiTokenAccessor> {
        self.si_accessors.get(accessor_id)
    }

    pub fn si_accessors(&self) -> impl Iterator<Item = &SiTokenAccessor> {
        self.si_accessors.values()
    }

    pub fn si_accessors_of_alloc<'a>(&'a self, alloc_id: &'a str) -> impl Iterator<Item = &'a SiTokenAccessor> + 'a {
        self.si_accessors
            .values()
            .filter(move |accessor| accessor.alloc_id == alloc_id)
    }
}
