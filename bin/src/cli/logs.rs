//! `agent alloc logs`: a task's stdout or stderr through `/v1/client/fs/logs`, in Nomad's
//! framed stream, from any agent; `-f` follows it, `-tail` starts from the end. And `agent
//! alloc fs`: the allocation dir, listed or printed.

use std::io::Write;

use base64::Engine;
use serde_json::Value;

use super::alloc::resolve_alloc;
use super::{Api, Failure, table, text, typed};
use drover_core::humanize::ibytes;
use drover_http::api;
use drover_io_real::jobs::ApiJob;

/// Nomad's CLI reads about this many bytes per line it is asked to tail.
const BYTES_PER_LINE: u64 = 120;
const DEFAULT_TAIL_LINES: usize = 10;

pub(super) struct LogsOptions {
    pub task: Option<String>,
    pub stderr: bool,
    pub follow: bool,
    pub tail: bool,
    pub lines: Option<usize>,
    pub bytes: Option<u64>,
}

/// The task to read: the one named, or the allocation's only task.
pub(super) fn task_of(alloc: &Value, named: Option<String>) -> Result<String, Failure> {
    if let Some(task) = named {
        return Ok(task);
    }
    let group = text(&alloc["TaskGroup"]);
    let job: ApiJob = typed("the allocation's job", &alloc["Job"]).unwrap_or_default();
    let tasks: Vec<String> = job
        .task_groups
        .into_iter()
        .filter(|candidate| candidate.name == group)
        .flat_map(|group| group.tasks)
        .map(|task| task.name)
        .collect();
    let tasks = if tasks.is_empty() {
        alloc["TaskStates"]
            .as_object()
            .map(|states| states.keys().cloned().collect())
            .unwrap_or_default()
    } else {
        tasks
    };
    match tasks.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(Failure(
            format!(
                "Allocation {:?} is running the following tasks:\n{}\n\nPlease specify the task.",
                text(&alloc["ID"]),
                tasks
                    .iter()
                    .map(|task| format!("  * {task}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
            1,
        )),
    }
}

pub(super) fn alloc_logs(api: &Api, id: &str, options: LogsOptions) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    let task = task_of(&alloc, options.task)?;
    let kind = if options.stderr { "stderr" } else { "stdout" };
    let lines = options.tail.then(|| options.lines.unwrap_or(DEFAULT_TAIL_LINES));
    let (origin, offset) = match (options.tail, options.bytes) {
        (false, _) => ("start", 0),
        (true, Some(bytes)) => ("end", bytes),
        (true, None) => ("end", lines.unwrap_or(DEFAULT_TAIL_LINES) as u64 * BYTES_PER_LINE),
    };
    let url = format!(
        "{}/v1/client/fs/logs/{}?task={task}&type={kind}&origin={origin}&offset={offset}&follow={}",
        api.base,
        text(&alloc["ID"]),
        options.follow
    );
    // No overall timeout: a followed log streams for as long as the task runs.
    let response = match api.authorize(api.agent.get(&url)).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(code, response)) => {
            let body = response.into_string().unwrap_or_default();
            return Err(Failure(
                format!("Unexpected response code: {code} ({})", body.trim()),
                1,
            ));
        }
        Err(error) => return Err(Failure(format!("Error querying {url}: {error}"), 1)),
    };
    let frames = serde_json::Deserializer::from_reader(response.into_reader()).into_iter::<api::StreamFrame>();
    let mut out = std::io::stdout().lock();
    // With -tail and no -c, whole lines only: the last N of what the first read returns (the
    // window asked for), then, following, everything after it.
    let whole_lines = lines.filter(|_| options.bytes.is_none());
    let mut held = Vec::new();
    let mut first = true;
    for frame in frames {
        let frame = frame.map_err(|error| Failure(format!("Error reading the log stream: {error}"), 1))?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(&frame.data)
            .map_err(|error| Failure(format!("Error decoding the log stream: {error}"), 1))?;
        let window = std::mem::replace(&mut first, false);
        let data = match whole_lines {
            Some(_) if !options.follow => {
                held.extend(data);
                continue;
            }
            Some(count) if window => last_lines(&data, count),
            _ => data,
        };
        if let Err(error) = out.write_all(&data).and_then(|()| out.flush()) {
            // The reader went away (`| head`): done, as Nomad's CLI is.
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(error.into());
        }
    }
    if let Some(count) = whole_lines {
        let _ = out.write_all(&last_lines(&held, count));
    }
    Ok(())
}

/// The last `count` lines of `data`.
fn last_lines(data: &[u8], count: usize) -> Vec<u8> {
    let text = String::from_utf8_lossy(data);
    let all: Vec<&str> = text.split_inclusive('\n').collect();
    all[all.len().saturating_sub(count)..].concat().into_bytes()
}

/// `alloc fs <alloc> [path]`: a directory as Nomad's table, a file's content, or with
/// `-stat` the file's own row.
pub(super) fn alloc_fs(api: &Api, id: &str, path: Option<&str>, stat: bool) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    let alloc_id = text(&alloc["ID"]);
    let path = path.unwrap_or("/");
    let query = |endpoint: &str| format!("/v1/client/fs/{endpoint}/{alloc_id}?path={path}");
    let info: api::AllocFileInfo = api.get_as(&query("stat"))?;
    let rows: Vec<api::AllocFileInfo> = if stat {
        vec![info]
    } else if info.is_dir {
        api.get_as(&query("ls"))?
    } else {
        let url = format!("{}{}", api.base, query("cat"));
        let response = api
            .authorize(api.agent.get(&url))
            .call()
            .map_err(|error| Failure(format!("Error reading file: {error}"), 1))?;
        let mut reader = response.into_reader();
        std::io::copy(&mut reader, &mut std::io::stdout().lock())?;
        return Ok(());
    };
    let mut table_rows = vec![vec![
        "Mode".to_string(),
        "Size".into(),
        "Modified Time".into(),
        "Name".into(),
    ]];
    for row in rows {
        let name = if row.is_dir { format!("{}/", row.name) } else { row.name };
        let modified = row.mod_time;
        table_rows.push(vec![
            row.file_mode,
            ibytes(row.size),
            modified
                .split('.')
                .next()
                .unwrap_or(&modified)
                .trim_end_matches('Z')
                .to_string()
                + "Z",
            name,
        ]);
    }
    println!("{}", table(&table_rows));
    Ok(())
}
