//! The query parameters every endpoint shares, checked before any handler runs: a value Drover
//! cannot read is refused with 400 naming the parameter, never ignored (a `?wait=forever` that
//! quietly blocked for the default, a `?task_states=nah` that quietly meant true).
//!
//! Checked here: the blocking-query options (`index`, `wait`), pagination (`per_page`), the
//! booleans any list or read takes (`stale`, `resources`, `task_states`, `os`, `meta`,
//! `reverse`, …; Go's `strconv.ParseBool` spellings, an empty value meaning absent as Nomad's
//! `parseBool` reads it) and `region`, which must be this agent's: Drover serves one region and
//! forwards to no other (Nomad's `No path to region`). Endpoint-specific values (`type`,
//! `filter`, `topic`, …) are checked by their handlers.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use drover_io_real::driver::AgentHandle;

/// Boolean parameters, by name, whatever the endpoint. (`stale` is `reads.rs`'s: a bare
/// `?stale` means true.)
const BOOLEANS: &[&str] = &[
    "resources",
    "task_states",
    "os",
    "meta",
    "reverse",
    "purge",
    "global",
    "all",
    "plain",
    "follow",
    "force",
    "detach",
    "diff",
    "ignore_system_jobs",
    "policy_override",
];

/// Why a query cannot be read: the status and Nomad's text.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused(pub StatusCode, pub String);

/// Checks the shared parameters of `query` for an agent of `region`.
pub fn check(query: Option<&str>, region: &str) -> Result<(), Refused> {
    let Some(query) = query else { return Ok(()) };
    let bad = |text: String| Err(Refused(StatusCode::BAD_REQUEST, text));
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "index" => {
                if let Err(error) = value.parse::<u64>() {
                    return bad(format!("Invalid index: strconv.ParseUint: parsing {value:?}: {error}"));
                }
            }
            "wait" if drover_core::goduration::parse(value.trim()).is_err() => {
                return bad(format!("Invalid wait time: time: invalid duration {value:?}"));
            }
            "per_page" if value.parse::<u32>().is_err() => {
                return bad(format!("Invalid per_page: {value:?} is not a count"));
            }
            "region" if !value.is_empty() && value != region => {
                return Err(Refused(StatusCode::INTERNAL_SERVER_ERROR, "No path to region".into()));
            }
            name if BOOLEANS.contains(&name) && !value.is_empty() && super::parse_bool(&value).is_none() => {
                return bad(format!(
                    "Failed to parse value of {name:?} ({value:?}) as a bool: strconv.ParseBool: parsing {value:?}: invalid syntax"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

pub async fn checked(State(handle): State<AgentHandle>, request: Request, next: Next) -> Response {
    match check(request.uri().query(), &handle.config().region) {
        Ok(()) => next.run(request).await,
        Err(Refused(status, text)) => (status, text).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(query: &str) -> String {
        match check(Some(query), "global") {
            Err(Refused(_, text)) => text,
            Ok(()) => panic!("{query} was let through"),
        }
    }

    #[test]
    fn readable_values_pass() {
        for query in [
            "index=12&wait=5s",
            "wait=1m30s",
            "per_page=10&next_token=abc",
            "stale",
            "resources=true&task_states=0&os=T&meta=FALSE",
            "resources=",
            "region=global",
            "prefix=zz&namespace=*&filter=ID%20%3D%3D%20%22x%22",
            "unknown=anything",
        ] {
            assert_eq!(check(Some(query), "global"), Ok(()), "{query}");
        }
    }

    #[test]
    fn each_unreadable_value_is_refused_by_name() {
        assert_eq!(
            refused("index=abc"),
            "Invalid index: strconv.ParseUint: parsing \"abc\": invalid digit found in string"
        );
        assert_eq!(
            refused("wait=forever"),
            "Invalid wait time: time: invalid duration \"forever\""
        );
        assert_eq!(refused("per_page=x"), "Invalid per_page: \"x\" is not a count");
        assert_eq!(
            refused("task_states=nah"),
            "Failed to parse value of \"task_states\" (\"nah\") as a bool: strconv.ParseBool: parsing \"nah\": invalid syntax"
        );
        for name in BOOLEANS {
            assert!(refused(&format!("{name}=maybe")).contains(name), "{name}");
        }
        assert_eq!(
            check(Some("region=mars"), "global"),
            Err(Refused(StatusCode::INTERNAL_SERVER_ERROR, "No path to region".into()))
        );
    }
}
