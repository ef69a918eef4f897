//! Letting go of the agent's own start-up code once it has started (issue 19 §5).
//!
//! Most of an idle agent's resident memory is not data but its own machine code: the kernel
//! maps file pages around every page fault (128 KiB windows on the machines measured), and
//! starting an agent runs code from nearly every corner of a 23 MB text segment — flag and
//! HCL parsing, opening the store, Raft's bootstrap, the first fingerprint. Measured with
//! `scripts/rss_pages.py`, 17 MB of that text stayed mapped 30 s after start while the idle
//! agent ran a small part of it.
//!
//! [`release_code_pages`] drops this process's mappings of those pages with
//! `madvise(MADV_DONTNEED)`. Only mappings of the agent's own executable that are read-only
//! and hold no anonymous (copied-on-write) page qualify, so what is dropped is identical to
//! the file: the pages stay in the page cache, and code that runs again is mapped back by a
//! minor fault, once. Relocated data (`.data.rel.ro`, the GOT) is written at load time and
//! therefore never touched here.

use std::io;

/// What [`release_code_pages`] let go of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Released {
    /// Mappings of the executable that were released.
    pub mappings: usize,
    /// Resident kibibytes those mappings held just before.
    pub kib: u64,
}

/// One mapping of `/proc/self/smaps`, as far as this module needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    writable: bool,
    device: (u32, u32),
    inode: u64,
    rss_kib: u64,
    anonymous_kib: u64,
}

/// Drops the resident pages of the agent's own read-only, unmodified code and constant data.
pub fn release_code_pages() -> io::Result<Released> {
    use std::os::unix::fs::MetadataExt;
    let exe = std::fs::metadata("/proc/self/exe")?;
    let device = (libc::major(exe.dev()), libc::minor(exe.dev()));
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut released = Released::default();
    for mapping in parse_smaps(&smaps) {
        if !releasable(&mapping, device, exe.ino()) {
            continue;
        }
        // SAFETY: the range is a whole mapping the kernel reported for this process, of a
        // read-only private file mapping with no anonymous page: MADV_DONTNEED only drops
        // page-table entries of clean file pages, which the next access maps again with the
        // same contents. No Rust object lives in it (it is the executable's text/rodata).
        let result = unsafe {
            libc::madvise(
                mapping.start as *mut libc::c_void,
                mapping.end - mapping.start,
                libc::MADV_DONTNEED,
            )
        };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
        released.mappings += 1;
        released.kib += mapping.rss_kib;
    }
    Ok(released)
}

/// The heap's free memory handed back by [`release_free_heap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FreedHeap {
    /// Free bytes the allocator held.
    pub free: usize,
    /// The process's resident kibibytes before and after.
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
}

/// Hands the allocator's free memory back to the kernel once more than `threshold` bytes of
/// it are free (issue 54 §8). glibc's malloc keeps what a burst freed — the allocations of
/// a purged job, a big list's buffers — in its arenas, so the agent's resident memory stayed
/// at its peak after purge and `system gc` until a restart. `malloc_trim(0)` returns every
/// wholly free page of every arena (`MADV_DONTNEED`); it holds each arena's lock while it
/// walks it, so it runs only when there is something worth returning. `None` when below the
/// threshold or not on glibc.
pub fn release_free_heap(threshold: usize) -> Option<FreedHeap> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: both are plain glibc calls with no pointer arguments; mallinfo2 only reads
        // the allocator's counters and malloc_trim only returns free pages to the kernel.
        let free = unsafe { libc::mallinfo2() }.fordblks;
        if free <= threshold {
            return None;
        }
        let rss_before_kib = resident_kib();
        // SAFETY: as above.
        unsafe { libc::malloc_trim(0) };
        Some(FreedHeap {
            free,
            rss_before_kib,
            rss_after_kib: resident_kib(),
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = threshold;
        None
    }
}

/// This process's resident kibibytes (`/proc/self/statm`), 0 when unreadable.
pub fn resident_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse::<u64>().ok())
        .map_or(0, |pages| pages * page / 1024)
}

fn releasable(mapping: &Mapping, device: (u32, u32), inode: u64) -> bool {
    mapping.device == device
        && mapping.inode == inode
        && inode != 0
        && !mapping.writable
        && mapping.anonymous_kib == 0
        && mapping.rss_kib > 0
}

fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut mappings: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        if let Some(mapping) = parse_header(line) {
            mappings.push(mapping);
            continue;
        }
        let Some(current) = mappings.last_mut() else { continue };
        let mut fields = line.split_whitespace();
        let (Some(name), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(kib) = value.parse::<u64>() else { continue };
        match name {
            "Rss:" => current.rss_kib = kib,
            "Anonymous:" => current.anonymous_kib = kib,
            _ => {}
        }
    }
    mappings
}

/// `start-end perms offset major:minor inode [path]`; None for a field line.
fn parse_header(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode = fields.next()?.parse().ok()?;
    if perms.len() != 4 {
        return None;
    }
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        writable: perms.as_bytes()[1] == b'w',
        device: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode,
        rss_kib: 0,
        anonymous_kib: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
5581c0000000-5581c0605000 r--p 00000000 fe:01 1234   /opt/agent
Size:               6164 kB
Rss:                2096 kB
Anonymous:             0 kB
5581c0605000-5581c1c01000 r-xp 00605000 fe:01 1234   /opt/agent
Size:              22512 kB
Rss:               17348 kB
Anonymous:             0 kB
5581c1c01000-5581c1cc2000 r--p 01c01000 fe:01 1234   /opt/agent
Rss:                 772 kB
Anonymous:           772 kB
5581c1cc2000-5581c1cc9000 rw-p 01cc2000 fe:01 1234   /opt/agent
Rss:                  28 kB
Anonymous:            28 kB
7f0000000000-7f0000200000 r-xp 00000000 fe:01 99   /usr/lib/libc.so.6
Rss:                1404 kB
Anonymous:             0 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
Rss:                 544 kB
Anonymous:           544 kB
";

    #[test]
    fn freed_heap_goes_back_to_the_kernel() {
        // 96 MiB in small blocks (each far below the mmap threshold, so they live in the
        // arena), touched, then freed out of order so nothing shrinks the heap on its own.
        let mut blocks: Vec<Vec<u8>> = (0..96 * 1024).map(|n| vec![n as u8; 1024]).collect();
        let kept: Vec<Vec<u8>> = blocks.iter().step_by(4096).cloned().collect();
        let held = resident_kib();
        blocks.reverse();
        drop(blocks);
        let freed = release_free_heap(32 << 20).expect("more than 32 MiB is free");
        assert!(
            freed.rss_after_kib + 48 * 1024 < held,
            "RSS held {held} KiB with the blocks; after the trim {freed:?}"
        );
        assert!(
            release_free_heap(usize::MAX).is_none(),
            "below the threshold: nothing done"
        );
        drop(kept);
    }

    #[test]
    fn only_the_executables_clean_read_only_mappings_are_released() {
        let chosen: Vec<(usize, u64)> = parse_smaps(SMAPS)
            .iter()
            .filter(|mapping| releasable(mapping, (0xfe, 1), 1234))
            .map(|mapping| (mapping.start, mapping.rss_kib))
            .collect();
        // Not the relocated read-only data (written at load time), nor .data, nor libc's
        // code, nor anonymous memory.
        assert_eq!(chosen, vec![(0x5581c0000000, 2096), (0x5581c0605000, 17348)]);
    }

    #[test]
    fn released_code_runs_again_and_the_executables_resident_pages_shrink() {
        use std::os::unix::fs::MetadataExt;
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        let device = (libc::major(exe.dev()), libc::minor(exe.dev()));
        let resident = || -> u64 {
            parse_smaps(&std::fs::read_to_string("/proc/self/smaps").unwrap())
                .iter()
                .filter(|mapping| releasable(mapping, device, exe.ino()))
                .map(|mapping| mapping.rss_kib)
                .sum()
        };
        let before = resident();
        let released = release_code_pages().expect("madvise");
        let after = resident();
        assert!(
            released.mappings >= 1,
            "the test binary's code is released: {released:?}"
        );
        assert!(after < before, "resident code {before} kB before, {after} kB after");
        // The code that reads smaps ran again, from the same file pages.
        assert_eq!(parse_smaps(SMAPS).len(), 6);
    }
}
