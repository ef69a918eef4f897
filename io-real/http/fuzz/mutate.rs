//! Inputs for the fuzz targets: a seed from the corpus (or one the encoders made fresh) with a
//! short list of mutations applied, drawn by proptest so a failing input shrinks to the fewest
//! mutations of the simplest seed that still fails.
//!
//! Byte mutations reach the parsers' error paths; structure-aware mutations of JSON seeds (a
//! value replaced by an extreme number, a key removed, an array repeated) keep the input valid
//! JSON so it reaches the validation and conversion behind the parser.

use proptest::prelude::*;
use serde_json::Value;

/// Inputs are cut to this size: large enough for any jobspec or record we keep, small enough
/// that a case that allocates gigabytes does so because of what the input says, not its size.
pub const INPUT_MAX: usize = 64 * 1024;

/// One input: which of the target's variants reads it (a request kind, a record type) and the
/// bytes.
#[derive(Clone, Debug)]
pub struct Case {
    pub variant: usize,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug)]
pub enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        byte: u8,
    },
    Insert {
        at: usize,
        token: usize,
    },
    Replace {
        at: usize,
        len: usize,
        token: usize,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Repeat {
        at: usize,
        len: usize,
        times: u8,
    },
    Truncate {
        at: usize,
    },
    Splice {
        at: usize,
        other: usize,
        from: usize,
    },
    /// Another variant reads the same bytes (a job body sent to the volume endpoint).
    Variant {
        variant: usize,
    },
    Json {
        node: usize,
        op: JsonOp,
    },
}

#[derive(Clone, Debug)]
pub enum JsonOp {
    Number(usize),
    Text(usize),
    Null,
    Bool(bool),
    EmptyArray,
    EmptyObject,
    RemoveKey(usize),
    AddKey(usize),
    RepeatItems(u16),
    Wrap,
}

/// Numbers that break arithmetic, limits and conversions.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "255",
    "256",
    "65535",
    "65536",
    "1000000",
    "1000000000",
    "2147483647",
    "-2147483648",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e9",
    "1e308",
    "-1e308",
    "0.5",
    "-0.0",
];

/// Text fragments every target's dictionary starts with; the seeds add their own words.
const TOKENS: &[&str] = &[
    "{", "}", "[", "]", "\"", "=", ":", ",", "\n", "${", "%{", "\\", "\\u0000", "..", "/", "-", " ", "#", "//", "/*",
    "<<EOF\n", "\nEOF\n", "null", "true", "false", "\u{202e}", "\u{feff}", "é", "\0", "\u{7f}",
];

/// A target's seeds and the words mutations insert.
pub struct Pool {
    pub seeds: Vec<Case>,
    pub tokens: Vec<String>,
    pub variants: usize,
}

impl Pool {
    pub fn new(seeds: Vec<Case>, variants: usize) -> Pool {
        let mut words = std::collections::BTreeSet::new();
        for seed in &seeds {
            let text = String::from_utf8_lossy(&seed.bytes);
            for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')) {
                if (2..=40).contains(&word.len()) {
                    words.insert(word.to_string());
                }
            }
        }
        let mut tokens: Vec<String> = TOKENS.iter().map(|token| token.to_string()).collect();
        tokens.extend(NUMBERS.iter().map(|number| number.to_string()));
        tokens.extend(words.into_iter().take(2000));
        Pool {
            seeds,
            tokens,
            variants,
        }
    }
}

fn mutation(variants: usize) -> impl Strategy<Value = Mutation> {
    let position = any::<usize>();
    let token = any::<usize>();
    prop_oneof![
        1 => (position, 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        1 => (position, any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte { at, byte }),
        1 => (position, token).prop_map(|(at, token)| Mutation::Insert { at, token }),
        1 => (position, 1usize..16, token).prop_map(|(at, len, token)| Mutation::Replace { at, len, token }),
        1 => (position, 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        1 => (position, 1usize..64, 2u8..64).prop_map(|(at, len, times)| Mutation::Repeat { at, len, times }),
        1 => position.prop_map(|at| Mutation::Truncate { at }),
        1 => (position, any::<usize>(), any::<usize>()).prop_map(|(at, other, from)| Mutation::Splice { at, other, from }),
        1 => (0..variants.max(1)).prop_map(|variant| Mutation::Variant { variant }),
        3 => (any::<usize>(), json_op()).prop_map(|(node, op)| Mutation::Json { node, op }),
    ]
}

fn json_op() -> impl Strategy<Value = JsonOp> {
    prop_oneof![
        3 => any::<usize>().prop_map(JsonOp::Number),
        2 => any::<usize>().prop_map(JsonOp::Text),
        1 => Just(JsonOp::Null),
        1 => any::<bool>().prop_map(JsonOp::Bool),
        1 => Just(JsonOp::EmptyArray),
        1 => Just(JsonOp::EmptyObject),
        1 => any::<usize>().prop_map(JsonOp::RemoveKey),
        1 => any::<usize>().prop_map(JsonOp::AddKey),
        1 => (2u16..2000).prop_map(JsonOp::RepeatItems),
        1 => Just(JsonOp::Wrap),
    ]
}

/// Cases: a seed, mutated 0 to 8 times.
pub fn cases(pool: std::sync::Arc<Pool>) -> impl Strategy<Value = Case> {
    let seeds = pool.seeds.len();
    let variants = pool.variants;
    (0..seeds, proptest::collection::vec(mutation(variants), 0..8))
        .prop_map(move |(seed, mutations)| apply(&pool, seed, &mutations))
}

fn apply(pool: &Pool, seed: usize, mutations: &[Mutation]) -> Case {
    let mut case = pool.seeds[seed].clone();
    for mutation in mutations {
        mutate(pool, &mut case, mutation);
        case.bytes.truncate(INPUT_MAX);
    }
    case
}

fn mutate(pool: &Pool, case: &mut Case, mutation: &Mutation) {
    let bytes = &mut case.bytes;
    let at = |at: usize, len: usize| at % (len + 1);
    let token = |index: usize| pool.tokens[index % pool.tokens.len()].as_bytes();
    match *mutation {
        Mutation::Flip { at: i, bit } if !bytes.is_empty() => {
            let i = i % bytes.len();
            bytes[i] ^= 1 << bit;
        }
        Mutation::SetByte { at: i, byte } if !bytes.is_empty() => {
            let i = i % bytes.len();
            bytes[i] = byte;
        }
        Mutation::Flip { .. } | Mutation::SetByte { .. } => {}
        Mutation::Insert { at: i, token: t } => {
            let i = at(i, bytes.len());
            bytes.splice(i..i, token(t).iter().copied());
        }
        Mutation::Replace { at: i, len, token: t } => {
            let i = at(i, bytes.len());
            let end = (i + len).min(bytes.len());
            bytes.splice(i..end, token(t).iter().copied());
        }
        Mutation::Delete { at: i, len } => {
            let i = at(i, bytes.len());
            let end = (i + len).min(bytes.len());
            bytes.drain(i..end);
        }
        Mutation::Repeat { at: i, len, times } => {
            let i = at(i, bytes.len());
            let end = (i + len).min(bytes.len());
            let chunk = bytes[i..end].to_vec();
            for _ in 1..times {
                bytes.splice(end..end, chunk.iter().copied());
            }
        }
        Mutation::Truncate { at: i } => {
            let i = at(i, bytes.len());
            bytes.truncate(i);
        }
        Mutation::Splice { at: i, other, from } => {
            let other = &pool.seeds[other % pool.seeds.len()].bytes;
            let i = at(i, bytes.len());
            let from = at(from, other.len());
            bytes.truncate(i);
            bytes.extend_from_slice(&other[from..]);
        }
        Mutation::Variant { variant } => case.variant = variant % pool.variants.max(1),
        Mutation::Json { node, ref op } => {
            let Ok(mut value) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            let count = count_nodes(&value);
            let mut target = node % count;
            mutate_json(&mut value, &mut target, op, pool);
            *bytes = serde_json::to_vec(&value).expect("a JSON value serializes");
        }
    }
}

fn count_nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Applies `op` to the `target`th node in preorder; true once applied.
fn mutate_json(value: &mut Value, target: &mut usize, op: &JsonOp, pool: &Pool) -> bool {
    if *target == 0 {
        *value = match op {
            JsonOp::Number(index) => {
                let text = NUMBERS[index % NUMBERS.len()];
                serde_json::from_str(text).unwrap_or(Value::Null)
            }
            JsonOp::Text(index) => Value::String(pool.tokens[index % pool.tokens.len()].clone()),
            JsonOp::Null => Value::Null,
            JsonOp::Bool(flag) => Value::Bool(*flag),
            JsonOp::EmptyArray => Value::Array(Vec::new()),
            JsonOp::EmptyObject => Value::Object(serde_json::Map::new()),
            JsonOp::RemoveKey(index) => {
                let mut value = value.take();
                if let Value::Object(map) = &mut value
                    && !map.is_empty()
                {
                    let key = map.keys().nth(index % map.len()).cloned().expect("in range");
                    map.remove(&key);
                }
                value
            }
            JsonOp::AddKey(index) => {
                let mut value = value.take();
                if let Value::Object(map) = &mut value {
                    let key = pool.tokens[index % pool.tokens.len()].clone();
                    map.insert(key, Value::from(1));
                }
                value
            }
            JsonOp::RepeatItems(times) => {
                let mut value = value.take();
                if let Value::Array(items) = &mut value
                    && let Some(first) = items.first().cloned()
                {
                    items.extend(std::iter::repeat_n(first, usize::from(*times)));
                }
                value
            }
            JsonOp::Wrap => Value::Array(vec![value.take()]),
        };
        return true;
    }
    *target -= 1;
    match value {
        Value::Array(items) => items.iter_mut().any(|item| mutate_json(item, target, op, pool)),
        Value::Object(map) => map.values_mut().any(|item| mutate_json(item, target, op, pool)),
        _ => false,
    }
}
