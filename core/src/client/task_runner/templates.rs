//! The task runner's side of the template hook: hands the hook's machine
//! (`client/templates.rs`) the task's environment, and carries out what it asks.

use super::*;
use crate::client::templates::TemplateOut;

impl TaskRunner {
    /// The template hook's prestart: render every template.
    pub(super) fn templates_prestart(&mut self, now: Instant, ops: &mut OpIds) {
        let env = self.task_env().vars().clone();
        let mut out = Vec::new();
        if let Some(templates) = &mut self.templates {
            templates.prestart(now, &env, ops, &mut out);
        }
        self.templates_out(now, out, ops);
    }

    pub(super) fn templates_outcome(&mut self, now: Instant, op: OpId, outcome: Outcome, ops: &mut OpIds) {
        let env = self.task_env().vars().clone();
        let mut out = Vec::new();
        if let Some(templates) = &mut self.templates {
            templates.outcome(now, op, outcome, &env, ops, &mut out);
        }
        self.templates_out(now, out, ops);
    }

    pub(super) fn templates_timeout(&mut self, now: Instant, ops: &mut OpIds) {
        if self
            .templates
            .as_ref()
            .and_then(|templates| templates.poll_timeout())
            .is_none_or(|at| now < at)
        {
            return;
        }
        let env = self.task_env().vars().clone();
        let mut out = Vec::new();
        if let Some(templates) = &mut self.templates {
            templates.handle_timeout(now, &env, ops, &mut out);
        }
        self.templates_out(now, out, ops);
    }

    fn templates_out(&mut self, now: Instant, out: Vec<TemplateOut>, ops: &mut OpIds) {
        for item in out {
            match item {
                TemplateOut::Io { op, io } => self.actions.push(TaskAction::Io { op, io: *io }),
                TemplateOut::Event { kind, message } => self.event(now, kind, &message),
                TemplateOut::Rendered { env } => {
                    let Phase::Rendering { index } = self.phase else {
                        continue;
                    };
                    self.hook_env.extend(env.clone());
                    let state = HookState {
                        prestart_done: false,
                        data: BTreeMap::new(),
                        env,
                    };
                    let name = TaskHook::Template.name();
                    if self.local.hooks.get(name) != Some(&state) {
                        self.local.hooks.insert(name.to_string(), state);
                        self.persist();
                    }
                    self.next_hook(index);
                    self.run_prestart(now, ops);
                }
                TemplateOut::Failed(message) => {
                    if let Phase::Rendering { .. } = self.phase {
                        self.prestart_failed(now, HookError::fatal(message), ops);
                    }
                }
                TemplateOut::Restart(message) => {
                    if self.phase == Phase::Running && !self.kill_requested {
                        self.event(now, events::RESTART_SIGNALED, &message);
                        self.restart_requested = true;
                        self.send_kill(now, ops);
                    }
                }
                TemplateOut::Signal(signal) => {
                    let Some(handle) = self.local.handle.clone().filter(|_| self.phase == Phase::Running) else {
                        continue;
                    };
                    self.event(now, events::SIGNALING, "Template re-rendered");
                    let op = ops.allocate();
                    if let Some(templates) = &mut self.templates {
                        templates.track_signal(op);
                    }
                    self.actions.push(TaskAction::Io {
                        op,
                        io: Io::SignalTask { handle, signal },
                    });
                }
            }
        }
    }
}
