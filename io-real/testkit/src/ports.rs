//! Ports for agents under test, free for both TCP and UDP and held by no other test.
//!
//! Taken below the kernel's ephemeral range (`ip_local_port_range`), so no socket that another
//! process binds to port 0 or connects from can take one between this check and the agent's
//! own bind: asked of `bind(0)` instead, a port was now and then handed to a concurrently
//! running test's process in that gap ("Address already in use" on the gossip port, issue 53
//! and again in a clean-clone CI run). Each port is claimed across test processes (nextest
//! runs each test in its own) by a file made with `O_EXCL` under the temp dir; a claim older
//! than 15 minutes is a finished run's and is taken over.

use std::collections::BTreeSet;
use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// How long a claim holds before a later run may take the port over.
const CLAIM_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// The lowest port handed out (well above the well-known and registered services tests meet).
const LOWEST: u16 = 10_000;

/// `N` distinct free ports.
pub fn free_ports<const N: usize>() -> [u16; N] {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let claims = std::env::temp_dir().join("drover-test-ports");
    std::fs::create_dir_all(&claims).expect("the port claims directory is made");
    let (low, high) = (LOWEST, ephemeral_low().max(LOWEST + 100));
    let mut next_port = spread(low, high);
    let mut ports = Vec::with_capacity(N);
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    while ports.len() < N {
        let port = next_port();
        if ports.contains(&port) || handed_out.contains(&port) || !claim(&claims, port) {
            continue;
        }
        if bindable(port) {
            ports.push(port);
        } else {
            let _ = std::fs::remove_file(claims.join(port.to_string()));
        }
    }
    handed_out.extend(ports.iter().copied());
    std::array::from_fn(|index| ports[index])
}

/// One free port.
pub fn free_port() -> u16 {
    let [port] = free_ports::<1>();
    port
}

/// The lowest port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Ports in `low..high`, spread by a generator seeded from this process and the time (tests
/// in different processes start in different places).
fn spread(low: u16, high: u16) -> impl FnMut() -> u16 {
    let mut state = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
        | 1;
    move || {
        // xorshift64*: plenty for spreading test ports.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let value = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        low + (value % u64::from(high - low)) as u16
    }
}

/// Claims `port` for this process, taking over a stale claim.
fn claim(claims: &Path, port: u16) -> bool {
    let file = claims.join(port.to_string());
    let open = || std::fs::OpenOptions::new().write(true).create_new(true).open(&file);
    if open().is_ok() {
        return true;
    }
    let stale = std::fs::metadata(&file)
        .and_then(|meta| meta.modified())
        .ok()
        .and_then(|modified| modified.elapsed().ok())
        .is_some_and(|age| age > CLAIM_LIFETIME);
    stale && std::fs::remove_file(&file).is_ok() && open().is_ok()
}

/// Whether `port` can be bound on loopback for both TCP and UDP right now.
fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok() && UdpSocket::bind(("127.0.0.1", port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_bindable() {
        let first = free_ports::<3>();
        let second = free_ports::<3>();
        let all: BTreeSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 6, "{first:?} {second:?}");
        for port in all {
            assert!((LOWEST..ephemeral_low().max(LOWEST + 100)).contains(&port), "{port}");
            assert!(bindable(port), "{port}");
        }
    }
}
