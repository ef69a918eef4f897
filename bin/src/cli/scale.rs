//! `job scale <job> [<group>] <count>`: a group's count changed within its scaling policy, then
//! followed like `job run` (Nomad's command and messages).

use serde_json::json;

use super::{Api, Failure, job_path, short, text};

pub(super) fn scale(api: &Api, id: &str, args: &[String], detach: bool) -> Result<(), Failure> {
    let (group, count) = match args {
        [count] => (None, count),
        [group, count] => (Some(group.clone()), count),
        _ => return Err(Failure("usage: job scale <job> [<group>] <count>".into(), 1)),
    };
    let count: i64 = count
        .parse()
        .map_err(|error| Failure(format!("Failed to convert count string to int: {error}"), 1))?;
    let group = match group {
        Some(group) => group,
        None => {
            let job = api.job_call("GET", &job_path(id), None, id)?;
            match job["TaskGroups"].as_array().map(Vec::as_slice) {
                Some([only]) => text(&only["Name"]),
                _ => {
                    return Err(Failure(
                        format!("Job {id:?} has more than one task group: name the group to scale"),
                        1,
                    ));
                }
            }
        }
    };
    let body = json!({
        "Count": count,
        "Target": {"Group": group},
        "Message": "submitted using the Nomad CLI",
    });
    let reply = api
        .call("PUT", &format!("{}/scale", job_path(id)), Some(&body))
        .map_err(|Failure(message, code)| Failure(format!("Error submitting scaling request: {message}"), code))?;
    println!("Job scale successful");
    let eval_id = text(&reply["EvalID"]);
    if detach || eval_id.is_empty() {
        if !eval_id.is_empty() {
            println!("Evaluation ID: {eval_id}");
        }
        return Ok(());
    }
    println!();
    println!("==> Monitoring evaluation {:?}", short(&reply["EvalID"]));
    super::job::monitor(api, &eval_id, reply["EvalCreateIndex"].as_u64().unwrap_or(0))
}
