//! `GET /v1/client/stats`: the node's own resource usage in Nomad's `HostStats` shape —
//! memory, CPU per core (percent of the interval since the previous reading), the disk that
//! holds the allocation directories, uptime, and the CPU consumed in MHz.
//!
//! The executor reads the host's counters ([`HostCounters`]: `/proc` and `statvfs` on a real
//! host); [`HostStatsSampler`] turns two readings into percentages, as Nomad's host stats
//! collector does between its samples (the first reading is measured from boot).

use std::sync::Mutex;

use serde_json::{Value, json};

/// Cumulative CPU time of one core (or the whole host), in clock ticks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// `cpu0`, `cpu1`, …
    pub name: String,
    pub user: u64,
    pub system: u64,
    pub idle: u64,
    /// Every state counted, idle included.
    pub total: u64,
}

/// One filesystem's usage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiskUsage {
    pub device: String,
    pub mountpoint: String,
    pub size: u64,
    pub used: u64,
    pub available: u64,
    pub inodes_used_percent: f64,
}

/// What a host reports of itself at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostCounters {
    pub memory_total: u64,
    pub memory_available: u64,
    pub memory_free: u64,
    pub cpus: Vec<CpuTimes>,
    /// The filesystem of the allocation directories.
    pub alloc_disk: Option<DiskUsage>,
    pub uptime_secs: u64,
    pub unix_nanos: u128,
}

/// Keeps the previous reading, so each answer covers the interval since the last.
#[derive(Debug, Default)]
pub struct HostStatsSampler {
    previous: Mutex<Option<Vec<CpuTimes>>>,
}

impl HostStatsSampler {
    /// Nomad's `HostStats` JSON from `now`, with CPU percentages over the interval since the
    /// previous call; `mhz_per_core` gives `CPUTicksConsumed`.
    pub fn json(&self, now: &HostCounters, mhz_per_core: f64) -> Value {
        let previous = self
            .previous
            .lock()
            .expect("host stats lock")
            .replace(now.cpus.clone())
            .unwrap_or_default();
        let mut consumed = 0.0;
        let cpus: Vec<Value> = now
            .cpus
            .iter()
            .map(|cpu| {
                let before = previous
                    .iter()
                    .find(|old| old.name == cpu.name)
                    .cloned()
                    .unwrap_or_default();
                let elapsed = cpu.total.saturating_sub(before.total).max(1) as f64;
                let percent = |now: u64, then: u64| now.saturating_sub(then) as f64 * 100.0 / elapsed;
                let (user, system, idle) = (
                    percent(cpu.user, before.user),
                    percent(cpu.system, before.system),
                    percent(cpu.idle, before.idle),
                );
                let busy = (100.0 - idle).clamp(0.0, 100.0);
                consumed += busy / 100.0 * mhz_per_core;
                json!({"CPU": cpu.name, "User": user, "System": system, "Idle": idle, "Total": busy})
            })
            .collect();
        let disk = now.alloc_disk.as_ref().map(|disk| {
            let used_percent = if disk.size == 0 {
                0.0
            } else {
                disk.used as f64 * 100.0 / disk.size as f64
            };
            json!({
                "Device": disk.device,
                "Mountpoint": disk.mountpoint,
                "Size": disk.size,
                "Used": disk.used,
                "Available": disk.available,
                "UsedPercent": used_percent,
                "InodesUsedPercent": disk.inodes_used_percent,
            })
        });
        json!({
            "Memory": {
                "Total": now.memory_total,
                "Available": now.memory_available,
                "Used": now.memory_total.saturating_sub(now.memory_available),
                "Free": now.memory_free,
            },
            "CPU": cpus,
            "DiskStats": disk.iter().cloned().collect::<Vec<_>>(),
            "AllocDirStats": disk,
            "DeviceStats": [],
            "Uptime": now.uptime_secs,
            "Timestamp": now.unix_nanos,
            "CPUTicksConsumed": consumed,
        })
    }
}

/// The host's counters from `/proc` and the filesystem holding `alloc_root`.
#[cfg(not(madsim))]
pub fn read_host_counters(alloc_root: &std::path::Path) -> HostCounters {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| {
        meminfo
            .lines()
            .find(|line| line.starts_with(key))
            .and_then(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpus = stat
        .lines()
        .filter(|line| line.starts_with("cpu") && line.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?.to_string();
            let ticks: Vec<u64> = fields.filter_map(|field| field.parse().ok()).collect();
            // user nice system idle iowait irq softirq steal (guest time is inside user).
            let at = |index: usize| ticks.get(index).copied().unwrap_or(0);
            Some(CpuTimes {
                name,
                user: at(0) + at(1),
                system: at(2) + at(5) + at(6),
                idle: at(3) + at(4),
                total: (0..8).map(at).sum(),
            })
        })
        .collect();
    let uptime_secs = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0) as u64;
    HostCounters {
        memory_total: kib("MemTotal:"),
        memory_available: kib("MemAvailable:"),
        memory_free: kib("MemFree:"),
        cpus,
        alloc_disk: disk_usage(alloc_root),
        uptime_secs,
        unix_nanos: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos()),
    }
}

/// The space free (to unprivileged users) on the filesystem holding `path`, in MB.
#[cfg(not(madsim))]
pub fn disk_free_mb(path: &std::path::Path) -> Option<u64> {
    disk_usage(path).map(|disk| disk.available / (1024 * 1024))
}

/// `statvfs` of `path`, named by the mount that holds it (`/proc/self/mounts`).
#[cfg(not(madsim))]
fn disk_usage(path: &std::path::Path) -> Option<DiskUsage> {
    use std::os::unix::ffi::OsStrExt;
    let path = path.canonicalize().ok()?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c_path` is a valid C string; `stat` is written by the call before it is read.
    let stat = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c_path.as_ptr(), &mut stat) != 0 {
            return None;
        }
        stat
    };
    let block = stat.f_frsize as u64;
    let size = stat.f_blocks as u64 * block;
    let available = stat.f_bavail as u64 * block;
    let used = size.saturating_sub(stat.f_bfree as u64 * block);
    let inodes = stat.f_files as u64;
    let inodes_used_percent = if inodes == 0 {
        0.0
    } else {
        inodes.saturating_sub(stat.f_ffree as u64) as f64 * 100.0 / inodes as f64
    };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let (device, mountpoint) = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?.to_string(), fields.next()?.to_string()))
        })
        .filter(|(_, mountpoint)| path.starts_with(mountpoint))
        .max_by_key(|(_, mountpoint)| mountpoint.len())
        .unwrap_or_default();
    Some(DiskUsage {
        device,
        mountpoint,
        size,
        used,
        available,
        inodes_used_percent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(name: &str, user: u64, system: u64, idle: u64) -> CpuTimes {
        CpuTimes {
            name: name.into(),
            user,
            system,
            idle,
            total: user + system + idle,
        }
    }

    #[test]
    fn percentages_cover_the_interval_since_the_previous_reading() {
        let sampler = HostStatsSampler::default();
        let first = HostCounters {
            memory_total: 1000,
            memory_available: 600,
            memory_free: 100,
            cpus: vec![cpu("cpu0", 100, 100, 800)],
            ..HostCounters::default()
        };
        let json = sampler.json(&first, 2000.0);
        assert_eq!(json["Memory"]["Used"], 400);
        assert_eq!(json["CPU"][0]["Idle"], 80.0);
        // 100 more ticks: 30 user, 20 system, 50 idle.
        let second = HostCounters {
            cpus: vec![cpu("cpu0", 130, 120, 850)],
            ..first
        };
        let json = sampler.json(&second, 2000.0);
        let cpu0 = &json["CPU"][0];
        assert_eq!(
            (cpu0["User"].as_f64(), cpu0["System"].as_f64()),
            (Some(30.0), Some(20.0))
        );
        assert_eq!(
            (cpu0["Idle"].as_f64(), cpu0["Total"].as_f64()),
            (Some(50.0), Some(50.0))
        );
        assert_eq!(json["CPUTicksConsumed"].as_f64(), Some(1000.0));
    }

    #[cfg(not(madsim))]
    #[test]
    fn this_hosts_counters_are_read() {
        let counters = read_host_counters(&std::env::temp_dir());
        assert!(counters.memory_total > 0 && counters.memory_available <= counters.memory_total);
        assert!(!counters.cpus.is_empty() && counters.cpus[0].name == "cpu0");
        let disk = counters.alloc_disk.expect("the temp dir's filesystem");
        assert!(disk.size > 0 && !disk.mountpoint.is_empty(), "{disk:?}");
        assert!(counters.uptime_secs > 0);
    }
}
