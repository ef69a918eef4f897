//! Gossip encryption (`server { encrypt = "<base64 key>" }`): every gossip packet sealed with
//! AES-GCM under the keyring's primary key, opened with whichever installed key fits, as Serf
//! does; keys installed, made primary and removed across the servers as `operator gossip
//! keyring` does, and kept in `<data_dir>/server/serf.keyring` so a restart keeps the rotated
//! ring rather than the config's first key.
//!
//! A packet no key opens is dropped, and its sender is told why in a short plaintext notice
//! (rate-limited), so a server with another key, or none, says why it cannot join instead of
//! timing out in silence. Notices are unauthenticated: they only ever produce a log line.
//!
//! Runs in both worlds: the nonces come from the runtime's generator (seeded in a simulation).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

/// Marks a sealed packet: magic, then the format version.
const SEALED: [u8; 2] = [0xd5, 0x01];
/// Marks a notice: magic, then 0.
const NOTICE: [u8; 2] = [0xd5, 0x00];
/// The keyring file, under `<data_dir>/server/` (Serf's name).
pub const KEYRING_FILE: &str = "serf.keyring";
/// A sender is told at most this often why its packets were dropped.
const NOTICE_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyringError {
    #[error("the gossip key is not valid base64: {0}")]
    NotBase64(String),
    #[error(
        "the gossip key is {0} bytes; it must be 16 or 32 (AES-128 or AES-256): make one with `agent operator gossip keyring generate`"
    )]
    Length(usize),
    #[error("the key is not installed")]
    NotInstalled,
    #[error("removing the primary key is not allowed: make another key primary first")]
    RemovePrimary,
    #[error("reading the keyring {path}: {reason}")]
    File { path: String, reason: String },
}

/// One installed key.
#[derive(Clone)]
struct Key {
    text: String,
    cipher: std::sync::Arc<LessSafeKey>,
}

impl Key {
    fn parse(text: &str) -> Result<Key, KeyringError> {
        let text = text.trim();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|error| KeyringError::NotBase64(error.to_string()))?;
        let algorithm = match bytes.len() {
            16 => &AES_128_GCM,
            32 => &AES_256_GCM,
            other => return Err(KeyringError::Length(other)),
        };
        let unbound = UnboundKey::new(algorithm, &bytes).map_err(|_| KeyringError::Length(bytes.len()))?;
        Ok(Key {
            text: base64::engine::general_purpose::STANDARD.encode(&bytes),
            cipher: std::sync::Arc::new(LessSafeKey::new(unbound)),
        })
    }
}

/// Checks a key's text: base64 of 16 or 32 bytes.
pub fn check_key(text: &str) -> Result<(), KeyringError> {
    Key::parse(text).map(|_| ())
}

/// A new random 32-byte key, base64 (`operator gossip keyring generate`).
pub fn generate_key() -> String {
    let bytes: [u8; 32] = crate::runtime::random();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One keyring operation (`operator gossip keyring -list|-install|-use|-remove`).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KeyringRequest {
    List,
    Install(String),
    Use(String),
    Remove(String),
}

impl std::fmt::Debug for KeyringRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are secrets: the operation is named, the key is not.
        f.write_str(match self {
            KeyringRequest::List => "List",
            KeyringRequest::Install(_) => "Install([REDACTED])",
            KeyringRequest::Use(_) => "Use([REDACTED])",
            KeyringRequest::Remove(_) => "Remove([REDACTED])",
        })
    }
}

/// What became of a received packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// A gossip packet for the membership machine.
    Packet(Vec<u8>),
    /// Dropped: `notice` (if any) is the answer to send back to the sender.
    Dropped { why: Refusal, notice: Option<Vec<u8>> },
    /// A peer's notice that it dropped ours, and why.
    Notice(Refusal),
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Sealed with a key this agent does not hold.
    WrongKey = 0,
    /// Not sealed, to an agent that requires it.
    Plaintext = 1,
    /// Sealed, to an agent that has no key.
    NoKey = 2,
}

impl Refusal {
    fn from_byte(byte: u8) -> Option<Refusal> {
        match byte {
            0 => Some(Refusal::WrongKey),
            1 => Some(Refusal::Plaintext),
            2 => Some(Refusal::NoKey),
            _ => None,
        }
    }

    /// What the sender of the refused packet is told, from its side.
    pub fn told(self, peer: SocketAddr) -> String {
        match self {
            Refusal::WrongKey => format!(
                "gossip peer {peer} cannot decrypt our packets: its gossip key differs from ours (server {{ encrypt }}, `agent operator gossip keyring -list`)"
            ),
            Refusal::Plaintext => format!(
                "gossip peer {peer} requires encrypted gossip: set server {{ encrypt }} to the cluster's gossip key"
            ),
            Refusal::NoKey => format!(
                "gossip peer {peer} has no gossip key and cannot read our encrypted packets: set its server {{ encrypt }}"
            ),
        }
    }

    /// What the receiver logs about the refused packet.
    pub fn seen(self, peer: SocketAddr) -> String {
        match self {
            Refusal::WrongKey => format!("dropped gossip from {peer}: no key in our keyring decrypts it"),
            Refusal::Plaintext => format!("dropped gossip from {peer}: it is not encrypted and this agent requires it"),
            Refusal::NoKey => format!("dropped gossip from {peer}: it is encrypted and this agent has no gossip key"),
        }
    }
}

/// The gossip keyring of one agent, primary key first; empty: gossip is plaintext.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Vec<Key>,
    /// Where changes are written (`None`: kept in memory, as in a simulation).
    file: Option<PathBuf>,
    /// When each sender was last sent a notice.
    noticed: BTreeMap<SocketAddr, tokio::time::Instant>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("keys", &self.keys.len())
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl Keyring {
    /// A ring of the one key `text` (a server's `encrypt`).
    pub fn with_key(text: &str) -> Result<Keyring, KeyringError> {
        Ok(Keyring {
            keys: vec![Key::parse(text)?],
            ..Keyring::default()
        })
    }

    /// The ring kept under `dir` if there is one (Serf keeps the rotated ring over the
    /// config's key, saying so when they differ), else one of `configured`, written there.
    /// Neither: no encryption.
    pub fn load(dir: &Path, configured: Option<&str>) -> Result<Keyring, KeyringError> {
        let path = dir.join(KEYRING_FILE);
        let file_error = |reason: String| KeyringError::File {
            path: path.display().to_string(),
            reason,
        };
        let mut ring = match std::fs::read_to_string(&path) {
            Ok(text) => {
                let texts: Vec<String> = serde_json::from_str(&text).map_err(|error| file_error(error.to_string()))?;
                let keys = texts
                    .iter()
                    .map(|text| Key::parse(text))
                    .collect::<Result<Vec<_>, _>>()?;
                if let Some(configured) = configured
                    && !keys
                        .iter()
                        .any(|key| Key::parse(configured).is_ok_and(|c| c.text == key.text))
                {
                    tracing::warn!(
                        path = %path.display(),
                        "server {{ encrypt }} names a key that is not in the keyring kept from earlier runs; using the kept keyring"
                    );
                }
                Keyring {
                    keys,
                    ..Keyring::default()
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => match configured {
                Some(text) => Keyring::with_key(text)?,
                None => Keyring::default(),
            },
            Err(error) => return Err(file_error(error.to_string())),
        };
        ring.file = Some(path);
        if !ring.keys.is_empty() {
            ring.save()?;
        }
        Ok(ring)
    }

    fn save(&self) -> Result<(), KeyringError> {
        let Some(path) = &self.file else { return Ok(()) };
        let error = |reason: String| KeyringError::File {
            path: path.display().to_string(),
            reason,
        };
        let texts: Vec<&str> = self.keys.iter().map(|key| key.text.as_str()).collect();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| error(e.to_string()))?;
        }
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, serde_json::to_vec(&texts).expect("keys serialize"))
            .map_err(|e| error(e.to_string()))?;
        restrict(&temporary).map_err(|e| error(e.to_string()))?;
        std::fs::rename(&temporary, path).map_err(|e| error(e.to_string()))
    }

    /// Whether gossip is encrypted.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The installed keys, primary first.
    pub fn list(&self) -> Vec<String> {
        self.keys.iter().map(|key| key.text.clone()).collect()
    }

    /// Adds a key (not yet used to seal); installing an installed key is a no-op.
    pub fn install(&mut self, text: &str) -> Result<(), KeyringError> {
        let key = Key::parse(text)?;
        if !self.keys.iter().any(|k| k.text == key.text) {
            self.keys.push(key);
            self.save()?;
        }
        Ok(())
    }

    /// Seals with an installed key from now on.
    pub fn use_key(&mut self, text: &str) -> Result<(), KeyringError> {
        let wanted = Key::parse(text)?.text;
        let at = self
            .keys
            .iter()
            .position(|k| k.text == wanted)
            .ok_or(KeyringError::NotInstalled)?;
        let key = self.keys.remove(at);
        self.keys.insert(0, key);
        self.save()
    }

    /// Removes a key that is not the primary.
    pub fn remove(&mut self, text: &str) -> Result<(), KeyringError> {
        let wanted = Key::parse(text)?.text;
        let at = self
            .keys
            .iter()
            .position(|k| k.text == wanted)
            .ok_or(KeyringError::NotInstalled)?;
        if at == 0 {
            return Err(KeyringError::RemovePrimary);
        }
        self.keys.remove(at);
        self.save()
    }

    /// Applies `request`: the keys installed afterwards, primary first, or why not.
    pub fn apply(&mut self, request: &KeyringRequest) -> Result<Vec<String>, KeyringError> {
        match request {
            KeyringRequest::List => {}
            KeyringRequest::Install(key) => self.install(key)?,
            KeyringRequest::Use(key) => self.use_key(key)?,
            KeyringRequest::Remove(key) => self.remove(key)?,
        }
        Ok(self.list())
    }

    /// `packet` as it goes on the wire: sealed under the primary key, or as it is.
    pub fn seal(&self, packet: &[u8]) -> Vec<u8> {
        let Some(key) = self.keys.first() else {
            return packet.to_vec();
        };
        let nonce: [u8; NONCE_LEN] = crate::runtime::random();
        let mut sealed = Vec::with_capacity(SEALED.len() + NONCE_LEN + packet.len() + 16);
        sealed.extend_from_slice(&SEALED);
        sealed.extend_from_slice(&nonce);
        let mut body = packet.to_vec();
        key.cipher
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(SEALED), &mut body)
            .expect("a gossip packet is far below AES-GCM's length limit");
        sealed.extend_from_slice(&body);
        sealed
    }

    /// What a received datagram is: a packet to act on, one to drop (and the notice to send),
    /// or a peer's notice.
    pub fn open(&mut self, data: &[u8], from: SocketAddr, now: tokio::time::Instant) -> Opened {
        if let Some(rest) = data.strip_prefix(&NOTICE) {
            return match rest.first().copied().and_then(Refusal::from_byte) {
                Some(why) => Opened::Notice(why),
                // Never answered: notices must not start an exchange.
                None => Opened::Dropped {
                    why: Refusal::WrongKey,
                    notice: None,
                },
            };
        }
        let sealed = data.strip_prefix(&SEALED);
        match (self.keys.is_empty(), sealed) {
            (true, None) => Opened::Packet(data.to_vec()),
            (true, Some(_)) => self.dropped(Refusal::NoKey, from, now),
            (false, None) => self.dropped(Refusal::Plaintext, from, now),
            (false, Some(sealed)) => match self.unseal(sealed) {
                Some(packet) => Opened::Packet(packet),
                None => self.dropped(Refusal::WrongKey, from, now),
            },
        }
    }

    fn unseal(&self, sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN + 16 {
            return None;
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().ok()?;
        self.keys.iter().find_map(|key| {
            let mut body = body.to_vec();
            let opened = key
                .cipher
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(SEALED), &mut body)
                .ok()?;
            Some(opened.to_vec())
        })
    }

    fn dropped(&mut self, why: Refusal, from: SocketAddr, now: tokio::time::Instant) -> Opened {
        let due = self
            .noticed
            .get(&from)
            .is_none_or(|last| now.saturating_duration_since(*last) >= NOTICE_EVERY);
        let notice = due.then(|| {
            self.noticed.insert(from, now);
            // Bounded: a flood of spoofed senders forgets the oldest rather than growing.
            if self.noticed.len() > 1024
                && let Some(oldest) = self.noticed.iter().min_by_key(|(_, at)| **at).map(|(addr, _)| *addr)
            {
                self.noticed.remove(&oldest);
            }
            let mut notice = NOTICE.to_vec();
            notice.push(why as u8);
            notice
        });
        Opened::Dropped { why, notice }
    }
}

#[cfg(unix)]
fn restrict(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(not(unix))]
fn restrict(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "HS5lJ+XuTlYKWaeGYyG+/A==";
    const KEY_B: &str = "8lS1oyLqaQtjcGsi7XTnSk+0dsg6qDz7wE3SKkK3zYk=";

    fn addr() -> SocketAddr {
        "10.0.0.1:4648".parse().unwrap()
    }

    #[tokio::test]
    async fn a_packet_sealed_under_one_key_opens_only_with_it() {
        let now = tokio::time::Instant::now();
        let mut a = Keyring::with_key(KEY_A).unwrap();
        let mut b = Keyring::with_key(KEY_B).unwrap();
        let sealed = a.seal(b"ping");
        assert_ne!(&sealed[SEALED.len() + NONCE_LEN..], b"ping");
        assert_eq!(a.open(&sealed, addr(), now), Opened::Packet(b"ping".to_vec()));
        let Opened::Dropped { why, notice } = b.open(&sealed, addr(), now) else {
            panic!("opened with another key")
        };
        assert_eq!(why, Refusal::WrongKey);
        // The notice reaches the sender as the reason; a second within 10 s is not sent.
        assert_eq!(a.open(&notice.unwrap(), addr(), now), Opened::Notice(Refusal::WrongKey));
        assert!(matches!(
            b.open(&sealed, addr(), now),
            Opened::Dropped { notice: None, .. }
        ));

        // A flipped bit is refused, not misread.
        let mut tampered = a.seal(b"ping");
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(matches!(
            a.open(&tampered, addr(), now),
            Opened::Dropped {
                why: Refusal::WrongKey,
                ..
            }
        ));

        let mut plain = Keyring::default();
        assert!(matches!(
            plain.open(&sealed, addr(), now),
            Opened::Dropped {
                why: Refusal::NoKey,
                ..
            }
        ));
        assert!(matches!(
            a.open(b"ping", addr(), now),
            Opened::Dropped {
                why: Refusal::Plaintext,
                ..
            }
        ));
        assert_eq!(plain.open(b"ping", addr(), now), Opened::Packet(b"ping".to_vec()));
    }

    #[tokio::test]
    async fn rotation_installs_uses_then_removes_and_survives_a_restart() {
        let now = tokio::time::Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let mut ring = Keyring::load(dir.path(), Some(KEY_A)).unwrap();
        let old = ring.seal(b"old");
        ring.install(KEY_B).unwrap();
        ring.use_key(KEY_B).unwrap();
        assert_eq!(ring.list(), vec![KEY_B.to_string(), KEY_A.to_string()]);
        // Packets sealed under the old key still open while it is installed.
        assert_eq!(ring.open(&old, addr(), now), Opened::Packet(b"old".to_vec()));
        assert_eq!(ring.remove(KEY_B), Err(KeyringError::RemovePrimary));
        ring.remove(KEY_A).unwrap();
        assert!(matches!(ring.open(&old, addr(), now), Opened::Dropped { .. }));

        // The kept ring wins over the config's key on the next start.
        let reloaded = Keyring::load(dir.path(), Some(KEY_A)).unwrap();
        assert_eq!(reloaded.list(), vec![KEY_B.to_string()]);
        let mode = std::fs::metadata(dir.path().join(KEYRING_FILE)).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    }

    #[test]
    fn bad_keys_are_refused_by_what_is_wrong() {
        assert!(matches!(check_key("not base64!"), Err(KeyringError::NotBase64(_))));
        assert_eq!(check_key("AAAA"), Err(KeyringError::Length(3)));
        let k24 = base64::engine::general_purpose::STANDARD.encode([7u8; 24]);
        assert_eq!(check_key(&k24), Err(KeyringError::Length(24)));
        check_key(&generate_key()).unwrap();
    }
}
