//! Attribute indexes: which keys a value produces, and posting-list upkeep.
//!
//! Each configured (attribute, kind) pair is its own LMDB database named
//! `ix:<attr>:<kind>`; a key's entry IDs are kept there in chunks (see
//! [`crate::postings`]). Keys per kind:
//!
//! | kind   | key                                                              |
//! |--------|------------------------------------------------------------------|
//! | `eq`   | the compact equality-normalised value when it is at most 3      |
//! |        | bytes, else 4 bytes: its first 4 under uuidMatch, a hash of it   |
//! |        | otherwise (see [`eq_key`])                                       |
//! | `pres` | the single byte `0x00`                                           |
//! | `sub`  | every 3-byte gram of `^` + normalised value + `$`                |
//! | `approx` | the schema's approximate key of the value                     |
//! | `ord`  | the schema's ordering key (memcmp order = matching-rule order)   |
//!
//! Hashed, truncated keys and grams can only *widen* a candidate set; every
//! candidate is tested against the filter afterwards, so results stay
//! exact. Only a literal equality key (at most 3 bytes) lists exactly the
//! entries holding its value.

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

/// Compact equality values of at most this many bytes are their own key.
const LITERAL_MAX: usize = 3;
/// Bytes of an equality key made from a longer value.
pub const EQ_KEY_LEN: usize = 4;
/// SipHash keys of equality-key hashes. Fixed: the keys are part of the
/// store format (changing them means rebuilding every equality index).
const EQ_HASH_KEYS: (u64, u64) = (0x7061_6e64_6f2d_6571, 0x6b65_792d_6861_7368);

/// The equality index key of `compact` (a value's
/// `Schema::normalize_compact` form, of an attribute of type `at`).
///
/// A value of at most [`LITERAL_MAX`] bytes is its own key. A longer one
/// takes [`EQ_KEY_LEN`] bytes, as slapd's hashed keys do: under uuidMatch
/// the UUID's first bytes (uniformly spread, and a range of UUIDs stays a
/// range of keys, which `pando repl check`'s digest reads), otherwise a
/// 32-bit SipHash-1-3 of the value written in base 255 with each digit
/// plus one, so it holds no NUL byte to escape. A mail address then takes
/// 4 bytes of key instead of ~25; values sharing a key share its posting
/// list, which only widens candidate sets. Literal keys are at most 3
/// bytes and the others exactly 4, so none is taken for another.
pub fn eq_key(schema: &Schema, at: &AttributeType, mut compact: Vec<u8>) -> Vec<u8> {
    if compact.len() <= LITERAL_MAX {
        return compact;
    }
    if schema.equality_is_uuid(at) {
        compact.truncate(EQ_KEY_LEN);
        return compact;
    }
    hashed_key(&compact).to_vec()
}

/// The hashed form of an equality value (see [`eq_key`]).
fn hashed_key(value: &[u8]) -> [u8; EQ_KEY_LEN] {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(EQ_HASH_KEYS.0, EQ_HASH_KEYS.1);
    h.write(value);
    let mut n = h.finish() % 255u64.pow(EQ_KEY_LEN as u32);
    let mut out = [0u8; EQ_KEY_LEN];
    for b in out.iter_mut().rev() {
        *b = (n % 255) as u8 + 1;
        n /= 255;
    }
    out
}

/// Whether equality key `key` is a value itself, not a hash or prefix of
/// one: a lookup of it lists exactly the entries holding that value.
pub fn is_literal(key: &[u8]) -> bool {
    key.len() <= LITERAL_MAX
}

/// The equality key of a UUID (16 bytes) under uuidMatch: its first
/// bytes ([`eq_key`]), so the UUIDs from `from` to `to` have the keys from
/// `uuid_key(from)` to `uuid_key(to)` (and others may share them).
pub fn uuid_key(uuid: &[u8; 16]) -> &[u8] {
    &uuid[..EQ_KEY_LEN]
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
        IndexKind::Eq => schema
            .normalize_compact(at, value)
            .ok()
            .map(|n| eq_key(schema, at, n)),
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
                        out.insert(eq_key(schema, at, oc.oid.as_bytes().to_vec()));
                    }
                    return;
                }
            }
            if let Ok(n) = schema.normalize_compact(at, value) {
                out.insert(eq_key(schema, at, n));
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
        assert!(crate::postings::escaped_len(&cut(vec![0; 401])) <= MAX_KEY);
    }

    #[test]
    fn equality_keys_are_short_values_or_four_bytes() {
        let schema = Schema::standard();
        let at = |n: &str| schema.attribute(n).unwrap();
        let key = |n: &str, v: &str| assertion_key(&schema, at(n), IndexKind::Eq, v.as_bytes());
        // Up to three bytes: the normalised value itself, and exact.
        assert_eq!(key("st", " NC ").unwrap(), b"nc");
        assert!(is_literal(&key("st", "NC").unwrap()));
        // Longer: four bytes without NUL, the same for every form of the value.
        let mail = key("mail", "User.0@Example.COM").unwrap();
        assert_eq!(mail.len(), EQ_KEY_LEN);
        assert!(!is_literal(&mail) && !mail.contains(&0));
        assert_eq!(key("mail", "user.0@example.com").unwrap(), mail);
        // The hash is part of the store format: a change must be a format change.
        assert_eq!(mail, hashed_key(b"user.0@example.com"));
        assert_eq!(hashed_key(b"user.0@example.com"), [43, 231, 229, 26]);
        // Distinct values rarely share a key: a uniform 32-bit hash of a
        // million values gives about 116 pairs that do (this one: 106).
        let keys: BTreeSet<_> = (0..1_000_000)
            .map(|i| key("mail", &format!("user.{i}@example.com")).unwrap())
            .collect();
        assert!(
            1_000_000 - keys.len() < 200,
            "{} shared",
            1_000_000 - keys.len()
        );
        // The first two that do, and two uids that do (test_ldap3.py
        // searches them).
        assert_eq!(
            key("mail", "user.773@example.com"),
            key("mail", "user.13670@example.com")
        );
        assert_eq!(key("uid", "user.53498"), key("uid", "user.64960"));
        // A key written as a value (written with keys_for) is the one looked up.
        let mut written = BTreeSet::new();
        keys_for(
            &schema,
            at("mail"),
            IndexKind::Eq,
            b"USER.0@example.com",
            &mut written,
        );
        assert_eq!(written.into_iter().collect::<Vec<_>>(), vec![mail]);
    }

    #[test]
    fn uuid_keys_keep_the_order_of_uuids() {
        let schema = Schema::standard();
        let at = schema.attribute("entryUUID").unwrap();
        let key = |v: &str| assertion_key(&schema, at, IndexKind::Eq, v.as_bytes()).unwrap();
        let a = key("0123abcd-0000-4000-8000-000000000000");
        assert_eq!(a, [0x01, 0x23, 0xab, 0xcd]);
        assert_eq!(key("0123ABCD-ffff-4000-8000-000000000000"), a);
        assert!(a < key("0123abce-0000-4000-8000-000000000000"));
        let mut u = [0u8; 16];
        u[..4].copy_from_slice(&a);
        u[15] = 9;
        assert_eq!(uuid_key(&u), &a[..]);
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
