//! Auth methods and binding rules in the state store. The checks that need the state (one
//! default method, a rule's method existing and never changing) run when the entry applies.

#[allow(unused_imports)]
use crate::prelude::*;

use super::AclState;
use crate::acl::auth::{AuthMethod, BindingRule};
use crate::error::ErrorKind;
use crate::fsm::{Response, Table};

fn invalid(text: String) -> Response {
    Response::Error(ErrorKind::Invalid, text)
}

impl AclState {
    pub fn auth_method(&self, name: &str) -> Option<&AuthMethod> {
        self.auth_methods.get(name)
    }

    /// Auth methods in name order.
    pub fn auth_methods(&self) -> impl Iterator<Item = &AuthMethod> {
        self.auth_methods.values()
    }

    pub fn default_auth_method(&self) -> Option<&AuthMethod> {
        self.auth_methods.values().find(|method| method.default)
    }

    pub fn binding_rule(&self, id: &str) -> Option<&BindingRule> {
        self.binding_rules.get(id)
    }

    /// Binding rules in ID order.
    pub fn binding_rules(&self) -> impl Iterator<Item = &BindingRule> {
        self.binding_rules.values()
    }

    pub(super) fn upsert_auth_methods(
        &mut self,
        index: u64,
        methods: &[AuthMethod],
        changed: &mut Vec<Table>,
    ) -> Response {
        let defaults: Vec<&str> = methods.iter().filter(|m| m.default).map(|m| m.name.as_str()).collect();
        if defaults.len() > 1 {
            return invalid(format!("default method already exists: {}", defaults[0]));
        }
        if let Some(new) = defaults.first()
            && let Some(held) = self.default_auth_method()
            && held.name != *new
        {
            return invalid(format!("default method already exists: {}", held.name));
        }
        for method in methods {
            let mut method = method.clone();
            method.create_index = self
                .auth_methods
                .get(&method.name)
                .map_or(index, |held| held.create_index);
            method.modify_index = index;
            self.auth_methods.insert(method.name.clone(), method);
        }
        changed.push(Table::AclAuthMethods);
        Response::Done
    }

    /// Deletes the methods and the binding rules that name them.
    pub(super) fn delete_auth_methods(&mut self, names: &[String], changed: &mut Vec<Table>) -> Response {
        if let Some(missing) = names.iter().find(|name| !self.auth_methods.contains_key(*name)) {
            return Response::Error(ErrorKind::NotFound, format!("ACL auth method not found: {missing}"));
        }
        for name in names {
            self.auth_methods.remove(name);
        }
        let before = self.binding_rules.len();
        self.binding_rules.retain(|_, rule| !names.contains(&rule.auth_method));
        if self.binding_rules.len() != before {
            changed.push(Table::AclBindingRules);
        }
        changed.push(Table::AclAuthMethods);
        Response::Done
    }

    pub(super) fn upsert_binding_rules(
        &mut self,
        index: u64,
        rules: &[BindingRule],
        changed: &mut Vec<Table>,
    ) -> Response {
        for rule in rules {
            if let Some(held) = self.binding_rules.get(&rule.id)
                && held.auth_method != rule.auth_method
            {
                return invalid("cannot update auth method for binding rule, create a new rule instead".into());
            }
            if !self.auth_methods.contains_key(&rule.auth_method) {
                return invalid(format!("ACL auth method {} not found", rule.auth_method));
            }
        }
        for rule in rules {
            let mut rule = rule.clone();
            if let Some(held) = self.binding_rules.get(&rule.id) {
                rule.create_index = held.create_index;
                rule.create_time_ms = held.create_time_ms;
            } else {
                rule.create_index = index;
            }
            rule.modify_index = index;
            self.binding_rules.insert(rule.id.clone(), rule);
        }
        changed.push(Table::AclBindingRules);
        Response::Done
    }

    pub(super) fn delete_binding_rules(&mut self, ids: &[String], changed: &mut Vec<Table>) -> Response {
        if let Some(missing) = ids.iter().find(|id| !self.binding_rules.contains_key(*id)) {
            return Response::Error(ErrorKind::NotFound, format!("ACL binding rule not found: {missing}"));
        }
        for id in ids {
            self.binding_rules.remove(id);
        }
        changed.push(Table::AclBindingRules);
        Response::Done
    }
}

impl crate::acl::auth::BindingTables for AclState {
    fn binding_rules(&self) -> impl Iterator<Item = &BindingRule> {
        AclState::binding_rules(self)
    }

    fn role_id(&self, name: &str) -> Option<&str> {
        self.role_by_name(name).map(|role| role.id.as_str())
    }

    fn has_policy(&self, name: &str) -> bool {
        self.policy(name).is_some()
    }
}
