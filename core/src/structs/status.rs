//! Statuses that travel as strings (Nomad's wire and state shapes) but are decided on as
//! enums. [`wire_enum!`] gives each its variants' texts: `as_str`, `Display`, and serde as a
//! plain string both ways, so JSON, the CBOR state format and the legacy postcard records read
//! and write exactly the bytes the `String` fields they replace did. An unknown text is
//! refused by name when decoded.

use core::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
        $(empty = $empty:ident)?
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The text Nomad writes for it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// The variant whose text this is. Records written before the field was an enum
            /// may hold an empty text, read as the variant named by `empty =`, if any.
            pub fn parse(text: &str) -> Option<$name> {
                match text {
                    $($text => Some($name::$variant),)+
                    "" => None $(.or(Some($name::$empty)))?,
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Text;
                impl Visitor<'_> for Text {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(concat!("one of ", $("`", $text, "` "),+))
                    }
                    fn visit_str<E: de::Error>(self, text: &str) -> Result<$name, E> {
                        $name::parse(text).ok_or_else(|| E::unknown_variant(text, &[$($text),+]))
                    }
                }
                deserializer.deserialize_str(Text)
            }
        }
    };
}

wire_enum! {
    /// An evaluation's status (Nomad's `EvalStatus*`).
    #[derive(Default)]
    pub enum EvalStatus {
        #[default]
        Pending = "pending",
        Complete = "complete",
        Blocked = "blocked",
        Failed = "failed",
        Canceled = "canceled",
    }
    empty = Pending
}

wire_enum! {
    /// A deployment's status (Nomad's `DeploymentStatus*`).
    #[derive(Default)]
    pub enum DeploymentStatus {
        #[default]
        Running = "running",
        Paused = "paused",
        Failed = "failed",
        Successful = "successful",
        Cancelled = "cancelled",
    }
    empty = Running
}

impl DeploymentStatus {
    /// Running or paused: the deployment still decides what its job's allocations do.
    pub fn is_active(self) -> bool {
        matches!(self, DeploymentStatus::Running | DeploymentStatus::Paused)
    }
}

wire_enum! {
    /// Where a node's last drain stands (Nomad's `DrainStatus`).
    #[derive(Default)]
    pub enum DrainStatus {
        #[default]
        Draining = "draining",
        Complete = "complete",
        Canceled = "canceled",
    }
    empty = Draining
}

wire_enum! {
    /// Why an evaluation was made (Nomad's `EvalTrigger*`).
    #[derive(Default)]
    pub enum EvalTrigger {
        #[default]
        JobRegister = "job-register",
        JobDeregister = "job-deregister",
        JobScaling = "job-scaling",
        PeriodicJob = "periodic-job",
        NodeUpdate = "node-update",
        NodeDrain = "node-drain",
        AllocStop = "alloc-stop",
        /// A failed allocation's reschedule delay passed, or a lost allocation's replacement
        /// waited for its client to stop it (Nomad's delayed reschedule).
        AllocFailure = "alloc-failure",
        QueuedAllocs = "queued-allocs",
        /// A system job's next rolling-update batch.
        RollingUpdate = "rolling-update",
        DeploymentWatcher = "deployment-watcher",
    }
    empty = JobRegister
}

/// An evaluation's `eval_type`: its job's [`JobType`](super::JobType), kept on the wire and
/// in stored records as the text the field held when it was a `String` (a job's own
/// `job_type` is written as an enum variant, which differs in the legacy postcard records).
pub mod job_type_text {
    use super::super::JobType;
    use super::*;

    pub fn serialize<S: Serializer>(kind: &JobType, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(kind.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<JobType, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = JobType;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("one of `service`, `batch`, `system`")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<JobType, E> {
                // Records from before the field was typed may hold an empty text.
                if text.is_empty() {
                    return Ok(JobType::default());
                }
                JobType::parse(text).ok_or_else(|| E::unknown_variant(text, &["service", "batch", "system"]))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::*;

    #[test]
    fn statuses_read_and_write_their_texts_in_every_format() {
        for status in EvalStatus::ALL {
            let json = serde_json::to_string(status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
            assert_eq!(serde_json::from_str::<EvalStatus>(&json).unwrap(), *status);
            // The legacy postcard records held these as strings: the same bytes.
            let text = postcard::to_allocvec(&status.as_str()).unwrap();
            assert_eq!(postcard::to_allocvec(status).unwrap(), text);
            assert_eq!(postcard::from_bytes::<EvalStatus>(&text).unwrap(), *status);
        }
        // A record from before the field was an enum may hold an empty text.
        assert_eq!(serde_json::from_str::<EvalStatus>("\"\"").unwrap(), EvalStatus::Pending);
        let error = serde_json::from_str::<DeploymentStatus>("\"exploded\"").unwrap_err();
        assert!(error.to_string().contains("unknown variant `exploded`"), "{error}");
    }
}
