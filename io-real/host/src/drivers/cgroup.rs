//! One cgroup per task, so that "the task" means every process it started: a stop, or the
//! task's own exit, kills all of them (children that ignore SIGINT, daemons that `setsid`
//! away from the task's session), memory and CPU limits apply to the whole task, and an OOM
//! kill is reported as such.
//!
//! cgroup v2 is used where the unified hierarchy is mounted at `/sys/fs/cgroup` (one directory
//! per task under `drover/`); otherwise the v1 controllers `freezer`, `memory`, `cpu` and
//! `pids` each get that directory (the hybrid layout of older distributions). Where neither
//! can be used (not root, no controllers), [`Cgroups::detect`] says why and the drivers fall
//! back to process groups and sessions.
//!
//! Written against the cgroup files directly rather than with `cgroups-rs`: a task joins its
//! cgroup between `fork` and `exec` (so not even its first child can start outside it), which
//! must be async-signal-safe — raw `open`/`write` of paths prepared before the fork, no
//! allocation — and the handful of files used here (`cgroup.procs`, `cgroup.kill`,
//! `cgroup.freeze`/`freezer.state`, the memory and CPU limits, the OOM counters) are stable
//! kernel ABI in both versions.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use drover_io_real::drivers::CgroupUsage;

const ROOT: &str = "/sys/fs/cgroup";
/// Every task cgroup lives under this directory of each hierarchy.
pub const PARENT: &str = "drover";
/// `statfs` magic of cgroup2.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// The v1 controllers a task gets a directory in; `freezer` first (it is the one killed by).
const V1_CONTROLLERS: [&str; 5] = ["freezer", "memory", "cpu", "pids", "cpuset"];

/// Which cgroup layout this host offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cgroups {
    V2 { root: PathBuf },
    V1 { roots: Vec<PathBuf> },
}

/// What a task's cgroup limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The cores reserved for the task (`resources { cores }`) in cpuset notation; empty
    /// for a task that asked for MHz, which may run on any core.
    pub cpuset: String,
    /// CPU in MHz as the jobspec gives it: the task's CPU share (Nomad's `cpu.shares` = MHz).
    pub cpu_mhz: u32,
    /// The memory reservation, MB: the hard limit, or the soft one with `memory_max_mb`.
    pub memory_mb: u32,
    /// `memory_max`: the hard limit, MB; 0 for none.
    pub memory_max_mb: u32,
}

/// One task's cgroup: its directory in each hierarchy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskCgroup {
    pub version: u8,
    pub dirs: Vec<PathBuf>,
}

impl Cgroups {
    /// The layout of this host, or why tasks cannot have cgroups here.
    pub fn detect() -> Result<Cgroups, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("the agent does not run as root".into());
        }
        if is_cgroup2(Path::new(ROOT)) {
            let root = Path::new(ROOT).join(PARENT);
            std::fs::create_dir_all(&root).map_err(|error| format!("cannot create {}: {error}", root.display()))?;
            // Limits need the controllers delegated to our subtree; what the kernel refuses is
            // simply not limited.
            let _ = std::fs::write(
                Path::new(ROOT).join("cgroup.subtree_control"),
                "+memory +cpu +pids +cpuset",
            );
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory +cpu +pids +cpuset");
            sweep_orphans(&root);
            return Ok(Cgroups::V2 { root });
        }
        let mut roots = Vec::new();
        for controller in V1_CONTROLLERS {
            let mount = Path::new(ROOT).join(controller);
            if !mount.join("cgroup.procs").exists() {
                if controller == "freezer" {
                    return Err(format!(
                        "no cgroup2 at {ROOT} and no v1 freezer controller at {}",
                        mount.display()
                    ));
                }
                continue;
            }
            let root = mount.join(PARENT);
            std::fs::create_dir_all(&root).map_err(|error| format!("cannot create {}: {error}", root.display()))?;
            if controller == "cpuset" {
                // A v1 cpuset takes no process until its cpus and mems are set: ours start as
                // their parent's, and so do the tasks' below (clone_children).
                inherit_cpuset(&mount, &root);
                let _ = std::fs::write(root.join("cgroup.clone_children"), "1");
            }
            sweep_orphans(&root);
            roots.push(root);
        }
        Ok(Cgroups::V1 { roots })
    }

    /// Creates the cgroup of a new task, with its limits.
    pub fn create(&self, alloc_id: &str, task: &str, limits: Limits) -> std::io::Result<TaskCgroup> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // Unique per agent process and start, so two agents on one host (tests) or a restarted
        // task never share one.
        let name = format!(
            "{alloc_id}.{task}.{}.{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let (version, roots): (u8, Vec<&PathBuf>) = match self {
            Cgroups::V2 { root } => (2, vec![root]),
            Cgroups::V1 { roots } => (1, roots.iter().collect()),
        };
        let mut dirs = Vec::new();
        for root in roots {
            let dir = root.join(&name);
            std::fs::create_dir(&dir)?;
            dirs.push(dir);
        }
        let cgroup = TaskCgroup { version, dirs };
        cgroup.apply(&limits);
        Ok(cgroup)
    }
}

/// Gives the v1 cpuset `dir` its `parent`'s cpus and mems where it has none yet.
fn inherit_cpuset(parent: &Path, dir: &Path) {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let current = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        if current.trim().is_empty()
            && let Ok(value) = std::fs::read_to_string(parent.join(file))
        {
            let _ = std::fs::write(dir.join(file), value.trim());
        }
    }
}

impl TaskCgroup {
    fn apply(&self, limits: &Limits) {
        let reserved = u64::from(limits.memory_mb) * 1024 * 1024;
        let memory = u64::from(limits.memory_max_mb.max(limits.memory_mb)) * 1024 * 1024;
        let soft = (limits.memory_max_mb > limits.memory_mb).then_some(reserved);
        let shares = u64::from(limits.cpu_mhz.max(2));
        // What a controller refuses (not delegated here) is not limited; the task still runs
        // in its cgroup and is still killed whole.
        if self.version == 2 {
            let dir = &self.dirs[0];
            if memory > 0 {
                let _ = std::fs::write(dir.join("memory.max"), memory.to_string());
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            }
            if let Some(soft) = soft {
                let _ = std::fs::write(dir.join("memory.low"), soft.to_string());
            }
            // cgroup v1 shares (2..=262144) mapped onto v2 weights (1..=10000) as runc does.
            let weight = 1 + ((shares.clamp(2, 262_144) - 2) * 9999) / 262_142;
            let _ = std::fs::write(dir.join("cpu.weight"), weight.to_string());
            if !limits.cpuset.is_empty() {
                let _ = std::fs::write(dir.join("cpuset.cpus"), &limits.cpuset);
            }
            return;
        }
        for dir in &self.dirs {
            if memory > 0 && dir.join("memory.limit_in_bytes").exists() {
                let _ = std::fs::write(dir.join("memory.limit_in_bytes"), memory.to_string());
                let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), memory.to_string());
                if let Some(soft) = soft {
                    let _ = std::fs::write(dir.join("memory.soft_limit_in_bytes"), soft.to_string());
                }
            }
            if dir.join("cpu.shares").exists() {
                let _ = std::fs::write(dir.join("cpu.shares"), shares.to_string());
            }
            if dir.join("cpuset.cpus").exists() {
                if let Some(parent) = dir.parent() {
                    inherit_cpuset(parent, dir);
                }
                if !limits.cpuset.is_empty() {
                    let _ = std::fs::write(dir.join("cpuset.cpus"), &limits.cpuset);
                }
            }
        }
    }

    /// The `cgroup.procs` files a new task process writes `0` into (itself) before `exec`.
    pub fn join_paths(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .filter_map(|dir| CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect()
    }

    /// Every process in the cgroup now.
    /// Moves process `pid` into this task's cgroups from outside (the agent, right after it
    /// spawned the task's helper, which also joins them itself before it execs the task: the
    /// task never runs outside, and from here on the cgroup is never seen empty).
    pub fn adopt(&self, pid: i32) -> std::io::Result<()> {
        for dir in &self.dirs {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    pub fn pids(&self) -> Vec<i32> {
        let Some(dir) = self.dirs.first() else {
            return Vec::new();
        };
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }

    /// Kills every process in the cgroup and waits (up to a few seconds) until none is left;
    /// returns whether none is. The cgroup is frozen while it is being killed, so nothing can
    /// fork past the kill.
    pub async fn kill_all(&self) -> bool {
        let Some(dir) = self.dirs.first() else {
            return true;
        };
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return true;
            }
            if self.version == 2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            self.freeze(true);
            for pid in pids {
                if pid > 1 {
                    // SAFETY: kill has no memory preconditions; the pid is in our cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            self.freeze(false);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!(cgroup = %dir.display(), "processes still in the task's cgroup after SIGKILL");
        false
    }

    fn freeze(&self, frozen: bool) {
        let Some(dir) = self.dirs.first() else {
            return;
        };
        let _ = if self.version == 2 {
            std::fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
        } else {
            std::fs::write(dir.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" })
        };
    }

    /// Whether the kernel's OOM killer killed a process of the task.
    pub fn oom_killed(&self) -> bool {
        let counter = |file: &Path| -> u64 {
            std::fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
                .unwrap_or(0)
        };
        self.dirs.iter().any(|dir| {
            if self.version == 2 {
                counter(&dir.join("memory.events")) > 0
            } else {
                counter(&dir.join("memory.oom_control")) > 0
            }
        })
    }

    /// The task's memory use now, bytes (what the memory controller charges it).
    pub fn memory_bytes(&self) -> Option<u64> {
        let file = if self.version == 2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        self.dirs
            .iter()
            .find_map(|dir| std::fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok())
    }

    /// What the memory and CPU controllers account to the task now (Nomad's cgroup
    /// measurements): memory usage, its peak, page cache and swap; CFS throttling.
    pub fn usage(&self) -> CgroupUsage {
        let read = |file: &str| {
            self.dirs
                .iter()
                .find_map(|dir| std::fs::read_to_string(dir.join(file)).ok())
        };
        let number = |file: &str| read(file).and_then(|text| text.trim().parse::<u64>().ok());
        let field = |file: &str, key: &str| {
            read(file).and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix(key)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
            })
        };
        if self.version == 2 {
            CgroupUsage {
                usage_bytes: number("memory.current"),
                max_usage_bytes: number("memory.peak"),
                cache_bytes: field("memory.stat", "file"),
                swap_bytes: number("memory.swap.current"),
                throttled_periods: field("cpu.stat", "nr_throttled"),
                throttled_time_ns: field("cpu.stat", "throttled_usec").map(|usec| usec * 1000),
            }
        } else {
            CgroupUsage {
                usage_bytes: number("memory.usage_in_bytes"),
                max_usage_bytes: number("memory.max_usage_in_bytes"),
                cache_bytes: field("memory.stat", "total_cache").or_else(|| field("memory.stat", "cache")),
                swap_bytes: field("memory.stat", "total_swap").or_else(|| field("memory.stat", "swap")),
                throttled_periods: field("cpu.stat", "nr_throttled"),
                throttled_time_ns: field("cpu.stat", "throttled_time"),
            }
        }
    }

    /// Removes the (empty) cgroup directories.
    pub fn remove(&self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The pid of the agent that created a task cgroup (`<alloc>.<task>.<agent pid>.<n>`).
pub fn creator_pid(dir: &Path) -> Option<i32> {
    let name = dir.file_name()?.to_str()?;
    name.rsplit('.').nth(1)?.parse().ok()
}

/// Removes the empty task cgroups of agents that are gone: their tasks ended while no agent
/// watched them (a live agent's cgroups are left alone, even empty ones it is about to fill).
fn sweep_orphans(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for dir in entries.flatten().map(|entry| entry.path()).filter(|path| path.is_dir()) {
        let Some(pid) = creator_pid(&dir) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            // Fails, harmlessly, while the cgroup still holds a process.
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

fn is_cgroup2(path: &Path) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we own.
    unsafe {
        let mut stat: libc::statfs = std::mem::zeroed();
        libc::statfs(path.as_ptr(), &mut stat) == 0 && stat.f_type as i64 == CGROUP2_SUPER_MAGIC
    }
}
