//! The `template` task hook (Nomad's template hook over consul-template): renders every
//! `template` block before the task starts, and while it runs watches the Nomad variables the
//! templates read, re-rendering on a change and acting on the task as each template's
//! `change_mode` says (`restart`, `signal`, `noop`).
//!
//! Rendering itself (Go's template syntax) is the driver's (`Io::RenderTemplate`); what a
//! template reads is found by rendering it: paths not supplied yet are fetched from the
//! servers (`ServerRequest::VariablesRead`, answered by the leader) and the template rendered
//! again, as consul-template discovers its dependencies. A `nomadVar` of a path that holds no
//! variable blocks the task's start with Nomad's `Missing: nomad.var.block(...)` event until
//! the variable exists. While the task runs the variables are read again every
//! [`TEMPLATE_POLL`].

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use crate::client::{Io, Outcome, RenderReply, RenderRequest, Reply};
use crate::op::{OpId, OpIds};
use crate::rpc::{ServerReply, ServerRequest, VariableItems};
use crate::structs::{TEMPLATE_CHANGE_MODE_RESTART, TEMPLATE_CHANGE_MODE_SIGNAL, Template, signal_number};
use crate::time::Instant;

/// How often a running task's variables are read again, and how long a blocked render or a
/// failed read waits before trying again.
pub const TEMPLATE_POLL: Duration = Duration::from_secs(5);
pub const TEMPLATE_RETRY: Duration = Duration::from_secs(5);
/// The task event type of template messages (Nomad's consul-template source name).
pub const TEMPLATE_EVENT: &str = "Template";

/// What the hook asks of its task runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateOut {
    Io {
        op: OpId,
        io: Box<Io>,
    },
    Event {
        kind: &'static str,
        message: String,
    },
    /// Every template is rendered (prestart); the `KEY=value` lines of `env = true`
    /// templates join the task's environment.
    Rendered {
        env: BTreeMap<String, String>,
    },
    /// A template cannot be rendered: the task fails to start.
    Failed(String),
    /// A template with `change_mode = "restart"` changed: restart the task.
    Restart(String),
    /// Templates with `change_mode = "signal"` changed: send the task this signal.
    Signal(i32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Render {
    content: String,
    used: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Mode {
    Idle,
    /// Rendering template `next` before the task starts.
    Prestart {
        next: usize,
    },
    /// The task runs: variables are polled; `queue` holds templates to render again.
    Watch {
        queue: Vec<usize>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Pending {
    Render(usize),
    /// A read of these paths; in prestart it feeds the current template, while watching it is
    /// the poll.
    Fetch(BTreeSet<String>),
    Signal,
}

#[derive(Debug)]
pub struct TemplateRunner {
    templates: Vec<Template>,
    task_dir: String,
    vars: BTreeMap<String, Option<VariableItems>>,
    /// Each template's last complete render.
    rendered: Vec<Option<Render>>,
    mode: Mode,
    pending: Option<(OpId, Pending)>,
    wake_at: Option<Instant>,
    /// Paths a blocked prestart render waits for.
    blocked: BTreeSet<String>,
    /// Missing paths already reported in an event (reported once per prestart).
    reported: BTreeSet<String>,
    /// Templates whose content changed while watching, not yet acted on.
    changed: BTreeSet<usize>,
}

impl TemplateRunner {
    pub fn new(templates: Vec<Template>, task_dir: String) -> Self {
        let count = templates.len();
        TemplateRunner {
            templates,
            task_dir,
            vars: BTreeMap::new(),
            rendered: vec![None; count],
            mode: Mode::Idle,
            pending: None,
            wake_at: None,
            blocked: BTreeSet::new(),
            reported: BTreeSet::new(),
            changed: BTreeSet::new(),
        }
    }

    pub fn owns(&self, op: OpId) -> bool {
        self.pending.as_ref().is_some_and(|(pending, _)| *pending == op)
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.wake_at.filter(|_| self.pending.is_none())
    }

    /// Stops whatever the hook was doing (the task is stopping or exited); an outcome still
    /// in flight is no longer this hook's.
    pub fn cancel(&mut self) {
        self.mode = Mode::Idle;
        self.pending = None;
        self.wake_at = None;
        self.changed.clear();
    }

    /// Renders every template, in order, before the task starts.
    pub fn prestart(
        &mut self,
        now: Instant,
        env: &BTreeMap<String, String>,
        ops: &mut OpIds,
        out: &mut Vec<TemplateOut>,
    ) {
        self.cancel();
        self.reported.clear();
        self.blocked.clear();
        self.mode = Mode::Prestart { next: 0 };
        self.advance(now, env, ops, out);
    }

    /// The task runs: watch the variables the templates read.
    pub fn watch(&mut self, now: Instant) {
        self.cancel();
        self.mode = Mode::Watch { queue: Vec::new() };
        self.schedule_poll(now);
    }

    /// The signal sent for this hook is `op` (its outcome is only reported).
    pub fn track_signal(&mut self, op: OpId) {
        if self.pending.is_none() {
            self.pending = Some((op, Pending::Signal));
        }
    }

    fn used_paths(&self) -> BTreeSet<String> {
        self.rendered
            .iter()
            .flatten()
            .flat_map(|render| render.used.iter().cloned())
            .collect()
    }

    fn schedule_poll(&mut self, now: Instant) {
        self.wake_at = (!self.used_paths().is_empty()).then_some(now + TEMPLATE_POLL);
    }

    fn issue(&mut self, pending: Pending, io: Io, ops: &mut OpIds, out: &mut Vec<TemplateOut>) {
        let op = ops.allocate();
        self.pending = Some((op, pending));
        out.push(TemplateOut::Io { op, io: Box::new(io) });
    }

    fn render(&mut self, index: usize, env: &BTreeMap<String, String>, ops: &mut OpIds, out: &mut Vec<TemplateOut>) {
        let request = RenderRequest {
            template: self.templates[index].clone(),
            task_dir: self.task_dir.clone(),
            env: env.clone(),
            variables: self
                .vars
                .iter()
                .map(|(path, variable)| (path.clone(), variable.as_ref().map(|v| v.items.0.clone())))
                .collect(),
        };
        self.issue(Pending::Render(index), Io::RenderTemplate(Box::new(request)), ops, out);
    }

    fn fetch(&mut self, paths: BTreeSet<String>, ops: &mut OpIds, out: &mut Vec<TemplateOut>) {
        let request = ServerRequest::VariablesRead {
            paths: paths.iter().cloned().collect(),
            node_id: String::new(),
            secret_id: String::new(),
        };
        self.issue(Pending::Fetch(paths), Io::Server(request), ops, out);
    }

    /// Goes on with the current mode until it needs I/O or a timer.
    fn advance(&mut self, now: Instant, env: &BTreeMap<String, String>, ops: &mut OpIds, out: &mut Vec<TemplateOut>) {
        match self.mode.clone() {
            Mode::Idle => {}
            Mode::Prestart { next } if next == self.templates.len() => {
                self.mode = Mode::Idle;
                out.push(TemplateOut::Rendered { env: self.env_vars() });
            }
            Mode::Prestart { next } => self.render(next, env, ops, out),
            Mode::Watch { queue } => match queue.first() {
                Some(&index) => self.render(index, env, ops, out),
                None => self.apply_changes(now, out),
            },
        }
    }

    /// The `KEY=value` lines of every `env = true` template, later templates winning.
    fn env_vars(&self) -> BTreeMap<String, String> {
        self.templates
            .iter()
            .zip(&self.rendered)
            .filter(|(template, _)| template.envvars)
            .filter_map(|(_, render)| render.as_ref())
            .flat_map(|render| parse_env_file(&render.content))
            .collect()
    }

    /// Acts on the templates re-rendered with new content: a restart wins over signals.
    fn apply_changes(&mut self, now: Instant, out: &mut Vec<TemplateOut>) {
        let changed = core::mem::take(&mut self.changed);
        let modes: Vec<&Template> = changed.iter().map(|index| &self.templates[*index]).collect();
        if modes
            .iter()
            .any(|template| template.change_mode == TEMPLATE_CHANGE_MODE_RESTART)
        {
            self.mode = Mode::Idle;
            self.wake_at = None;
            out.push(TemplateOut::Restart(
                "Template with change_mode restart re-rendered".into(),
            ));
            return;
        }
        let signals: BTreeSet<i32> = modes
            .iter()
            .filter(|template| template.change_mode == TEMPLATE_CHANGE_MODE_SIGNAL)
            .filter_map(|template| signal_number(&template.change_signal))
            .collect();
        out.extend(signals.into_iter().map(TemplateOut::Signal));
        self.schedule_poll(now);
    }

    pub fn handle_timeout(
        &mut self,
        now: Instant,
        env: &BTreeMap<String, String>,
        ops: &mut OpIds,
        out: &mut Vec<TemplateOut>,
    ) {
        if self.pending.is_some() || self.wake_at.is_none_or(|at| now < at) {
            return;
        }
        self.wake_at = None;
        match self.mode {
            Mode::Idle => {}
            Mode::Prestart { next } => {
                // A blocked render, or a failed read: read what it waits for again.
                let paths = if self.blocked.is_empty() {
                    None
                } else {
                    Some(self.blocked.clone())
                };
                match paths {
                    Some(paths) => self.fetch(paths, ops, out),
                    None => self.render(next, env, ops, out),
                }
            }
            Mode::Watch { .. } => {
                let paths = self.used_paths();
                if paths.is_empty() {
                    return;
                }
                self.fetch(paths, ops, out);
            }
        }
    }

    pub fn outcome(
        &mut self,
        now: Instant,
        op: OpId,
        outcome: Outcome,
        env: &BTreeMap<String, String>,
        ops: &mut OpIds,
        out: &mut Vec<TemplateOut>,
    ) {
        let Some((pending_op, pending)) = self.pending.take() else {
            return;
        };
        debug_assert_eq!(pending_op, op);
        match pending {
            Pending::Render(index) => self.rendered_outcome(now, index, outcome, env, ops, out),
            Pending::Fetch(paths) => self.fetch_outcome(now, paths, outcome, env, ops, out),
            Pending::Signal => {
                if let Err(error) = outcome {
                    out.push(TemplateOut::Event {
                        kind: TEMPLATE_EVENT,
                        message: format!("Template failed to send signal: {error}"),
                    });
                }
                if let Mode::Watch { .. } = self.mode {
                    self.schedule_poll(now);
                }
            }
        }
    }

    fn rendered_outcome(
        &mut self,
        now: Instant,
        index: usize,
        outcome: Outcome,
        env: &BTreeMap<String, String>,
        ops: &mut OpIds,
        out: &mut Vec<TemplateOut>,
    ) {
        let reply = match outcome {
            Ok(Reply::Rendered(reply)) => reply,
            Ok(other) => return self.render_failed(now, index, &format!("unexpected reply {other:?}"), env, ops, out),
            Err(error) => return self.render_failed(now, index, &error.message, env, ops, out),
        };
        if !reply.unknown.is_empty() {
            self.fetch(reply.unknown, ops, out);
            return;
        }
        if !reply.blocked.is_empty() {
            self.render_blocked(now, index, reply, env, ops, out);
            return;
        }
        let changed = self.rendered[index]
            .as_ref()
            .is_none_or(|old| old.content != reply.content);
        self.rendered[index] = Some(Render {
            content: reply.content,
            used: reply.used,
        });
        match &mut self.mode {
            Mode::Prestart { next } => {
                *next += 1;
                self.blocked.clear();
            }
            Mode::Watch { queue } => {
                queue.retain(|queued| *queued != index);
                if changed {
                    self.changed.insert(index);
                }
            }
            Mode::Idle => return,
        }
        self.advance(now, env, ops, out);
    }

    /// `nomadVar` of a path with no variable: before the start, wait for it (Nomad's
    /// `Missing:` event, once per path); while running, keep the file as it was.
    fn render_blocked(
        &mut self,
        now: Instant,
        index: usize,
        reply: RenderReply,
        env: &BTreeMap<String, String>,
        ops: &mut OpIds,
        out: &mut Vec<TemplateOut>,
    ) {
        match &mut self.mode {
            Mode::Prestart { .. } => {
                let fresh: Vec<&String> = reply.blocked.difference(&self.reported).collect();
                if !fresh.is_empty() {
                    let names: Vec<String> = fresh
                        .iter()
                        .map(|path| format!("nomad.var.block({path}@default.global)"))
                        .collect();
                    out.push(TemplateOut::Event {
                        kind: TEMPLATE_EVENT,
                        message: format!("Missing: {}", names.join(", ")),
                    });
                }
                self.reported.extend(reply.blocked.iter().cloned());
                self.blocked = reply.blocked;
                self.wake_at = Some(now + TEMPLATE_RETRY);
            }
            Mode::Watch { queue } => {
                queue.retain(|queued| *queued != index);
                self.advance(now, env, ops, out);
            }
            Mode::Idle => {}
        }
    }

    fn render_failed(
        &mut self,
        now: Instant,
        index: usize,
        error: &str,
        env: &BTreeMap<String, String>,
        ops: &mut OpIds,
        out: &mut Vec<TemplateOut>,
    ) {
        let message = format!("Template failed: {error}");
        let _ = index;
        match &mut self.mode {
            Mode::Prestart { .. } => {
                self.mode = Mode::Idle;
                out.push(TemplateOut::Failed(message));
            }
            Mode::Watch { queue } => {
                queue.retain(|queued| *queued != index);
                out.push(TemplateOut::Event {
                    kind: TEMPLATE_EVENT,
                    message,
                });
                self.advance(now, env, ops, out);
            }
            Mode::Idle => {}
        }
        let _ = now;
    }

    fn fetch_outcome(
        &mut self,
        now: Instant,
        paths: BTreeSet<String>,
        outcome: Outcome,
        env: &BTreeMap<String, String>,
        ops: &mut OpIds,
        out: &mut Vec<TemplateOut>,
    ) {
        let variables = match outcome {
            Ok(Reply::Server(ServerReply::Variables { variables, .. })) => variables,
            // No leader, a server unreachable: read again after a while (in prestart the
            // render that asked is repeated on the timer, and asks again).
            Ok(_) | Err(_) => {
                self.wake_at = Some(now + TEMPLATE_RETRY);
                return;
            }
        };
        let mut changed_paths = BTreeSet::new();
        for path in paths {
            let fresh = variables.get(&path).cloned();
            let old = self.vars.get(&path);
            let differs = match (old, &fresh) {
                (Some(Some(old)), Some(new)) => old.modify_index != new.modify_index || old.items != new.items,
                (Some(None), None) => false,
                _ => true,
            };
            if differs {
                changed_paths.insert(path.clone());
            }
            self.vars.insert(path, fresh);
        }
        match &mut self.mode {
            Mode::Prestart { next } => {
                let next = *next;
                if !self.blocked.is_empty() && self.blocked.iter().all(|path| self.vars.get(path) == Some(&None)) {
                    // Still missing: wait again.
                    self.wake_at = Some(now + TEMPLATE_RETRY);
                    return;
                }
                self.render(next, env, ops, out);
            }
            Mode::Watch { queue } => {
                *queue = self
                    .rendered
                    .iter()
                    .enumerate()
                    .filter(|(_, render)| {
                        render
                            .as_ref()
                            .is_some_and(|render| !render.used.is_disjoint(&changed_paths))
                    })
                    .map(|(index, _)| index)
                    .collect();
                if queue.is_empty() {
                    self.schedule_poll(now);
                    return;
                }
                self.advance(now, env, ops, out);
            }
            Mode::Idle => {}
        }
    }
}

/// Nomad's env template format: `KEY=value` lines; blank lines and `#` comments skipped, an
/// `export ` prefix and matching quotes around the value removed.
pub fn parse_env_file(content: &str) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for line in content.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() {
            continue;
        }
        let value = value.trim();
        let unquoted = ['"', '\'']
            .iter()
            .find_map(|quote| value.strip_prefix(*quote)?.strip_suffix(*quote))
            .unwrap_or(value);
        vars.insert(key.to_string(), unquoted.to_string());
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files_are_read_as_nomad_reads_them() {
        let vars = parse_env_file("# comment\n\nPORT=8080\nexport MODE=\"prod\"\n  NAME = 'a b' \nbroken\n=x\n");
        assert_eq!(
            vars,
            BTreeMap::from([
                ("MODE".to_string(), "prod".to_string()),
                ("NAME".to_string(), "a b".to_string()),
                ("PORT".to_string(), "8080".to_string()),
            ])
        );
    }
}
