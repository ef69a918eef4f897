//! ACL roles and one-time tokens in the state store. Every check that needs the state (a
//! unique name, existing policies, an unexpired one-time token) is made here, when the entry
//! is applied, so two racing writes cannot both pass it.

#[allow(unused_imports)]
use crate::prelude::*;

use super::AclState;
use crate::acl::{AclRole, OneTimeToken, PERMISSION_DENIED};
use crate::error::ErrorKind;
use crate::fsm::{Response, Table};

fn invalid(text: String) -> Response {
    Response::Error(ErrorKind::Invalid, text)
}

impl AclState {
    pub fn role(&self, id: &str) -> Option<&AclRole> {
        self.roles.get(id)
    }

    pub fn role_by_name(&self, name: &str) -> Option<&AclRole> {
        self.role_names.get(name).and_then(|id| self.roles.get(id))
    }

    /// Roles in ID order.
    pub fn roles(&self) -> impl Iterator<Item = &AclRole> {
        self.roles.values()
    }

    pub fn one_time_token(&self, secret: &str) -> Option<&OneTimeToken> {
        self.one_time.get(secret)
    }

    pub(super) fn upsert_roles(&mut self, index: u64, roles: &[AclRole], changed: &mut Vec<Table>) -> Response {
        if let Err(error) = self.check_roles(roles) {
            return invalid(error);
        }
        for role in roles {
            let mut role = role.clone().deduplicated();
            match self.roles.get(&role.id) {
                Some(held) => {
                    role.create_index = held.create_index;
                    let old_name = held.name.clone();
                    self.role_names.remove(&old_name);
                }
                None => role.create_index = index,
            }
            role.modify_index = index;
            self.role_names.insert(role.name.clone(), role.id.clone());
            self.roles.insert(role.id.clone(), role);
        }
        changed.push(Table::AclRoles);
        Response::Done
    }

    /// Nomad's checks (`ACL.UpsertRoles`), against the state and within the batch.
    fn check_roles(&self, roles: &[AclRole]) -> Result<(), String> {
        let mut names = alloc::collections::BTreeMap::new();
        for (at, role) in roles.iter().enumerate() {
            role.validate().map_err(|error| format!("role {at} invalid: {error}"))?;
            let taken = self.role_names.get(&role.name).is_some_and(|holder| *holder != role.id)
                || names.insert(role.name.clone(), role.id.clone()).is_some();
            if taken {
                return Err(format!("role with name {} already exists", role.name));
            }
            if let Some(missing) = role.policies.iter().find(|name| self.policies.get(*name).is_none()) {
                return Err(format!("cannot find policy {missing}"));
            }
        }
        Ok(())
    }

    pub(super) fn delete_roles(&mut self, ids: &[String], changed: &mut Vec<Table>) -> Response {
        if let Some(missing) = ids.iter().find(|id| !self.roles.contains_key(*id)) {
            return Response::Error(ErrorKind::NotFound, format!("ACL role not found: {missing}"));
        }
        for id in ids {
            if let Some(role) = self.roles.remove(id) {
                self.role_names.remove(&role.name);
            }
        }
        changed.push(Table::AclRoles);
        Response::Done
    }

    pub(super) fn upsert_one_time(
        &mut self,
        index: u64,
        at_ms: u64,
        token: &OneTimeToken,
        changed: &mut Vec<Table>,
    ) -> Response {
        if !self.tokens.contains_key(&token.accessor_id) {
            return Response::Error(ErrorKind::PermissionDenied, PERMISSION_DENIED.into());
        }
        self.one_time.retain(|_, held| held.expires_at_ms > at_ms);
        let mut token = token.clone();
        token.create_index = index;
        token.modify_index = index;
        self.one_time.insert(token.one_time_secret_id.clone(), token);
        changed.push(Table::AclOneTimeTokens);
        Response::Done
    }

    pub(super) fn exchange_one_time(&mut self, at_ms: u64, secret: &str, changed: &mut Vec<Table>) -> Response {
        let accessor = match self.one_time.get(secret) {
            Some(held) if held.expires_at_ms > at_ms && self.tokens.contains_key(&held.accessor_id) => {
                held.accessor_id.clone()
            }
            _ => return Response::Error(ErrorKind::PermissionDenied, PERMISSION_DENIED.into()),
        };
        self.drop_one_time_of(&accessor, changed);
        Response::Done
    }

    /// Drops every one-time token of the ACL token `accessor`.
    pub(super) fn drop_one_time_of(&mut self, accessor: &str, changed: &mut Vec<Table>) {
        let before = self.one_time.len();
        self.one_time.retain(|_, held| held.accessor_id != accessor);
        if self.one_time.len() != before {
            changed.push(Table::AclOneTimeTokens);
        }
    }
}
