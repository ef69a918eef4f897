//! Reading a task's rotated logs as one stream (what `/v1/client/fs/logs` serves): from an
//! offset counted from the start or the end of what is kept, across the files the collector
//! rotates (`logmon`), and, when following, on as the task writes until it is dead.
//!
//! Chunks go into a bounded channel: a slow reader holds the stream back instead of being
//! buffered for without limit. A reader so slow that a file is rotated away before it got
//! there continues with the oldest file still kept (those lines are gone, as in Nomad).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::logmon::indexes;

/// How often a follower looks for new output.
pub const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// The most read into one chunk.
pub const CHUNK: usize = 64 * 1024;

/// Where a reader is: a file of the stream and a position in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub index: u64,
    pub position: u64,
}

/// Bytes of one log file: its name under the allocation dir (`alloc/logs/t.stdout.3`), the
/// file offset just past them, and the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub file: String,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// One step of reading: what was read at the cursor, where to read next, and whether the
/// reader has caught up with the writer (nothing newer to read for now).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub file: String,
    pub data: Vec<u8>,
    pub next: Cursor,
    pub caught_up: bool,
}

/// One read of a task's log (`/v1/client/fs/logs`), carried to the client that runs the
/// allocation as operators' restarts are (`service::relay`): from `cursor`, or, on the first
/// read, from `offset` counted from the start or the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsRequest {
    pub alloc_id: String,
    pub task: String,
    /// `stdout` or `stderr`.
    pub kind: String,
    pub from_end: bool,
    pub offset: u64,
    pub cursor: Option<Cursor>,
    pub max: u32,
}

/// Bytes as base64 in JSON (a JSON array of numbers would cost four to eight times as much
/// to encode, send and parse on every relayed read).
pub mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// What one read returned. `task_dead` is judged before reading: a follower that sees it
/// and catches up has read everything the task wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsReply {
    pub file: String,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    /// Where to read next; `None` while the stream has no file yet.
    pub next: Option<Cursor>,
    pub caught_up: bool,
    pub task_dead: bool,
}

impl LogsRequest {
    /// Carries out this read in `dir`, the allocation's log directory.
    pub fn read(&self, dir: &Path, task_dead: bool) -> LogsReply {
        let base = format!("{}.{}", self.task, self.kind);
        let cursor = self.cursor.or_else(|| locate(dir, &base, self.from_end, self.offset));
        let Some(cursor) = cursor else {
            return LogsReply {
                caught_up: true,
                task_dead,
                ..LogsReply::default()
            };
        };
        let step = read_at(dir, &base, cursor, (self.max as usize).clamp(1, 4 * CHUNK));
        LogsReply {
            file: step.file,
            data: step.data,
            next: Some(step.next),
            caught_up: step.caught_up,
            task_dead,
        }
    }
}

/// The size of a log file; 0 for anything else in its place (a link's target is not looked at).
fn size(dir: &Path, base: &str, index: u64) -> u64 {
    std::fs::symlink_metadata(dir.join(format!("{base}.{index}")))
        .ok()
        .filter(|meta| meta.file_type().is_file())
        .map_or(0, |meta| meta.len())
}

/// The cursor `offset` points at, counted from the start or the end of what is kept; `None`
/// while the stream has no file yet.
pub fn locate(dir: &Path, base: &str, from_end: bool, offset: u64) -> Option<Cursor> {
    let files = indexes(dir, base);
    let (&first, &last) = files.first().zip(files.last())?;
    let mut left = offset;
    if from_end {
        for &index in files.iter().rev() {
            let size = size(dir, base, index);
            if left <= size {
                return Some(Cursor {
                    index,
                    position: size - left,
                });
            }
            left -= size;
        }
        return Some(Cursor {
            index: first,
            position: 0,
        });
    }
    for &index in &files {
        let size = size(dir, base, index);
        if left < size {
            return Some(Cursor { index, position: left });
        }
        left -= size;
    }
    Some(Cursor {
        index: last,
        position: size(dir, base, last),
    })
}

/// At most `max` bytes of the file at `cursor`, past its position.
fn read_file(dir: &Path, base: &str, cursor: Cursor, max: usize) -> Option<Vec<u8>> {
    // Never through a link or a FIFO a task planted in place of a log file (issue 54).
    let mut file = crate::logfile::LogDir::open(dir)
        .and_then(|logs| logs.read(&format!("{base}.{}", cursor.index)))
        .ok()?;
    file.seek(SeekFrom::Start(cursor.position)).ok()?;
    let mut buffer = vec![0u8; max];
    let read = file.read(&mut buffer).ok()?;
    buffer.truncate(read);
    Some(buffer)
}

/// Reads at most `max` bytes at `cursor`, moving on to newer files as the collector rotates.
pub fn read_at(dir: &Path, base: &str, mut cursor: Cursor, max: usize) -> Step {
    loop {
        let data = read_file(dir, base, cursor, max).unwrap_or_default();
        if !data.is_empty() {
            let next = Cursor {
                index: cursor.index,
                position: cursor.position + data.len() as u64,
            };
            return Step {
                file: format!("alloc/logs/{base}.{}", cursor.index),
                data,
                next,
                caught_up: false,
            };
        }
        let newer = indexes(dir, base).into_iter().find(|other| *other > cursor.index);
        let Some(newer) = newer else {
            return Step {
                file: format!("alloc/logs/{base}.{}", cursor.index),
                data,
                next: cursor,
                caught_up: true,
            };
        };
        // A newer file exists, so the collector is done with this one; what it wrote last
        // may have landed after the read above.
        let last = read_file(dir, base, cursor, max).unwrap_or_default();
        if !last.is_empty() {
            continue;
        }
        // Rotated away under a slow reader: on with the oldest file kept.
        cursor = Cursor {
            index: newer,
            position: 0,
        };
    }
}

/// Streams a log into `out`, one read after the other through `read` (this client's, or a
/// relay's), starting with the answer to `request`'s first read: until it is read to the end,
/// or, following, until the task was dead before a read that caught up; or until the reader
/// of `out` goes away or a read fails.
pub async fn pump<F, Fut>(mut request: LogsRequest, first: LogsReply, follow: bool, read: F, out: mpsc::Sender<Chunk>)
where
    F: Fn(LogsRequest) -> Fut,
    Fut: std::future::Future<Output = Result<LogsReply, drover_core::error::AllocCallError>>,
{
    let mut reply = first;
    loop {
        if reply.next.is_some() {
            request.cursor = reply.next;
        }
        if !reply.data.is_empty() {
            let chunk = Chunk {
                file: reply.file,
                offset: reply.next.map_or(0, |cursor| cursor.position),
                data: reply.data,
            };
            if out.send(chunk).await.is_err() {
                return;
            }
        } else if reply.caught_up {
            if !follow || reply.task_dead {
                return;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
        reply = match read(request.clone()).await {
            Ok(reply) => reply,
            Err(error) => {
                tracing::debug!(%error, "log stream ended");
                return;
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn request(from_end: bool, offset: u64) -> LogsRequest {
        LogsRequest {
            alloc_id: "a1".into(),
            task: "t".into(),
            kind: "stdout".into(),
            from_end,
            offset,
            cursor: None,
            max: 16,
        }
    }

    /// Everything a pump with a local reader delivers, and the files it came from.
    async fn collect(dir: &Path, request: LogsRequest, follow: bool, dead: Arc<AtomicBool>) -> (String, Vec<String>) {
        let dir = dir.to_path_buf();
        let read = move |request: LogsRequest| {
            let (dir, dead) = (dir.clone(), dead.clone());
            async move { Ok(request.read(&dir, dead.load(Ordering::SeqCst))) }
        };
        let first = read(request.clone()).await.unwrap();
        let (sender, mut receiver) = mpsc::channel(2);
        tokio::spawn(pump(request, first, follow, read, sender));
        let (mut text, mut files) = (Vec::new(), Vec::new());
        while let Some(chunk) = receiver.recv().await {
            text.extend(chunk.data);
            if files.last() != Some(&chunk.file) {
                files.push(chunk.file);
            }
        }
        (String::from_utf8(text).unwrap(), files)
    }

    #[tokio::test]
    async fn offsets_count_across_the_rotated_files() {
        let dir = tempfile::tempdir().unwrap();
        for (index, text) in [(3, "one\n"), (4, "two\n"), (5, "six")] {
            std::fs::write(dir.path().join(format!("t.stdout.{index}")), text).unwrap();
        }
        let dead = Arc::new(AtomicBool::new(true));
        let read = |from_end, offset| collect(dir.path(), request(from_end, offset), false, dead.clone());
        let (all, files) = read(false, 0).await;
        assert_eq!(all, "one\ntwo\nsix");
        assert_eq!(
            files,
            [
                "alloc/logs/t.stdout.3",
                "alloc/logs/t.stdout.4",
                "alloc/logs/t.stdout.5"
            ]
        );
        assert_eq!(read(false, 5).await.0, "wo\nsix");
        assert_eq!(read(true, 5).await.0, "o\nsix");
        assert_eq!(read(true, 100).await.0, "one\ntwo\nsix");
        assert_eq!(read(false, 100).await.0, "");
    }

    #[tokio::test]
    async fn a_follower_sees_every_line_once_across_rotations() {
        let dir = tempfile::tempdir().unwrap();
        let mut rotator = crate::logmon::Rotator::open(dir.path(), "t.stdout", 100, 64).unwrap();
        let dead = Arc::new(AtomicBool::new(false));
        let writer = {
            let dead = dead.clone();
            tokio::spawn(async move {
                for line in 0..500 {
                    rotator.write(format!("line {line}\n").as_bytes()).unwrap();
                    if line % 50 == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                dead.store(true, Ordering::SeqCst);
            })
        };
        let (text, _) = collect(dir.path(), request(false, 0), true, dead).await;
        writer.await.unwrap();
        let expected: String = (0..500).map(|line| format!("line {line}\n")).collect();
        assert_eq!(text, expected);
    }
}
