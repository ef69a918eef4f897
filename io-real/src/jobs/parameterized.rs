//! Parameterized jobs in Nomad's API form: the job's `ParameterizedJob` block (payload
//! requirement, required and optional meta keys), a task's `DispatchPayload { File }`, and a
//! dispatched child's `Payload` (bytes, base64 in JSON as Go's `[]byte`).

use drover_core::structs::{
    DISPATCH_PAYLOAD_OPTIONAL, DispatchPayloadConfig, JobType, ParameterizedJobConfig, payload_file_is_local,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nomad's `api.ParameterizedJobConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiParameterizedJobConfig {
    pub payload: String,
    pub meta_required: Option<Vec<String>>,
    pub meta_optional: Option<Vec<String>>,
}

impl ApiParameterizedJobConfig {
    /// The core's block with Nomad's default (`optional`); problems in Nomad's texts.
    pub fn to_config(&self, job_type: JobType, problems: &mut Vec<String>) -> ParameterizedJobConfig {
        let config = ParameterizedJobConfig {
            payload: if self.payload.is_empty() {
                DISPATCH_PAYLOAD_OPTIONAL.into()
            } else {
                self.payload.clone()
            },
            meta_required: self.meta_required.clone().unwrap_or_default(),
            meta_optional: self.meta_optional.clone().unwrap_or_default(),
        };
        if job_type != JobType::Batch {
            problems.push(format!(
                "Parameterized job can only be used with {:?} scheduler",
                JobType::Batch.as_str()
            ));
        }
        problems.extend(config.problems());
        config
    }

    pub fn from_config(config: &ParameterizedJobConfig) -> ApiParameterizedJobConfig {
        ApiParameterizedJobConfig {
            payload: config.payload.clone(),
            meta_required: Some(config.meta_required.clone()),
            meta_optional: Some(config.meta_optional.clone()),
        }
    }
}

/// Nomad's `api.DispatchPayloadConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiDispatchPayloadConfig {
    pub file: String,
}

impl ApiDispatchPayloadConfig {
    pub fn to_config(&self, task: &str, problems: &mut Vec<String>) -> DispatchPayloadConfig {
        if !payload_file_is_local(&self.file) {
            problems.push(format!(
                "Task {task:?}: Dispatch Payload validation failed: destination escapes allocation directory"
            ));
        }
        DispatchPayloadConfig {
            file: self.file.clone(),
        }
    }

    pub fn from_config(config: &DispatchPayloadConfig) -> ApiDispatchPayloadConfig {
        ApiDispatchPayloadConfig {
            file: config.file.clone(),
        }
    }
}

/// Go's `[]byte` in JSON: base64 text, `null` when empty.
pub mod bytes_base64 {
    use super::*;
    use base64::Engine as _;

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        if bytes.is_empty() {
            serializer.serialize_none()
        } else {
            serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        match text {
            None => Ok(Vec::new()),
            Some(text) => base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|error| serde::de::Error::custom(format!("payload is not base64: {error}"))),
        }
    }
}
