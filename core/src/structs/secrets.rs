//! Secret key/value maps (CSI volume secrets): stored, replicated and sent to plugins as a plain
//! map, never shown. `Debug` names the keys only, so a secret cannot reach a log or an error
//! text through a derived `Debug` of anything holding it.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use core::fmt;
use core::ops::{Deref, DerefMut};

use serde::{Deserialize, Serialize};

/// What `Debug` shows instead of a value (Nomad's text where it redacts).
pub const REDACTED: &str = "[REDACTED]";

/// A secret map: serialised as the plain map it wraps (the state format is unchanged).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secrets(pub BTreeMap<String, String>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.keys().map(|key| (key, REDACTED))).finish()
    }
}

impl Deref for Secrets {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Secrets {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl From<BTreeMap<String, String>> for Secrets {
    fn from(map: BTreeMap<String, String>) -> Self {
        Secrets(map)
    }
}

impl<const N: usize> From<[(String, String); N]> for Secrets {
    fn from(pairs: [(String, String); N]) -> Self {
        Secrets(pairs.into_iter().collect())
    }
}

impl FromIterator<(String, String)> for Secrets {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Secrets(iter.into_iter().collect())
    }
}

impl IntoIterator for Secrets {
    type Item = (String, String);
    type IntoIter = alloc::collections::btree_map::IntoIter<String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_keys_never_values() {
        let secrets: Secrets = [("token".to_string(), "s3cr3t".to_string())].into_iter().collect();
        let shown = format!("{secrets:?}");
        assert_eq!(shown, r#"{"token": "[REDACTED]"}"#);
        let volume = crate::structs::CsiVolume {
            secrets,
            ..Default::default()
        };
        assert!(!format!("{volume:?}").contains("s3cr3t"));
        assert!(!format!("{volume:#?}").contains("s3cr3t"));
    }

    #[test]
    fn serialised_as_the_plain_map() {
        let secrets: Secrets = [("k".to_string(), "v".to_string())].into_iter().collect();
        assert_eq!(serde_json::to_string(&secrets).unwrap(), r#"{"k":"v"}"#);
    }
}

/// One secret string (a gossip key): serialised as the plain string, `Debug` redacted.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretText(pub String);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl SecretText {
    pub fn expose(&self) -> &str {
        &self.0
    }
}
