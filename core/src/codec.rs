//! How state is written down when it must outlive the process: Raft snapshots (on disk and
//! sent to other servers) and the client's per-allocation records.
//!
//! A record is a header — [`MAGIC`] then one [`FORMAT_VERSION`] byte — and a CBOR body,
//! LZ4-compressed (block format, uncompressed length first; field names repeat in every
//! record, and LZ4 takes them back out at memory speed). CBOR
//! is self-describing (fields by name), so a field added later with `#[serde(default)]` still
//! reads a record written before it existed, and an older agent skips fields it does not know:
//! an upgrade, or a mixed-version cluster during a rolling upgrade, keeps its data, as Nomad's
//! msgpack state does. `core/tests/it/state_format.rs` holds a record written by an earlier build
//! that every later build must still read.
//!
//! Records without the header are the positional postcard encoding written before the format
//! was versioned. They are read only while the shapes are those of that time (postcard has no
//! field names, so the first added field ends it); the agent rewrites every such record in the
//! versioned format when it opens a data dir, so one start of a build of this generation
//! upgrades it for good. A record from a newer format is refused with a message saying so,
//! never misread.

use crate::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// First bytes of every versioned record. A postcard record of ours could only begin with them
/// if its first field were a string exactly 8,831 bytes long starting with "RV".
pub const MAGIC: [u8; 4] = [0xff, b'D', b'R', b'V'];

/// The state format this build writes; it reads this one and every earlier one.
pub const FORMAT_VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "written by a newer Drover (state format v{found}; this build reads up to v{FORMAT_VERSION}): \
         run the newer build, or restore from a backup"
    )]
    Newer { found: u8 },
    #[error("state format v{version} record cannot be read: {reason}")]
    Corrupt { version: u8, reason: String },
    #[error(
        "not a Drover state record (no format header, and not the unversioned form of before state \
         format v1: {reason}); data dirs from before v1 are upgraded by one start of a build that \
         reads them"
    )]
    Unrecognized { reason: String },
}

/// `value` as a versioned record.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut cbor = Vec::with_capacity(256);
    ciborium::into_writer(value, &mut cbor).expect("state serializes into memory");
    let compressed = lz4_flex::compress_prepend_size(&cbor);
    let mut out = Vec::with_capacity(MAGIC.len() + 1 + compressed.len());
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&compressed);
    out
}

/// LZ4 expands at most 255-fold, so a larger length prefix is corruption, refused before
/// anything is allocated for it.
fn decompress(body: &[u8]) -> Result<Vec<u8>, String> {
    let [a, b, c, d, rest @ ..] = body else {
        return Err("truncated before the length".into());
    };
    let length = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
    if length > rest.len().saturating_mul(255).max(16) {
        return Err(format!(
            "length {length} impossible for {} compressed bytes",
            rest.len()
        ));
    }
    lz4_flex::decompress_size_prepended(body).map_err(|error| format!("{error}"))
}

/// Reads a record written by [`encode`] of this or an earlier format, or the unversioned
/// postcard form that came before.
pub fn decode<T: DeserializeOwned>(data: &[u8]) -> Result<T, DecodeError> {
    match data.strip_prefix(&MAGIC) {
        Some([version, body @ ..]) => match *version {
            1 => {
                let corrupt = |reason: String| DecodeError::Corrupt { version: 1, reason };
                let cbor = decompress(body).map_err(corrupt)?;
                ciborium::from_reader(cbor.as_slice()).map_err(|error| corrupt(format!("{error}")))
            }
            found if found > FORMAT_VERSION => Err(DecodeError::Newer { found }),
            found => Err(DecodeError::Corrupt {
                version: found,
                reason: "unknown format version".into(),
            }),
        },
        Some([]) => Err(DecodeError::Corrupt {
            version: 0,
            reason: "header without a version byte".into(),
        }),
        None => postcard::from_bytes(data).map_err(|error| DecodeError::Unrecognized {
            reason: format!("{error}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Before {
        name: String,
        by_pair: BTreeMap<(String, u64), u32>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct After {
        name: String,
        by_pair: BTreeMap<(String, u64), u32>,
        #[serde(default)]
        added: Vec<String>,
    }

    fn before() -> Before {
        Before {
            name: "web".into(),
            by_pair: BTreeMap::from([(("a".into(), 2), 7)]),
        }
    }

    #[test]
    fn round_trips_with_tuple_keys() {
        let bytes = encode(&before());
        assert_eq!(&bytes[..5], &[0xff, b'D', b'R', b'V', FORMAT_VERSION]);
        assert_eq!(decode::<Before>(&bytes).unwrap(), before());
    }

    #[test]
    fn a_field_added_later_reads_old_records_and_old_readers_skip_it() {
        let old = encode(&before());
        let upgraded: After = decode(&old).unwrap();
        assert_eq!(upgraded.added, Vec::<String>::new());
        assert_eq!(upgraded.name, "web");
        let new = encode(&After {
            added: vec!["x".into()],
            ..upgraded
        });
        assert_eq!(decode::<Before>(&new).unwrap(), before());
    }

    #[test]
    fn the_unversioned_postcard_form_is_still_read() {
        let legacy = postcard::to_allocvec(&before()).unwrap();
        assert_eq!(decode::<Before>(&legacy).unwrap(), before());
    }

    #[test]
    fn a_newer_format_is_refused_by_name_not_misread() {
        let mut bytes = encode(&before());
        bytes[4] = FORMAT_VERSION + 1;
        let error = decode::<Before>(&bytes).unwrap_err();
        assert_eq!(error, DecodeError::Newer { found: 2 });
        assert!(error.to_string().contains("newer Drover (state format v2"), "{error}");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(matches!(
            decode::<Before>(b"\xff\xff"),
            Err(DecodeError::Unrecognized { .. })
        ));
        let mut huge = MAGIC.to_vec();
        huge.push(FORMAT_VERSION);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 8]);
        let error = decode::<Before>(&huge).unwrap_err();
        assert!(error.to_string().contains("impossible"), "{error}");
        let mut bytes = encode(&before());
        bytes.truncate(8);
        assert!(matches!(
            decode::<Before>(&bytes),
            Err(DecodeError::Corrupt { version: 1, .. })
        ));
    }
}
