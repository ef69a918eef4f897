//! Task log rotation (Nomad's `logmon`): a task's stdout and stderr go into pipes, and a small
//! collector process per stream copies what it reads into `<task>.<stream>.<n>` files of at
//! most `max_file_size` bytes, keeping the newest `max_files`.
//!
//! The collector is its own process, started by the agent as `agent logmon ...` in a session
//! of its own and outside the task's cgroup: it outlives an agent restart (the task keeps
//! writing into the pipe, nothing is lost while the agent is away) and ends by itself when
//! every writer of the pipe is gone (the task and all its processes), after writing all it
//! read. Nothing read is ever dropped: a chunk that would overflow a file is split at its last
//! line break that fits, so lines stay whole unless one line alone is longer than a file.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::logfile::LogDir;

/// The agent's hidden subcommand that runs one collector.
pub const SUBCOMMAND: &str = "logmon";

/// Writes a stream into rotated files `<dir>/<base>.<index>`.
#[derive(Debug)]
pub struct Rotator {
    dir: PathBuf,
    /// `dir`, opened: every file is opened through it, never through a link a task planted.
    logs: LogDir,
    base: String,
    max_files: u64,
    max_size: u64,
    index: u64,
    file: File,
    size: u64,
}

/// The indexes of the files `<base>.<n>` in `dir`, ascending.
pub fn indexes(dir: &Path, base: &str) -> Vec<u64> {
    let prefix = format!("{base}.");
    let mut found: Vec<u64> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| {
                    let name = entry.file_name().into_string().ok()?;
                    name.strip_prefix(&prefix)?.parse::<u64>().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_unstable();
    found
}

impl Rotator {
    /// Continues the newest existing file (a task restarted writes on where it left off),
    /// or starts at index 0.
    pub fn open(dir: &Path, base: &str, max_files: u32, max_size: u64) -> io::Result<Rotator> {
        std::fs::create_dir_all(dir)?;
        let logs = LogDir::open(dir)?;
        let index = indexes(dir, base).last().copied().unwrap_or(0);
        let (file, size) = Self::open_index(&logs, base, index)?;
        Ok(Rotator {
            dir: dir.to_path_buf(),
            logs,
            base: base.to_string(),
            max_files: u64::from(max_files.max(1)),
            max_size: max_size.max(1),
            index,
            file,
            size,
        })
    }

    fn open_index(logs: &LogDir, base: &str, index: u64) -> io::Result<(File, u64)> {
        let file = logs.append(&format!("{base}.{index}"))?;
        let size = file.metadata()?.len();
        Ok((file, size))
    }

    /// Writes all of `data`, rotating as files fill up.
    pub fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let room = self.max_size.saturating_sub(self.size) as usize;
            if data.len() <= room {
                self.put(data)?;
                return Ok(());
            }
            // Split at the last line break that fits, so no line straddles two files.
            match data[..room].iter().rposition(|byte| *byte == b'\n') {
                Some(at) => {
                    self.put(&data[..=at])?;
                    data = &data[at + 1..];
                }
                // The line started in this file cannot end in it: it starts the next one.
                None if self.size > 0 => {}
                // A single line longer than a whole file: split it, nothing else can be done.
                None => {
                    self.put(&data[..room])?;
                    data = &data[room..];
                }
            }
            self.rotate()?;
        }
        Ok(())
    }

    fn put(&mut self, data: &[u8]) -> io::Result<()> {
        self.file.write_all(data)?;
        self.size += data.len() as u64;
        Ok(())
    }

    /// The next file; files beyond the newest `max_files` are removed.
    fn rotate(&mut self) -> io::Result<()> {
        self.index += 1;
        let (file, size) = Self::open_index(&self.logs, &self.base, self.index)?;
        self.file = file;
        self.size = size;
        for old in indexes(&self.dir, &self.base) {
            if old + self.max_files <= self.index {
                let _ = self.logs.remove(&format!("{}.{old}", self.base));
            }
        }
        Ok(())
    }
}

/// Copies `input` into `rotator` until end of file.
pub fn pump(mut input: impl Read, rotator: &mut Rotator) -> io::Result<()> {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match input.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(read) => rotator.write(&buffer[..read])?,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        }
    }
}

/// The arguments of one collector: `<dir> <base> <max_files> <max_file_size_bytes>`.
pub fn args(dir: &Path, base: &str, max_files: u32, max_size: u64) -> Vec<OsString> {
    vec![
        SUBCOMMAND.into(),
        dir.as_os_str().to_owned(),
        base.into(),
        max_files.to_string().into(),
        max_size.to_string().into(),
    ]
}

/// `agent logmon <dir> <base> <max_files> <max_file_size_bytes>`: copies stdin into rotated
/// files until every writer of it is gone.
pub fn main(mut args: impl Iterator<Item = OsString>) -> ExitCode {
    // A session of its own, so a signal to the agent's process group (a terminal's Ctrl-C)
    // does not end it before the task's output; done here rather than in a `pre_exec` of
    // the agent, which would make the agent fork to start it.
    // SAFETY: setsid takes no arguments.
    unsafe { libc::setsid() };
    let mut next = || args.next().and_then(|arg| arg.into_string().ok());
    let (Some(dir), Some(base), Some(files), Some(size)) = (next(), next(), next(), next()) else {
        eprintln!("usage: agent logmon <dir> <base> <max_files> <max_file_size_bytes>");
        return ExitCode::from(2);
    };
    let (Ok(files), Ok(size)) = (files.parse::<u32>(), size.parse::<u64>()) else {
        eprintln!("logmon: max_files and max_file_size must be numbers");
        return ExitCode::from(2);
    };
    let result = Rotator::open(Path::new(&dir), &base, files, size)
        .and_then(|mut rotator| pump(io::stdin().lock(), &mut rotator));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("logmon {dir}/{base}: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 54: a task that planted `t.stdout.1 -> <host file>` had the host file created and
    /// appended as root on rotation; the rotation now writes a fresh file of its own instead.
    #[test]
    fn rotation_does_not_write_through_a_link_the_task_planted() {
        let root = tempfile::tempdir().unwrap();
        let logs = root.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let host = root.path().join("host-file");
        let mut rotator = Rotator::open(&logs, "t.stdout", 3, 8).unwrap();
        // Planted while the collector writes file 0.
        std::os::unix::fs::symlink(&host, logs.join("t.stdout.1")).unwrap();
        rotator.write(b"1234567\nabcdefg\n").unwrap();
        assert!(!host.exists(), "the link's target was created");
        assert_eq!(
            read(&logs, "t.stdout"),
            vec![(0, "1234567\n".to_string()), (1, "abcdefg\n".to_string())]
        );
        assert!(
            std::fs::symlink_metadata(logs.join("t.stdout.1"))
                .unwrap()
                .file_type()
                .is_file()
        );
    }

    fn read(dir: &Path, base: &str) -> Vec<(u64, String)> {
        indexes(dir, base)
            .into_iter()
            .map(|index| {
                let text = std::fs::read_to_string(dir.join(format!("{base}.{index}"))).unwrap();
                (index, text)
            })
            .collect()
    }

    #[test]
    fn lines_stay_whole_and_the_oldest_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut rotator = Rotator::open(dir.path(), "t.stdout", 3, 10).unwrap();
        // "aaaa\nbbbb\n" fills file 0 exactly; "cc\nddddddd\n" splits after "cc\n".
        rotator.write(b"aaaa\nbbbb\n").unwrap();
        rotator.write(b"cc\nddddddd\n").unwrap();
        assert_eq!(
            read(dir.path(), "t.stdout"),
            [(0, "aaaa\nbbbb\n".into()), (1, "cc\n".into()), (2, "ddddddd\n".into())]
        );
        // A line longer than a file is split; two more files push the first two out.
        rotator.write(b"0123456789012\n").unwrap();
        assert_eq!(
            read(dir.path(), "t.stdout"),
            [(2, "ddddddd\n".into()), (3, "0123456789".into()), (4, "012\n".into())]
        );
    }

    #[test]
    fn a_new_collector_continues_the_newest_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = Rotator::open(dir.path(), "t.stderr", 10, 8).unwrap();
        first.write(b"one\ntwo\nsix\n").unwrap();
        drop(first);
        let mut second = Rotator::open(dir.path(), "t.stderr", 10, 8).unwrap();
        pump(&b"ten\n"[..], &mut second).unwrap();
        assert_eq!(
            read(dir.path(), "t.stderr"),
            [(0, "one\ntwo\n".into()), (1, "six\nten\n".into())]
        );
    }
}
