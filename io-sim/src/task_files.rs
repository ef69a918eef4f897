//! A simulated host's allocation directories as real files, and a hostile task that plants
//! links in them (issue 54's attack: a task swaps its directories and the files the agent
//! writes or reads for links to host files, hoping the agent, running as root, follows them).
//!
//! The host's other state stays a model ([`crate::host`]); what the client makes, writes,
//! reads and renders below its allocation root is carried out here by the production code
//! (`drover_io_real::alloc_files`, `drover_io_real::template::render_to_file`) on a scratch
//! directory of the run's own, beside a directory standing for the rest of the host. Between
//! the agent's requests the hostile task (`plant_links = true` in its config) swaps
//! directories and files of its allocation for links into that outside directory. After every
//! request two invariants are checked: nothing outside changed, and nothing the agent read or
//! rendered came from outside.
//!
//! Each request runs to completion before the next (synchronous file calls inside one
//! simulated step), so the interleavings explored are those between requests: the agent's
//! restarts, re-renders and Connect token reads meeting links planted while the task ran.
//! Races inside one request (a check and an open apart) are the real-process tests' to hammer.
//!
//! Determinism: the scratch directory's name differs between a run and its replay, so it is
//! cut from every message before a message can reach the trace; the attacks are chosen by the
//! task's pid (deterministic per run); nothing depends on a directory's listing order.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use drover_core::client::{IoError, RenderReply, RenderRequest};

use crate::trace::Recorder;

/// Written outside whenever the agent writes where it should not.
pub const WRITTEN_OUTSIDE: &str = "nothing is written outside an allocation dir";
/// Read by the agent from outside, into a template or a token.
pub const READ_OUTSIDE: &str = "nothing is read from outside an allocation dir";

/// Host defects re-created on purpose (regression switches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostFaults {
    /// The executor makes, reads and writes what is below an allocation directory by name,
    /// following any link a task planted (as before issue 54: templates, the service identity
    /// token and a dispatch payload were written as root through such links).
    pub follow_task_links: bool,
}

/// The marker the host file holds; an agent that reads it reads from outside.
const MARKER: &str = "HOST-SECRET-7f3a";

static SCRATCH: AtomicU64 = AtomicU64::new(0);

/// One host's allocation root on disk, the outside beside it, and the hostile task's moves.
pub struct TaskFiles {
    /// The run's own directory; `<scratch>/<sim path>` is where a simulated path lives.
    scratch: PathBuf,
    scratch_text: String,
    /// The simulated allocation root (`/sim/<name>/alloc`), and where it is on disk.
    sim_alloc_root: String,
    alloc_root: PathBuf,
    /// The rest of the host: `victim` (a host file), `local/` and `secrets/` (empty host dirs).
    outside: PathBuf,
    follow_links: bool,
    name: String,
}

impl Drop for TaskFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

impl TaskFiles {
    /// Files for host `name`, whose allocations are under `sim_alloc_root`.
    pub fn new(name: &str, sim_alloc_root: &str, faults: HostFaults) -> std::io::Result<TaskFiles> {
        let parent = std::env::temp_dir().join("drover-sim-files");
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| sweep_dead(&parent));
        let scratch = parent.join(format!(
            "{}-{}",
            std::process::id(),
            SCRATCH.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&scratch);
        let outside = scratch.join("outside");
        std::fs::create_dir_all(outside.join("local"))?;
        std::fs::create_dir_all(outside.join("secrets"))?;
        std::fs::write(outside.join("victim"), MARKER)?;
        let alloc_root = scratch.join(sim_alloc_root.trim_start_matches('/'));
        std::fs::create_dir_all(&alloc_root)?;
        Ok(TaskFiles {
            scratch_text: scratch.to_string_lossy().into_owned(),
            scratch,
            sim_alloc_root: sim_alloc_root.to_string(),
            alloc_root,
            outside,
            follow_links: faults.follow_task_links,
            name: name.to_string(),
        })
    }

    /// Whether `path` (simulated) is below the allocation root, so carried out here.
    pub fn owns(&self, path: &str) -> bool {
        path.strip_prefix(&self.sim_alloc_root)
            .is_some_and(|rest| rest.starts_with('/'))
    }

    fn real(&self, path: &str) -> PathBuf {
        self.scratch.join(path.trim_start_matches('/'))
    }

    fn real_text(&self, path: &str) -> String {
        self.real(path).to_string_lossy().into_owned()
    }

    /// The error with the scratch directory cut from its message (it differs per replay).
    fn simulated(&self, error: IoError) -> IoError {
        IoError::new(error.kind, error.message.replace(&self.scratch_text, ""))
    }

    fn io(&self, context: &str, error: std::io::Error) -> IoError {
        self.simulated(drover_io_real::alloc_files::fs_error(context, error))
    }

    pub fn mkdir(&self, path: &str) -> Result<(), IoError> {
        if self.follow_links {
            return std::fs::create_dir_all(self.real(path)).map_err(|error| self.io(&format!("mkdir {path}"), error));
        }
        drover_io_real::alloc_files::mkdir(&self.alloc_root, &self.real_text(path)).map_err(|e| self.simulated(e))
    }

    pub fn write(&self, path: &str, content: &[u8], mode: u32) -> Result<(), IoError> {
        if self.follow_links {
            return std::fs::write(self.real(path), content).map_err(|error| self.io(&format!("write {path}"), error));
        }
        drover_io_real::alloc_files::write(&self.alloc_root, &self.real_text(path), content, mode)
            .map_err(|e| self.simulated(e))
    }

    pub fn read(&self, path: &str) -> Result<Option<String>, IoError> {
        if self.follow_links {
            return match std::fs::read_to_string(self.real(path)) {
                Ok(text) => Ok(Some(text)),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(self.io(&format!("read {path}"), error)),
            };
        }
        drover_io_real::alloc_files::read(&self.alloc_root, &self.real_text(path)).map_err(|e| self.simulated(e))
    }

    /// `rm -rf` as the production executor does it (std's, which never follows a link).
    pub fn remove_all(&self, path: &str) -> Result<(), IoError> {
        match std::fs::remove_dir_all(self.real(path)) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(self.io(&format!("remove {path}"), error)),
        }
    }

    pub fn rmdir(&self, path: &str) -> Result<(), IoError> {
        std::fs::remove_dir(self.real(path)).map_err(|error| self.io(&format!("rmdir {path}"), error))
    }

    /// Renders a template into its task directory, as the production executor does.
    pub fn render(&self, request: &RenderRequest) -> Result<RenderReply, IoError> {
        let mut real = request.clone();
        real.task_dir = self.real_text(&request.task_dir);
        if !self.follow_links {
            return drover_io_real::template::render_to_file(&real).map_err(|e| self.simulated(e));
        }
        let task_dir = PathBuf::from(&real.task_dir);
        let template = &real.template;
        let text = if template.source_path.is_empty() {
            template.embedded_tmpl.clone()
        } else {
            std::fs::read_to_string(task_dir.join(&template.source_path))
                .map_err(|error| self.io("failed to read template source", error))?
        };
        let reply = drover_io_real::template::render(&text, &real.env, &real.variables).map_err(IoError::other)?;
        if reply.complete() {
            std::fs::write(task_dir.join(&template.dest_path), &reply.content)
                .map_err(|error| self.io("failed writing template", error))?;
        }
        Ok(reply)
    }

    /// The hostile task `task` of allocation `alloc` (pid `pid`) plants links as it starts:
    /// which ones follows from its pid. It only ever makes links inside its allocation
    /// directory, and never writes through one, so all that reaches outside is the agent's.
    /// Returns what it did, for the trace.
    pub fn plant(&self, alloc: &str, task: &str, pid: u64) -> Vec<String> {
        let alloc_dir = self.alloc_root.join(alloc);
        let Ok(tasks) = std::fs::read_dir(&alloc_dir) else {
            return Vec::new();
        };
        // Its own directory and its siblings' (a raw_exec task runs as the user the agent
        // made their directories for): sorted, so the choice does not hang on listing order.
        let mut dirs: Vec<String> = tasks
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name != "alloc")
            .collect();
        dirs.sort();
        let mut planted = Vec::new();
        for (at, dir) in dirs.iter().enumerate() {
            let base = alloc_dir.join(dir);
            let own = dir == task;
            let moves: &[(&str, &str)] = &[
                ("local", "local"),
                ("secrets", "secrets"),
                ("local/out.txt", "victim"),
                ("secrets/si_token", "victim"),
                ("local/src.tpl", "victim"),
                ("secrets/env.txt", "victim"),
            ];
            // One move per directory per start, turning with the pid; the task's own
            // directory also gets every other start off, so some restarts meet no link.
            let pick = (pid as usize + at) % (moves.len() + usize::from(own));
            let Some((inside, target)) = moves.get(pick) else {
                continue;
            };
            if plant_link(&base, inside, &self.outside.join(target)) {
                planted.push(format!("{dir}/{inside} -> outside/{target}"));
            }
        }
        planted
    }

    /// The invariants, after a request: nothing outside changed; `read` (what the agent read
    /// or rendered, if anything) holds nothing from outside.
    pub fn check(&self, recorder: &Recorder, request: &str, read: Option<&str>) {
        recorder.checked(WRITTEN_OUTSIDE, 1);
        if let Some(changed) = self.outside_changed() {
            recorder.violate(
                WRITTEN_OUTSIDE,
                format!("{}: after {request}, the host outside has {changed}", self.name),
            );
        }
        if let Some(read) = read {
            recorder.checked(READ_OUTSIDE, 1);
            if read.contains(MARKER) {
                recorder.violate(
                    READ_OUTSIDE,
                    format!("{}: {request} returned the host file's contents", self.name),
                );
            }
        }
    }

    fn outside_changed(&self) -> Option<String> {
        match std::fs::read_to_string(self.outside.join("victim")) {
            Ok(text) if text == MARKER => {}
            Ok(_) => return Some("its file overwritten".into()),
            Err(error) => return Some(format!("its file unreadable ({})", error.kind())),
        }
        let mut entries: Vec<String> = Vec::new();
        for dir in ["", "local", "secrets"] {
            let Ok(listing) = std::fs::read_dir(self.outside.join(dir)) else {
                return Some(format!("{dir}/ gone"));
            };
            for entry in listing.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if dir.is_empty() && ["victim", "local", "secrets"].contains(&name.as_str()) {
                    continue;
                }
                entries.push(format!("{dir}/{name}").trim_start_matches('/').to_string());
            }
        }
        entries.sort();
        (!entries.is_empty()).then(|| format!("new entries {entries:?}"))
    }
}

/// Removes the scratch directories of processes that are gone (a run that panicked or was
/// killed drops nothing): their names start with the pid that made them.
fn sweep_dead(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let alive = name
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Replaces `base/inside` with a link to `target`, unless a link already stands on the way
/// (the task never writes through a link itself). Whether it planted one.
fn plant_link(base: &Path, inside: &str, target: &Path) -> bool {
    let path = base.join(inside);
    let mut walked = base.to_path_buf();
    for part in Path::new(inside).parent().into_iter().flat_map(Path::components) {
        walked.push(part);
        match std::fs::symlink_metadata(&walked) {
            Ok(meta) if meta.is_dir() => {}
            _ => return false,
        }
    }
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_symlink() => return false,
        Ok(meta) if meta.is_dir() => {
            if std::fs::remove_dir_all(&path).is_err() {
                return false;
            }
        }
        Ok(_) => {
            if std::fs::remove_file(&path).is_err() {
                return false;
            }
        }
        Err(_) => {}
    }
    std::os::unix::fs::symlink(target, &path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOC: &str = "/sim/c1/alloc";
    const TASK: &str = "/sim/c1/alloc/a1/web";

    /// A host with one allocation whose task dir has `local/` and `secrets/`, and its task
    /// having planted a link at `inside` (to `target` outside).
    fn host_with_link(faults: HostFaults, inside: &str, target: &str) -> TaskFiles {
        let files = TaskFiles::new("c1", ALLOC, faults).expect("scratch");
        for dir in ["local", "secrets"] {
            files.mkdir(&format!("{TASK}/{dir}")).expect("task dir");
        }
        assert!(plant_link(&files.real(TASK), inside, &files.outside.join(target)));
        files
    }

    fn template(dest: &str) -> RenderRequest {
        RenderRequest {
            template: drover_core::structs::Template {
                dest_path: dest.into(),
                embedded_tmpl: "hello\n".into(),
                ..Default::default()
            },
            task_dir: TASK.into(),
            env: Default::default(),
            variables: Default::default(),
        }
    }

    #[test]
    fn the_production_executor_never_writes_through_a_planted_link() {
        let recorder = Recorder::new();
        // A directory swapped for a link out: refused by kind, nothing written outside.
        let files = host_with_link(HostFaults::default(), "local", "local");
        let refused = files
            .render(&template("local/out.txt"))
            .expect_err("a link out is refused");
        assert_eq!(refused.kind, drover_core::client::ErrorKind::FailedPrecondition);
        assert!(!refused.message.contains("drover-sim-files"), "{}", refused.message);
        let refused = files
            .write(&format!("{TASK}/local/x"), b"x", 0o600)
            .expect_err("refused");
        assert_eq!(refused.kind, drover_core::client::ErrorKind::FailedPrecondition);
        files.check(&recorder, "render", None);
        // A file swapped for a link to a host file: replaced, the host file untouched.
        let files = host_with_link(HostFaults::default(), "secrets/env.txt", "victim");
        files.render(&template("secrets/env.txt")).expect("rendered");
        files.check(&recorder, "render", Some("hello\n"));
        assert_eq!(
            files.read(&format!("{TASK}/secrets/env.txt")).expect("read").as_deref(),
            Some("hello\n")
        );
        assert!(recorder.violations().is_empty(), "{:?}", recorder.violations());
        assert_eq!(recorder.checks().get(WRITTEN_OUTSIDE), Some(&2));
    }

    #[test]
    fn reading_a_planted_link_is_refused() {
        let files = host_with_link(HostFaults::default(), "secrets/si_token", "victim");
        let refused = files
            .read(&format!("{TASK}/secrets/si_token"))
            .expect_err("a link out is refused");
        assert_eq!(refused.kind, drover_core::client::ErrorKind::FailedPrecondition);
    }

    #[test]
    fn the_switch_follows_links_and_the_invariants_see_it() {
        let recorder = Recorder::new();
        let files = host_with_link(
            HostFaults {
                follow_task_links: true,
            },
            "local",
            "local",
        );
        files
            .render(&template("local/out.txt"))
            .expect("written through the link");
        files.check(&recorder, "render", None);
        let files = host_with_link(
            HostFaults {
                follow_task_links: true,
            },
            "secrets/si_token",
            "victim",
        );
        let read = files
            .read(&format!("{TASK}/secrets/si_token"))
            .expect("read through the link");
        files.check(&recorder, "read", read.as_deref());
        let found: Vec<&str> = recorder
            .violations()
            .iter()
            .map(|violation| violation.invariant)
            .collect();
        assert_eq!(found, [WRITTEN_OUTSIDE, READ_OUTSIDE]);
    }

    #[test]
    fn a_dead_processs_scratch_directory_is_swept() {
        let parent = std::env::temp_dir().join(format!("drover-sweep-test-{}", std::process::id()));
        let (dead, alive) = (
            parent.join("999999999-0"),
            parent.join(format!("{}-0", std::process::id())),
        );
        for dir in [&dead, &alive] {
            std::fs::create_dir_all(dir.join("outside")).expect("dir");
        }
        sweep_dead(&parent);
        assert!(!dead.exists() && alive.exists());
        std::fs::remove_dir_all(&parent).expect("cleaned");
    }

    #[test]
    fn the_scratch_directory_goes_with_the_host() {
        let files = TaskFiles::new("c1", ALLOC, HostFaults::default()).expect("scratch");
        let scratch = files.scratch.clone();
        assert!(scratch.exists());
        drop(files);
        assert!(!scratch.exists());
    }
}
