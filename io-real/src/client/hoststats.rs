//! `GET /v1/client/stats`: the node's own resource usage in Nomad's `HostStats` shape —
//! memory, CPU per core (percent of the interval since the previous reading), the disk that
//! holds the allocation directories, uptime, and the CPU consumed in MHz.
//!
//! The executor reads the host's counters ([`HostCounters`]: `/proc` and `statvfs` on a real
//! host, `client/host.rs`); [`HostStatsSampler`] turns two readings into percentages, as Nomad's host stats
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
}
