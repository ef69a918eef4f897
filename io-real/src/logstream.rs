//! Reading a task's rotated logs as one stream (what `/v1/client/fs/logs` serves): from an
//! offset counted from the start or the end of what is kept, across the files the collector
//! rotates (`logmon`), and, when following, on as the task writes until it is dead.
//!
//! Chunks go into a bounded channel: a slow reader holds the stream back instead of being
//! buffered for without limit. A reader so slow that a file is rotated away before it got
//! there continues with the oldest file still kept (those lines are gone, as in Nomad).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::logmon::indexes;

/// How often a follower looks for new output.
pub const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// The most read into one chunk.
pub const CHUNK: usize = 64 * 1024;

/// Bytes of one log file: its name under the allocation dir (`alloc/logs/t.stdout.3`), the
/// file offset just past them, and the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub file: String,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// Which stream, and from where.
#[derive(Clone, Debug)]
pub struct LogRead {
    pub dir: PathBuf,
    /// `<task>.<stdout|stderr>`.
    pub base: String,
    /// Count `offset` back from the end of what is kept (else forward from its start).
    pub from_end: bool,
    pub offset: u64,
    pub follow: bool,
}

fn size(dir: &Path, base: &str, index: u64) -> u64 {
    std::fs::metadata(dir.join(format!("{base}.{index}"))).map_or(0, |meta| meta.len())
}

/// The file and position `offset` points at.
fn start(read: &LogRead, files: &[u64]) -> (u64, u64) {
    let Some((&first, &last)) = files.first().zip(files.last()) else {
        return (0, 0);
    };
    let mut left = read.offset;
    if read.from_end {
        for &index in files.iter().rev() {
            let size = size(&read.dir, &read.base, index);
            if left <= size {
                return (index, size - left);
            }
            left -= size;
        }
        return (first, 0);
    }
    for &index in files {
        let size = size(&read.dir, &read.base, index);
        if left < size {
            return (index, left);
        }
        left -= size;
    }
    (last, size(&read.dir, &read.base, last))
}

/// Reads what `index` holds past `position`, in chunks, into `out`; the new position, or
/// `None` when the reader is gone.
async fn drain(read: &LogRead, index: u64, mut position: u64, out: &mpsc::Sender<Chunk>) -> Option<u64> {
    let path = read.dir.join(format!("{}.{index}", read.base));
    let Ok(mut file) = std::fs::File::open(&path) else {
        return Some(position);
    };
    if file.seek(SeekFrom::Start(position)).is_err() {
        return Some(position);
    }
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let read_now = match file.read(&mut buffer) {
            Ok(0) | Err(_) => return Some(position),
            Ok(read_now) => read_now,
        };
        position += read_now as u64;
        let chunk = Chunk {
            file: format!("alloc/logs/{}.{index}", read.base),
            offset: position,
            data: buffer[..read_now].to_vec(),
        };
        out.send(chunk).await.ok()?;
    }
}

/// Streams the log into `out` until it is read to the end (or, following, until `finished`
/// says the task is done and nothing more came), or until the reader goes away.
pub async fn stream(read: LogRead, finished: impl Fn() -> bool, out: mpsc::Sender<Chunk>) {
    let mut files = indexes(&read.dir, &read.base);
    while files.is_empty() {
        if !read.follow || finished() {
            return;
        }
        tokio::time::sleep(FOLLOW_POLL).await;
        files = indexes(&read.dir, &read.base);
    }
    let (mut index, mut position) = start(&read, &files);
    loop {
        // Asked before reading: once the task was done then, this pass reads all it wrote.
        let was_finished = finished();
        let Some(now) = drain(&read, index, position, &out).await else {
            return;
        };
        position = now;
        let newer = indexes(&read.dir, &read.base).into_iter().find(|other| *other > index);
        if let Some(next) = newer {
            // A newer file exists, so the collector is done with this one: read what it wrote
            // last before moving on.
            if drain(&read, index, position, &out).await.is_none() {
                return;
            }
            // Rotated away under a slow reader: on with the oldest file kept.
            index = indexes(&read.dir, &read.base)
                .into_iter()
                .find(|other| *other >= next)
                .unwrap_or(next);
            position = 0;
            continue;
        }
        if !read.follow || was_finished {
            return;
        }
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(read: LogRead) -> (String, Vec<String>) {
        let (sender, mut receiver) = mpsc::channel(4);
        tokio::spawn(stream(read, || true, sender));
        let (mut text, mut files) = (Vec::new(), Vec::new());
        while let Some(chunk) = receiver.recv().await {
            text.extend(chunk.data);
            files.push(chunk.file);
        }
        (String::from_utf8(text).unwrap(), files)
    }

    fn read(dir: &Path, from_end: bool, offset: u64) -> LogRead {
        LogRead {
            dir: dir.to_path_buf(),
            base: "t.stdout".into(),
            from_end,
            offset,
            follow: false,
        }
    }

    #[tokio::test]
    async fn offsets_count_across_the_rotated_files() {
        let dir = tempfile::tempdir().unwrap();
        for (index, text) in [(3, "one\n"), (4, "two\n"), (5, "six")] {
            std::fs::write(dir.path().join(format!("t.stdout.{index}")), text).unwrap();
        }
        let (all, files) = collect(read(dir.path(), false, 0)).await;
        assert_eq!(all, "one\ntwo\nsix");
        assert_eq!(
            files,
            [
                "alloc/logs/t.stdout.3",
                "alloc/logs/t.stdout.4",
                "alloc/logs/t.stdout.5"
            ]
        );
        assert_eq!(collect(read(dir.path(), false, 5)).await.0, "wo\nsix");
        assert_eq!(collect(read(dir.path(), true, 5)).await.0, "o\nsix");
        assert_eq!(collect(read(dir.path(), true, 100)).await.0, "one\ntwo\nsix");
        assert_eq!(collect(read(dir.path(), false, 100)).await.0, "");
    }

    #[tokio::test]
    async fn a_follower_sees_every_line_once_across_rotations() {
        let dir = tempfile::tempdir().unwrap();
        let mut rotator = crate::logmon::Rotator::open(dir.path(), "t.stdout", 100, 64).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sender, mut receiver) = mpsc::channel(2);
        let finished = {
            let done = done.clone();
            move || done.load(std::sync::atomic::Ordering::SeqCst)
        };
        let follow = LogRead {
            follow: true,
            ..read(dir.path(), false, 0)
        };
        tokio::spawn(stream(follow, finished, sender));
        let writer = tokio::spawn(async move {
            for line in 0..500 {
                rotator.write(format!("line {line}\n").as_bytes()).unwrap();
                if line % 50 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut text = Vec::new();
        while let Some(chunk) = receiver.recv().await {
            text.extend(chunk.data);
        }
        writer.await.unwrap();
        let expected: String = (0..500).map(|line| format!("line {line}\n")).collect();
        assert_eq!(String::from_utf8(text).unwrap(), expected);
    }
}
