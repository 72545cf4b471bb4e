//! Matching rules (RFC 4517 section 4.2 plus a few from other RFCs), built
//! in code. Every rule maps a value to a byte string so that matching is a
//! byte comparison:
//! - equality rules: `Schema::normalize_with` gives a canonical form; two
//!   values match iff their forms are equal;
//! - ordering rules: `Schema::ordering_key_with` gives a key whose memcmp
//!   order is the rule's order;
//! - substrings rules: the value is normalised like its equality
//!   counterpart and the assertion parts like `Spaces::Substring`.

use crate::prep::{prepare_bytes, prepare_ia5, Spaces};
use crate::schema::Schema;
use crate::syntax::{self, parse_generalized_time, parse_integer, split_name_and_uid, P};

/// What a rule computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    CaseIgnore,
    CaseExact,
    CaseIgnoreIa5,
    CaseExactIa5,
    Numeric,
    Telephone,
    CaseIgnoreList,
    Dn,
    UniqueMember,
    Octet,
    Integer,
    GeneralizedTime,
    Boolean,
    Oid,
    OidFirstComponent,
    IntegerFirstComponent,
    BitString,
    Uuid,
    Csn,
    BitAnd,
    BitOr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Equality,
    Ordering,
    Substrings,
    /// Only usable in extensible match (the bitwise rules).
    Extensible,
}

#[derive(Debug)]
pub(crate) struct MatchingRule {
    pub oid: &'static str,
    pub name: &'static str,
    /// Assertion syntax OID.
    pub syntax: &'static str,
    pub kind: Kind,
    pub algo: Algo,
}

macro_rules! mr {
    ($oid:expr, $name:literal, $syn:expr, $kind:ident, $algo:ident) => {
        MatchingRule {
            oid: $oid,
            name: $name,
            syntax: $syn,
            kind: Kind::$kind,
            algo: Algo::$algo,
        }
    };
}

const S_DIR: &str = "1.3.6.1.4.1.1466.115.121.1.15";
const S_IA5: &str = "1.3.6.1.4.1.1466.115.121.1.26";
const S_SUB: &str = "1.3.6.1.4.1.1466.115.121.1.58";
const S_NUM: &str = "1.3.6.1.4.1.1466.115.121.1.36";
const S_INT: &str = "1.3.6.1.4.1.1466.115.121.1.27";
const S_OID: &str = "1.3.6.1.4.1.1466.115.121.1.38";
const S_DN: &str = "1.3.6.1.4.1.1466.115.121.1.12";
const S_OCT: &str = "1.3.6.1.4.1.1466.115.121.1.40";
const S_TIME: &str = "1.3.6.1.4.1.1466.115.121.1.24";
const S_TEL: &str = "1.3.6.1.4.1.1466.115.121.1.50";
const S_UUID: &str = "1.3.6.1.1.16.1";
const S_CSN: &str = "1.3.6.1.4.1.4203.666.11.2.1";
const S_AUTHZ: &str = "1.3.6.1.4.1.4203.666.2.7";

pub(crate) const MATCHING_RULES: &[MatchingRule] = &[
    mr!("2.5.13.0", "objectIdentifierMatch", S_OID, Equality, Oid),
    mr!("2.5.13.1", "distinguishedNameMatch", S_DN, Equality, Dn),
    mr!("2.5.13.2", "caseIgnoreMatch", S_DIR, Equality, CaseIgnore),
    mr!(
        "2.5.13.3",
        "caseIgnoreOrderingMatch",
        S_DIR,
        Ordering,
        CaseIgnore
    ),
    mr!(
        "2.5.13.4",
        "caseIgnoreSubstringsMatch",
        S_SUB,
        Substrings,
        CaseIgnore
    ),
    mr!("2.5.13.5", "caseExactMatch", S_DIR, Equality, CaseExact),
    mr!(
        "2.5.13.6",
        "caseExactOrderingMatch",
        S_DIR,
        Ordering,
        CaseExact
    ),
    mr!(
        "2.5.13.7",
        "caseExactSubstringsMatch",
        S_SUB,
        Substrings,
        CaseExact
    ),
    mr!("2.5.13.8", "numericStringMatch", S_NUM, Equality, Numeric),
    mr!(
        "2.5.13.9",
        "numericStringOrderingMatch",
        S_NUM,
        Ordering,
        Numeric
    ),
    mr!(
        "2.5.13.10",
        "numericStringSubstringsMatch",
        S_SUB,
        Substrings,
        Numeric
    ),
    mr!(
        "2.5.13.11",
        "caseIgnoreListMatch",
        "1.3.6.1.4.1.1466.115.121.1.41",
        Equality,
        CaseIgnoreList
    ),
    mr!(
        "2.5.13.12",
        "caseIgnoreListSubstringsMatch",
        S_SUB,
        Substrings,
        CaseIgnoreList
    ),
    mr!(
        "2.5.13.13",
        "booleanMatch",
        "1.3.6.1.4.1.1466.115.121.1.7",
        Equality,
        Boolean
    ),
    mr!("2.5.13.14", "integerMatch", S_INT, Equality, Integer),
    mr!(
        "2.5.13.15",
        "integerOrderingMatch",
        S_INT,
        Ordering,
        Integer
    ),
    mr!(
        "2.5.13.16",
        "bitStringMatch",
        "1.3.6.1.4.1.1466.115.121.1.6",
        Equality,
        BitString
    ),
    mr!("2.5.13.17", "octetStringMatch", S_OCT, Equality, Octet),
    mr!(
        "2.5.13.18",
        "octetStringOrderingMatch",
        S_OCT,
        Ordering,
        Octet
    ),
    mr!(
        "2.5.13.20",
        "telephoneNumberMatch",
        S_TEL,
        Equality,
        Telephone
    ),
    mr!(
        "2.5.13.21",
        "telephoneNumberSubstringsMatch",
        S_SUB,
        Substrings,
        Telephone
    ),
    mr!(
        "2.5.13.23",
        "uniqueMemberMatch",
        "1.3.6.1.4.1.1466.115.121.1.34",
        Equality,
        UniqueMember
    ),
    mr!(
        "2.5.13.27",
        "generalizedTimeMatch",
        S_TIME,
        Equality,
        GeneralizedTime
    ),
    mr!(
        "2.5.13.28",
        "generalizedTimeOrderingMatch",
        S_TIME,
        Ordering,
        GeneralizedTime
    ),
    mr!(
        "2.5.13.29",
        "integerFirstComponentMatch",
        S_INT,
        Equality,
        IntegerFirstComponent
    ),
    mr!(
        "2.5.13.30",
        "objectIdentifierFirstComponentMatch",
        S_OID,
        Equality,
        OidFirstComponent
    ),
    mr!(
        "1.3.6.1.4.1.1466.109.114.1",
        "caseExactIA5Match",
        S_IA5,
        Equality,
        CaseExactIa5
    ),
    mr!(
        "1.3.6.1.4.1.1466.109.114.2",
        "caseIgnoreIA5Match",
        S_IA5,
        Equality,
        CaseIgnoreIa5
    ),
    mr!(
        "1.3.6.1.4.1.1466.109.114.3",
        "caseIgnoreIA5SubstringsMatch",
        S_SUB,
        Substrings,
        CaseIgnoreIa5
    ),
    mr!(
        "1.3.6.1.4.1.4203.1.2.1",
        "caseExactIA5SubstringsMatch",
        S_SUB,
        Substrings,
        CaseExactIa5
    ),
    mr!("1.3.6.1.1.16.2", "uuidMatch", S_UUID, Equality, Uuid),
    mr!(
        "1.3.6.1.1.16.3",
        "uuidOrderingMatch",
        S_UUID,
        Ordering,
        Uuid
    ),
    mr!(
        "1.3.6.1.4.1.4203.666.11.2.2",
        "csnMatch",
        S_CSN,
        Equality,
        Csn
    ),
    mr!(
        "1.3.6.1.4.1.4203.666.11.2.3",
        "csnOrderingMatch",
        S_CSN,
        Ordering,
        Csn
    ),
    // OpenLDAP's authzMatch (dyngroup's dgAuthz). slapd also normalises
    // a DN inside a `dn:` rule; here rules compare as exact text.
    mr!(
        "1.3.6.1.4.1.4203.666.4.12",
        "authzMatch",
        S_AUTHZ,
        Equality,
        CaseExact
    ),
    mr!(
        "1.2.840.113556.1.4.803",
        "integerBitAndMatch",
        S_INT,
        Extensible,
        BitAnd
    ),
    mr!(
        "1.2.840.113556.1.4.804",
        "integerBitOrMatch",
        S_INT,
        Extensible,
        BitOr
    ),
];

/// Look a rule up by name (case-insensitive) or OID.
pub(crate) fn find_rule(name_or_oid: &str) -> Option<&'static MatchingRule> {
    MATCHING_RULES
        .iter()
        .find(|r| r.oid == name_or_oid || r.name.eq_ignore_ascii_case(name_or_oid))
}

impl MatchingRule {
    /// RFC 4512 MatchingRuleDescription.
    pub fn definition(&self) -> String {
        format!(
            "( {} NAME '{}' SYNTAX {} )",
            self.oid, self.name, self.syntax
        )
    }

    /// Whether this rule can sensibly be applied to values of `syntax` in an
    /// extensible match without a named attribute (and for matchingRuleUse).
    pub fn applies_to_syntax(&self, syntax: &str) -> bool {
        let Some(suffix) = syntax.strip_prefix(P) else {
            return syntax == self.syntax;
        };
        let strings = ["15", "26", "44", "11", "50", "36", "41"];
        match self.algo {
            Algo::CaseIgnore | Algo::CaseExact => strings.contains(&suffix),
            Algo::CaseIgnoreIa5 | Algo::CaseExactIa5 => {
                ["26", "44", "11", "36", "50"].contains(&suffix)
            }
            Algo::Numeric => suffix == "36",
            Algo::Telephone => suffix == "50",
            Algo::CaseIgnoreList => suffix == "41",
            Algo::Dn => suffix == "12",
            Algo::UniqueMember => suffix == "34" || suffix == "12",
            Algo::Octet => true,
            Algo::Integer | Algo::BitAnd | Algo::BitOr => suffix == "27",
            Algo::GeneralizedTime => suffix == "24",
            Algo::Boolean => suffix == "7",
            Algo::Oid => suffix == "38",
            Algo::OidFirstComponent => ["3", "37", "30", "31", "16", "35", "54"].contains(&suffix),
            Algo::IntegerFirstComponent => suffix == "17",
            Algo::BitString => suffix == "6",
            Algo::Uuid | Algo::Csn => false,
        }
    }
}

/// Ordering key for an integer: one class byte (0 negative, 1 zero,
/// 2 positive), then for positives the digit count (u32 BE) and the digits,
/// for negatives both inverted so larger magnitudes sort first.
fn integer_key(v: &[u8]) -> Option<Vec<u8>> {
    let i = parse_integer(v).ok()?;
    if i.digits == b"0" {
        return Some(vec![1]);
    }
    let len = u32::try_from(i.digits.len()).ok()?;
    let mut k = Vec::with_capacity(5 + i.digits.len());
    if i.negative {
        k.push(0);
        k.extend_from_slice(&(!len).to_be_bytes());
        k.extend(i.digits.iter().map(|d| !d));
    } else {
        k.push(2);
        k.extend_from_slice(&len.to_be_bytes());
        k.extend_from_slice(i.digits);
    }
    Some(k)
}

/// Maximum nesting of DN-valued attributes inside RDNs that normalisation
/// follows (each level parses a DN, so this bounds recursion).
pub(crate) const MAX_DN_NESTING: u32 = 4;

impl Schema {
    /// Equality-form of `v` under `rule` (for ordering and substrings rules,
    /// the form of their equality counterpart).
    pub(crate) fn normalize_with(
        &self,
        rule: &MatchingRule,
        v: &[u8],
        depth: u32,
    ) -> Result<Vec<u8>, String> {
        match rule.algo {
            Algo::CaseIgnore => prepare_bytes(v, true, Spaces::Value),
            Algo::CaseExact => prepare_bytes(v, false, Spaces::Value),
            Algo::CaseIgnoreIa5 => prepare_ia5(v, true, Spaces::Value),
            Algo::CaseExactIa5 => prepare_ia5(v, false, Spaces::Value),
            Algo::Numeric => {
                syntax::check_value(syntax::Check::Numeric, v)?;
                prepare_ia5(v, false, Spaces::RemoveAll)
            }
            Algo::Telephone => prepare_bytes(v, true, Spaces::RemoveAllAndHyphens),
            Algo::CaseIgnoreList => {
                // Each line (separated by '$') prepared on its own.
                let mut out = Vec::with_capacity(v.len());
                for (i, line) in v.split(|&c| c == b'$').enumerate() {
                    if i > 0 {
                        out.push(b'$');
                    }
                    out.extend(prepare_bytes(line, true, Spaces::Value)?);
                }
                Ok(out)
            }
            Algo::Dn => self.normalize_dn_bytes(v, depth).map(String::into_bytes),
            Algo::UniqueMember => {
                let (dn, uid) = split_name_and_uid(v);
                let mut out = self.normalize_dn_bytes(dn, depth)?.into_bytes();
                if let Some(uid) = uid {
                    out.push(b'#');
                    out.extend_from_slice(uid);
                }
                Ok(out)
            }
            Algo::Octet | Algo::Csn => Ok(v.to_vec()),
            // RFC 4517 forbids leading zeros and "-0", so a valid INTEGER is
            // already in canonical decimal form.
            Algo::Integer => parse_integer(v).map(|_| v.to_vec()),
            Algo::BitAnd | Algo::BitOr => syntax::integer_to_i64(v)
                .map(|i| i.to_be_bytes().to_vec())
                .ok_or_else(|| "not a 64-bit integer".to_string()),
            Algo::GeneralizedTime => parse_generalized_time(v).map(|t| t.normalized().into_bytes()),
            Algo::Boolean => {
                syntax::check_value(syntax::Check::Boolean, v)?;
                Ok(v.to_vec())
            }
            Algo::Oid => {
                let s = std::str::from_utf8(v).map_err(|_| "OID is not UTF-8".to_string())?;
                Ok(self.oid_of(s.trim()).into_bytes())
            }
            Algo::OidFirstComponent => {
                let s = std::str::from_utf8(v).map_err(|_| "value is not UTF-8".to_string())?;
                let first = first_component(s).ok_or("no first component")?;
                Ok(self.oid_of(first).into_bytes())
            }
            Algo::IntegerFirstComponent => {
                let s = std::str::from_utf8(v).map_err(|_| "value is not UTF-8".to_string())?;
                let first = first_component(s).ok_or("no first component")?;
                parse_integer(first.as_bytes()).map(|_| first.as_bytes().to_vec())
            }
            Algo::BitString => {
                syntax::check_value(syntax::Check::BitString, v)?;
                Ok(v.to_vec())
            }
            Algo::Uuid => {
                syntax::check_value(syntax::Check::Uuid, v)?;
                Ok(v.to_ascii_lowercase())
            }
        }
    }

    /// Ordering key of `v` under `rule`.
    pub(crate) fn ordering_key_with(&self, rule: &MatchingRule, v: &[u8]) -> Option<Vec<u8>> {
        match rule.algo {
            Algo::Integer => integer_key(v),
            Algo::GeneralizedTime => parse_generalized_time(v).ok().map(|t| t.ordering_key()),
            Algo::Octet | Algo::Csn => Some(v.to_vec()),
            _ => self.normalize_with(rule, v, 0).ok(),
        }
    }

    /// Substring assertion part under the substrings rule `rule`.
    pub(crate) fn substring_part_with(
        &self,
        rule: &MatchingRule,
        part: &[u8],
    ) -> Result<Vec<u8>, String> {
        match rule.algo {
            Algo::CaseIgnore | Algo::CaseIgnoreList => prepare_bytes(part, true, Spaces::Substring),
            Algo::CaseExact => prepare_bytes(part, false, Spaces::Substring),
            Algo::CaseIgnoreIa5 => prepare_ia5(part, true, Spaces::Substring),
            Algo::CaseExactIa5 => prepare_ia5(part, false, Spaces::Substring),
            Algo::Numeric => prepare_ia5(part, false, Spaces::RemoveAll),
            Algo::Telephone => prepare_bytes(part, true, Spaces::RemoveAllAndHyphens),
            Algo::Octet => Ok(part.to_vec()),
            _ => Err(format!("{} is not a substrings rule", rule.name)),
        }
    }

    /// Numeric OID for a name of an attribute type, object class, syntax or
    /// matching rule; a numeric OID is returned as is and an unknown
    /// descriptor lowercased (so it still compares case-insensitively).
    pub(crate) fn oid_of(&self, s: &str) -> String {
        if let Some(at) = self.attribute(s) {
            return at.oid.clone();
        }
        if let Some(oc) = self.object_class(s) {
            return oc.oid.clone();
        }
        if let Some(r) = find_rule(s) {
            return r.oid.to_string();
        }
        s.to_ascii_lowercase()
    }

    fn normalize_dn_bytes(&self, v: &[u8], depth: u32) -> Result<String, String> {
        if depth >= MAX_DN_NESTING {
            return Err("DN values nested too deeply".into());
        }
        let s = std::str::from_utf8(v).map_err(|_| "DN is not UTF-8".to_string())?;
        let dn = crate::dn::Dn::parse(s).map_err(|e| e.to_string())?;
        self.normalize_dn_depth(&dn, depth + 1)
    }
}

/// First whitespace-separated token after the opening parenthesis of a
/// schema description, or the trimmed value itself if it has none.
fn first_component(s: &str) -> Option<&str> {
    let t = s.trim();
    let t = t.strip_prefix('(').unwrap_or(t);
    t.split_whitespace().next()
}

/// A simple phonetic code for one word, used by approximate matching: the
/// first letter, then one digit per group of similar-sounding consonants,
/// vowels dropped, repeats collapsed, at most 6 characters. Non-ASCII
/// letters are kept as they are.
pub(crate) fn phonetic(word: &str) -> String {
    fn class(c: char) -> Option<char> {
        Some(match c {
            'b' | 'f' | 'p' | 'v' => '1',
            'c' | 'g' | 'j' | 'k' | 'q' | 's' | 'x' | 'z' => '2',
            'd' | 't' => '3',
            'l' => '4',
            'm' | 'n' => '5',
            'r' => '6',
            'a' | 'e' | 'i' | 'o' | 'u' | 'y' | 'h' | 'w' => return None,
            _ if c.is_ascii() => return None,
            other => other,
        })
    }
    let mut chars = word.chars();
    let Some(first) = chars.next() else {
        return String::new();
    };
    let mut out = String::new();
    out.push(first);
    let mut last = class(first);
    for c in chars {
        let k = class(c);
        if let Some(d) = k {
            if k != last {
                out.push(d);
                if out.chars().count() >= 6 {
                    break;
                }
            }
        }
        // A vowel separates repeats; 'h' and 'w' do not (as in Soundex).
        if k.is_some() || !matches!(c, 'h' | 'w') {
            last = k;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_keys_order() {
        let vals: [&[u8]; 7] = [b"-100", b"-10", b"-2", b"0", b"3", b"25", b"100"];
        let keys: Vec<_> = vals.iter().map(|v| integer_key(v).unwrap()).collect();
        for w in keys.windows(2) {
            assert!(w[0] < w[1], "{w:?}");
        }
        assert!(integer_key(b"-0").is_none());
        assert!(integer_key(b"x").is_none());
    }

    #[test]
    fn rules_lookup() {
        assert_eq!(find_rule("CASEIGNOREMATCH").unwrap().oid, "2.5.13.2");
        assert_eq!(find_rule("2.5.13.14").unwrap().name, "integerMatch");
        assert!(find_rule("nope").is_none());
    }

    #[test]
    fn phonetic_codes() {
        assert_eq!(phonetic("robert"), phonetic("rupert"));
        assert_eq!(phonetic("smith"), phonetic("smyth"));
        assert_ne!(phonetic("smith"), phonetic("jones"));
    }
}
