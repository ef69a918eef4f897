//! `job dispatch`: a child of a parameterized job with a payload (a file, or stdin with `-`)
//! and `-meta key=value` pairs, followed like `job run` (Nomad's layout).

use std::collections::BTreeMap;
use std::io::Read as _;

use base64::Engine as _;
use serde_json::json;

use super::{Api, Failure, job_path, short, table, text};

pub(super) struct DispatchOptions {
    pub meta: Vec<String>,
    pub idempotency_token: Option<String>,
    pub detach: bool,
}

pub(super) fn dispatch(api: &Api, id: &str, input: Option<&str>, options: DispatchOptions) -> Result<(), Failure> {
    let mut meta = BTreeMap::new();
    for pair in &options.meta {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(Failure(
                format!("Error parsing meta value: {pair:?} (want key=value)"),
                1,
            ));
        };
        meta.insert(key.to_string(), value.to_string());
    }
    let payload = match input {
        None => Vec::new(),
        Some("-") => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|error| Failure(format!("Error reading input data: {error}"), 1))?;
            bytes
        }
        Some(file) => std::fs::read(file).map_err(|error| Failure(format!("Error reading input data: {error}"), 1))?,
    };
    let body = json!({
        "JobID": id,
        "Payload": (!payload.is_empty()).then(|| base64::engine::general_purpose::STANDARD.encode(&payload)),
        "Meta": meta,
        "IdempotencyToken": options.idempotency_token.unwrap_or_default(),
    });
    let reply = api
        .call("PUT", &format!("{}/dispatch", job_path(id)), Some(&body))
        .map_err(|Failure(message, code)| Failure(format!("Failed to dispatch job: {message}"), code))?;
    let eval_id = text(&reply["EvalID"]);
    let mut rows = vec![vec![
        "Dispatched Job ID".into(),
        "=".into(),
        text(&reply["DispatchedJobID"]),
    ]];
    if !eval_id.is_empty() {
        rows.push(vec!["Evaluation ID".into(), "=".into(), eval_id.clone()]);
    }
    println!("{}", table(&rows).replace("  =  ", " = "));
    if options.detach || eval_id.is_empty() {
        return Ok(());
    }
    println!();
    println!("==> Monitoring evaluation {:?}", short(&reply["EvalID"]));
    super::job::monitor(api, &eval_id, reply["EvalCreateIndex"].as_u64().unwrap_or(0))
}
