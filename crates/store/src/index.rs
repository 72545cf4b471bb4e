//! Attribute indexes: which keys a value produces, and posting-list upkeep.
//!
//! Each configured (attribute, kind) pair is its own LMDB database named
//! `ix:<attr>:<kind>`; a key's entry IDs are kept there in chunks (see
//! [`crate::postings`]). Keys per kind:
//!
//! | kind   | key                                                              |
//! |--------|------------------------------------------------------------------|
//! | `eq`   | equality-normalised value, compact (`Schema::normalize_compact`: |
//! |        | a UUID's 16 bytes), truncated (see `MAX_KEY`)                    |
//! | `pres` | the single byte `0x00`                                           |
//! | `sub`  | every 3-byte gram of `^` + normalised value + `$`                |
//! | `approx` | the schema's approximate key of the value                     |
//! | `ord`  | the schema's ordering key (memcmp order = matching-rule order)   |
//!
//! Truncated keys and grams can only *widen* a candidate set; every candidate
//! is tested against the filter afterwards, so results stay exact.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use pando_model::{AttributeType, Schema};

/// Longer keys are cut here (counting each NUL byte twice, as a posting
/// record's key escapes it): LMDB's key limit is 511 bytes, and a cut key
/// only merges postings of values sharing a long prefix.
pub const MAX_KEY: usize = 400;
/// Gram length for substring keys.
pub const GRAM: usize = 3;
pub const PRESENCE_KEY: &[u8] = &[0];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IndexKind {
    Eq,
    Pres,
    Sub,
    Approx,
    Ord,
}

impl IndexKind {
    pub const ALL: [IndexKind; 5] = [Self::Eq, Self::Pres, Self::Sub, Self::Approx, Self::Ord];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "eq",
            Self::Pres => "pres",
            Self::Sub => "sub",
            Self::Approx => "approx",
            Self::Ord => "ord",
        }
    }
}

impl fmt::Display for IndexKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IndexKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "eq" | "equality" => Self::Eq,
            "pres" | "presence" => Self::Pres,
            "sub" | "substr" | "substring" | "substrings" => Self::Sub,
            "approx" => Self::Approx,
            "ord" | "ordering" => Self::Ord,
            other => {
                return Err(format!(
                    "unknown index kind '{other}' (expected eq, pres, sub, approx or ord)"
                ))
            }
        })
    }
}

/// Database name of one index. Format 3 stores name them `ix:` (chunked
/// postings); format 2's `idx:` databases held one serialised list per key.
pub fn db_name(attr: &str, kind: IndexKind) -> String {
    format!("ix:{attr}:{kind}")
}

/// The prefix of `key` an index keeps: at most [`MAX_KEY`] bytes once its
/// NUL bytes are escaped. Cutting keeps the keys' order (never reverses
/// two), so ranges over cut keys only widen.
pub fn cut(mut key: Vec<u8>) -> Vec<u8> {
    let mut weight = 0;
    let keep = key
        .iter()
        .position(|&b| {
            weight += if b == 0 { 2 } else { 1 };
            weight > MAX_KEY
        })
        .unwrap_or(key.len());
    key.truncate(keep);
    key
}

/// Whether `key` is surely whole (lighter than any cut key, which weighs
/// `MAX_KEY - 1` or `MAX_KEY`): a lookup of it lists exactly the entries
/// holding that value.
pub fn is_whole(key: &[u8]) -> bool {
    crate::postings::escaped_len(key) + 1 < MAX_KEY
}

/// Grams of `^value$` (bytes). Values shorter than a gram still give one key.
pub fn grams(normalised: &[u8], out: &mut BTreeSet<Vec<u8>>) {
    let mut padded = Vec::with_capacity(normalised.len() + 2);
    padded.push(b'^');
    padded.extend_from_slice(normalised);
    padded.push(b'$');
    grams_of(&padded, out);
}

/// Grams fully inside `part` (no anchors added).
pub fn grams_of(part: &[u8], out: &mut BTreeSet<Vec<u8>>) {
    if part.len() < GRAM {
        return;
    }
    for w in part.windows(GRAM) {
        out.insert(w.to_vec());
    }
}

/// The key to look up for an assertion value (unlike [`keys_for`], an
/// object class assertion does not expand to superclasses). None when the
/// value is invalid for the syntax, so it can match nothing.
pub fn assertion_key(
    schema: &Schema,
    at: &AttributeType,
    kind: IndexKind,
    value: &[u8],
) -> Option<Vec<u8>> {
    match kind {
        IndexKind::Pres => Some(PRESENCE_KEY.to_vec()),
        IndexKind::Eq => schema.normalize_compact(at, value).ok().map(cut),
        IndexKind::Approx => Some(cut(schema.approx_key(at, value))),
        IndexKind::Ord => schema.ordering_key(at, value).map(cut),
        IndexKind::Sub => None,
    }
}

/// Every index key `value` of attribute `at` produces for `kind`.
/// Values the schema cannot normalise produce no key (they were rejected at
/// write time unless the syntax is lenient).
pub fn keys_for(
    schema: &Schema,
    at: &AttributeType,
    kind: IndexKind,
    value: &[u8],
    out: &mut BTreeSet<Vec<u8>>,
) {
    match kind {
        IndexKind::Pres => {
            out.insert(PRESENCE_KEY.to_vec());
        }
        IndexKind::Eq => {
            // (objectClass=person) matches entries of every subclass, so an
            // object class value also produces the keys of its superclasses.
            // A class's OID is its normalised form (objectIdentifierMatch),
            // the class named first among them.
            if at.has_name("objectClass") {
                let classes = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| schema.superclasses(v.trim()));
                if let Some(classes) = classes {
                    for oc in classes {
                        out.insert(cut(oc.oid.as_bytes().to_vec()));
                    }
                    return;
                }
            }
            if let Ok(n) = schema.normalize_compact(at, value) {
                out.insert(cut(n));
            }
        }
        IndexKind::Sub => {
            if let Ok(n) = schema.normalize(at, value) {
                grams(&n, out);
            }
        }
        IndexKind::Approx => {
            out.insert(cut(schema.approx_key(at, value)));
        }
        IndexKind::Ord => {
            if let Some(k) = schema.ordering_key(at, value) {
                out.insert(cut(k));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_counts_nul_bytes_twice() {
        assert_eq!(cut(vec![b'a'; 500]).len(), MAX_KEY);
        assert_eq!(cut(vec![0; 500]).len(), MAX_KEY / 2);
        let short = b"a\x00b".to_vec();
        assert_eq!(cut(short.clone()), short);
        assert!(is_whole(&short));
        assert!(!is_whole(&cut(vec![0; 500])));
        assert!(crate::postings::escaped_len(&cut(vec![0; 401])) <= MAX_KEY);
        let mut edge = vec![b'a'; MAX_KEY - 1];
        edge.extend_from_slice(&[0, b'b']);
        assert!(!is_whole(&cut(edge)));
    }

    #[test]
    fn grams_are_anchored() {
        let mut out = BTreeSet::new();
        grams(b"abcd", &mut out);
        let v: Vec<_> = out.into_iter().collect();
        assert_eq!(
            v,
            vec![
                b"^ab".to_vec(),
                b"abc".to_vec(),
                b"bcd".to_vec(),
                b"cd$".to_vec()
            ]
        );
        let mut short = BTreeSet::new();
        grams(b"a", &mut short);
        assert_eq!(short.into_iter().collect::<Vec<_>>(), vec![b"^a$".to_vec()]);
    }

    #[test]
    fn kinds_parse() {
        assert_eq!("equality".parse::<IndexKind>().unwrap(), IndexKind::Eq);
        assert!("bogus".parse::<IndexKind>().is_err());
    }
}
