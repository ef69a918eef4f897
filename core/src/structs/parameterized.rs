//! Parameterized jobs (Nomad's `ParameterizedJobConfig`): a parent job that is never
//! scheduled itself; each `job dispatch` registers a child,
//! `<parent>/dispatch-<unix seconds>-<8 hex>`, with the dispatch's payload and meta.

use super::*;

/// What dispatched children are called after: `<parent>/dispatch-<unix>-<8 hex>`.
pub const DISPATCH_LAUNCH_SUFFIX: &str = "/dispatch-";

/// The most a dispatch may carry (Nomad's `DispatchPayloadSizeLimit`, 16 KiB).
pub const DISPATCH_PAYLOAD_SIZE_LIMIT: usize = 16 * 1024;

pub const DISPATCH_PAYLOAD_OPTIONAL: &str = "optional";
pub const DISPATCH_PAYLOAD_REQUIRED: &str = "required";
pub const DISPATCH_PAYLOAD_FORBIDDEN: &str = "forbidden";

/// Nomad's `ParameterizedJobConfig`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterizedJobConfig {
    /// `optional` (the default), `required` or `forbidden`.
    pub payload: String,
    pub meta_required: Vec<String>,
    pub meta_optional: Vec<String>,
}

impl Default for ParameterizedJobConfig {
    fn default() -> Self {
        ParameterizedJobConfig {
            payload: DISPATCH_PAYLOAD_OPTIONAL.into(),
            meta_required: Vec::new(),
            meta_optional: Vec::new(),
        }
    }
}

impl ParameterizedJobConfig {
    /// Nomad's `ParameterizedJobConfig.Validate`, with its texts.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if ![
            DISPATCH_PAYLOAD_OPTIONAL,
            DISPATCH_PAYLOAD_REQUIRED,
            DISPATCH_PAYLOAD_FORBIDDEN,
        ]
        .contains(&self.payload.as_str())
        {
            problems.push(format!("Unknown payload requirement: {:?}", self.payload));
        }
        let both: Vec<&String> = self
            .meta_required
            .iter()
            .filter(|key| self.meta_optional.contains(key))
            .collect();
        if !both.is_empty() {
            let keys: Vec<&str> = both.iter().map(|key| key.as_str()).collect();
            problems.push(format!(
                "Required and optional meta keys should be disjoint. Following keys exist in both: [{}]",
                keys.join(" ")
            ));
        }
        problems
    }

    /// Nomad's `validateDispatchRequest`: the payload against the requirement and the meta
    /// keys against the required and optional ones, with its texts.
    pub fn check_dispatch(&self, payload: &[u8], meta: &BTreeMap<String, String>) -> Result<(), String> {
        match self.payload.as_str() {
            DISPATCH_PAYLOAD_REQUIRED if payload.is_empty() => {
                return Err("Payload is not provided but required by parameterized job".into());
            }
            DISPATCH_PAYLOAD_FORBIDDEN if !payload.is_empty() => {
                return Err("Payload provided but forbidden by parameterized job".into());
            }
            _ => {}
        }
        if payload.len() > DISPATCH_PAYLOAD_SIZE_LIMIT {
            return Err(format!(
                "Payload exceeds maximum size; {} > {}",
                payload.len(),
                DISPATCH_PAYLOAD_SIZE_LIMIT
            ));
        }
        let unpermitted: Vec<&str> = meta
            .keys()
            .filter(|key| !self.meta_required.contains(key) && !self.meta_optional.contains(key))
            .map(String::as_str)
            .collect();
        if !unpermitted.is_empty() {
            return Err(format!(
                "Dispatch request included unpermitted metadata keys: [{}]",
                unpermitted.join(" ")
            ));
        }
        let missing: Vec<&str> = self
            .meta_required
            .iter()
            .filter(|key| !meta.contains_key(*key))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "Dispatch did not provide required meta keys: [{}]",
                missing.join(" ")
            ));
        }
        Ok(())
    }
}

/// A task's `dispatch_payload { file }`: where in the task's `local/` the payload is written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchPayloadConfig {
    pub file: String,
}

impl Job {
    /// Whether the job is a parameterized parent (Nomad's `IsParameterized`): a dispatched
    /// child keeps the block but is not one.
    pub fn is_parameterized(&self) -> bool {
        self.parameterized.is_some() && !self.dispatched
    }

    /// The child `job dispatch` registers: the parent's spec under the child's ID and name,
    /// with the payload, the dispatch's meta over the parent's, and the idempotency token.
    pub fn dispatch_child(
        &self,
        id: String,
        payload: Vec<u8>,
        meta: &BTreeMap<String, String>,
        idempotency_token: &str,
    ) -> Job {
        let mut merged = self.meta.clone();
        merged.extend(meta.iter().map(|(key, value)| (key.clone(), value.clone())));
        Job {
            name: id.clone(),
            id,
            parent_id: self.id.clone(),
            dispatched: true,
            payload,
            meta: merged,
            dispatch_idempotency_token: idempotency_token.to_string(),
            stop: false,
            stable: false,
            version: 0,
            create_index: 0,
            modify_index: 0,
            job_modify_index: 0,
            submit_time_ms: 0,
            ..self.clone()
        }
    }
}

/// Whether a `dispatch_payload { file }` stays inside the task's `local/` directory: relative,
/// with no `..` segment.
pub fn payload_file_is_local(file: &str) -> bool {
    !file.is_empty() && !file.starts_with('/') && file.split('/').all(|segment| segment != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_file_stays_inside_local() {
        for file in ["input.txt", "in/input.txt", "a/./b"] {
            assert!(payload_file_is_local(file), "{file}");
        }
        for file in ["", "/etc/passwd", "../secrets/token", "in/../../x"] {
            assert!(!payload_file_is_local(file), "{file}");
        }
    }
}
