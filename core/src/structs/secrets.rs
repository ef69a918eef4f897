//! Secret key/value maps (CSI volume secrets, variable items): never shown. `Debug` names the
//! keys only, so a secret cannot reach a log or an error text through a derived `Debug` of
//! anything holding it.
//!
//! A map is either plain or *sealed*: encrypted by the servers' root keyring (the driver's
//! `rootkeys`) before it is proposed, so the Raft log and the snapshots hold only ciphertext.
//! The core never opens one: it stores and hands on sealed maps as they are, and the server's
//! driver opens them where a plugin, a client or an API reader needs the values. A sealed map
//! keeps the stored shape of every map (one entry, under [`SEALED_KEY`], which no key a user
//! writes can equal: [`check_secret_keys`] refuses control characters), so state written before
//! sealing, and every serialisation format, read it unchanged.

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
        if let Some(sealed) = self.sealed() {
            return match sealed {
                Ok(sealed) => write!(f, "Sealed({}, {} bytes)", sealed.key_id, sealed.data.len()),
                Err(_) => f.write_str("Sealed(malformed)"),
            };
        }
        f.debug_map().entries(self.0.keys().map(|key| (key, REDACTED))).finish()
    }
}

/// The one key of a sealed map. Starts with a NUL, which [`check_secret_keys`] refuses in any
/// key a user writes.
pub const SEALED_KEY: &str = "\u{0}sealed";

/// A sealed map's contents: the root key that sealed it and what the cipher wrote (the
/// driver's format: nonce, ciphertext, tag).
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub data: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sealed({}, {} bytes)", self.key_id, self.data.len())
    }
}

impl Secrets {
    /// The sealed map holding `sealed`.
    pub fn from_sealed(sealed: &Sealed) -> Secrets {
        let mut text = String::with_capacity(sealed.key_id.len() + 1 + 2 * sealed.data.len());
        text.push_str(&sealed.key_id);
        text.push(':');
        for byte in &sealed.data {
            text.push(char::from(HEX[usize::from(byte >> 4)]));
            text.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        Secrets([(SEALED_KEY.to_string(), text)].into_iter().collect())
    }

    /// `None` for a plain map; else what it seals, or why its entry is not a sealed value.
    pub fn sealed(&self) -> Option<Result<Sealed, &'static str>> {
        let text = self.0.get(SEALED_KEY)?;
        if self.0.len() != 1 {
            return Some(Err("a sealed map holds nothing else"));
        }
        let Some((key_id, hex)) = text.split_once(':') else {
            return Some(Err("no key id"));
        };
        if hex.len() % 2 != 0 {
            return Some(Err("odd hex length"));
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let data: Option<Vec<u8>> = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
            .collect();
        Some(match data {
            Some(data) => Ok(Sealed {
                key_id: key_id.to_string(),
                data,
            }),
            None => Err("not hex"),
        })
    }

    pub fn is_sealed(&self) -> bool {
        self.0.contains_key(SEALED_KEY)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Refuses a key a user may not write into a secret map: empty, or holding a control character
/// (so none can pose as [`SEALED_KEY`]). `what` names the map in the error.
pub fn check_secret_keys<'a>(what: &str, keys: impl IntoIterator<Item = &'a String>) -> Result<(), String> {
    for key in keys {
        if key.is_empty() {
            return Err(format!("{what}: a key must not be empty"));
        }
        if key.chars().any(char::is_control) {
            return Err(format!("{what}: key {key:?} holds a control character"));
        }
    }
    Ok(())
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
    fn a_sealed_map_round_trips_and_shows_only_its_key_id() {
        let sealed = Sealed {
            key_id: "k1".into(),
            data: vec![0, 1, 0xab, 0xff],
        };
        let map = Secrets::from_sealed(&sealed);
        assert!(map.is_sealed());
        assert_eq!(map.sealed(), Some(Ok(sealed)));
        assert_eq!(format!("{map:?}"), "Sealed(k1, 4 bytes)");
        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(json, r#"{"\u0000sealed":"k1:0001abff"}"#);
        let back: Secrets = serde_json::from_str(&json).unwrap();
        assert_eq!(back, map);
        let plain: Secrets = [("k".to_string(), "v".to_string())].into_iter().collect();
        assert_eq!(plain.sealed(), None);
    }

    #[test]
    fn malformed_sealed_entries_are_named_not_opened() {
        let bad = |text: &str| Secrets([(SEALED_KEY.to_string(), text.to_string())].into_iter().collect());
        assert_eq!(bad("k1:0g").sealed(), Some(Err("not hex")));
        assert_eq!(bad("k1:012").sealed(), Some(Err("odd hex length")));
        assert_eq!(bad("nokey").sealed(), Some(Err("no key id")));
        let mut extra = bad("k1:00");
        extra.insert("other".into(), "v".into());
        assert_eq!(extra.sealed(), Some(Err("a sealed map holds nothing else")));
    }

    #[test]
    fn user_keys_cannot_pose_as_the_sealed_key() {
        let keys = [SEALED_KEY.to_string()];
        assert!(
            check_secret_keys("secrets", &keys)
                .unwrap_err()
                .contains("control character")
        );
        assert!(check_secret_keys("secrets", &[String::new()]).is_err());
        assert!(check_secret_keys("secrets", &["token".to_string()]).is_ok());
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
