//! RFC 4518 string preparation: transcode (input is already UTF-8), map,
//! normalise (NFKC), prohibit, and insignificant-character handling.
//!
//! Deviations, chosen for predictability and documented here:
//! - case folding uses Unicode lowercase plus the few full case folds that
//!   differ from it (ß → ss, final sigma → σ, ...), not the complete
//!   RFC 3454 B.2 table;
//! - the prohibit step only rejects U+FFFD (a replacement character means
//!   the value was already damaged); unassigned code points are accepted;
//! - the bidi check is not performed.

use unicode_normalization::UnicodeNormalization;

/// How insignificant spaces are treated (RFC 4518 section 2.6.1).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Spaces {
    /// Attribute values and equality assertions: runs of spaces become
    /// one, leading and trailing spaces are dropped. A value of only
    /// spaces becomes a single space, so no normalised value is empty.
    Value,
    /// Substring assertion parts: runs become one space, ends kept (the
    /// filter evaluator trims the outer ends of initial/final itself).
    Substring,
    /// numericString: every space removed.
    RemoveAll,
    /// telephoneNumber: every space and hyphen removed.
    RemoveAllAndHyphens,
}

/// RFC 4518 section 2.2 "map": characters mapped to nothing or to SPACE.
fn map_char(c: char) -> Option<char> {
    let u = c as u32;
    match u {
        // Whitespace-like controls and separators map to SPACE.
        0x09..=0x0D | 0x85 => Some(' '),
        0x20 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000 => {
            Some(' ')
        }
        // Other controls, soft hyphen, variation selectors, zero-width and
        // other format characters map to nothing.
        0x00..=0x08 | 0x0E..=0x1F | 0x7F..=0x84 | 0x86..=0x9F => None,
        0xAD | 0x034F | 0x061C | 0x06DD | 0x070F | 0x1806 | 0x180B..=0x180E => None,
        0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x206A..=0x206F => None,
        0xFE00..=0xFE0F | 0xFEFF | 0xFFF9..=0xFFFC => None,
        0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F => None,
        _ => Some(c),
    }
}

/// Full case folding for a character, appended to `out`.
fn fold_into(c: char, out: &mut String) {
    match c {
        'ß' | 'ẞ' => out.push_str("ss"),
        'ς' => out.push('σ'),
        'ſ' => out.push('s'),
        'ﬀ' => out.push_str("ff"),
        'ﬁ' => out.push_str("fi"),
        'ﬂ' => out.push_str("fl"),
        _ => out.extend(c.to_lowercase()),
    }
}

/// Prepare a Unicode string for matching. `fold` selects the caseIgnore
/// variants. Errors when the string contains a prohibited character.
pub(crate) fn prepare(s: &str, fold: bool, spaces: Spaces) -> Result<String, String> {
    let mut mapped = String::with_capacity(s.len());
    for c in s.chars() {
        if let Some(m) = map_char(c) {
            if fold {
                fold_into(m, &mut mapped);
            } else {
                mapped.push(m);
            }
        }
    }
    // NFKC after folding; folding again after NFKC catches compatibility
    // characters that decompose into foldable ones (U+2160 ROMAN NUMERAL
    // ONE → "I", U+03F2 GREEK LUNATE SIGMA → final sigma). Repeat until
    // stable so that preparing a prepared string changes nothing; two
    // rounds settle every case known, four bound the work.
    // NFKC leaves ASCII unchanged: skip it for the common case.
    let ascii = mapped.is_ascii();
    let mut normalized: String = if ascii {
        mapped
    } else {
        mapped.nfkc().collect()
    };
    // Folded ASCII input is already stable; anything else may decompose
    // into characters that fold (U+2121 TELEPHONE SIGN → "TEL").
    if fold && !ascii {
        for _ in 0..4 {
            let mut again = String::with_capacity(normalized.len());
            for c in normalized.chars() {
                fold_into(c, &mut again);
            }
            let again: String = again.nfkc().collect();
            if again == normalized {
                break;
            }
            normalized = again;
        }
    }
    if normalized.contains('\u{FFFD}') {
        return Err("value contains U+FFFD REPLACEMENT CHARACTER".into());
    }
    let out = handle_spaces(&normalized, spaces);
    // Removing spaces can bring combining marks together that NFKC orders
    // differently (found by the `dn` fuzz target); normalise again so a
    // prepared string is a fixed point.
    if out.is_ascii() {
        Ok(out)
    } else {
        Ok(out.nfkc().collect())
    }
}

fn handle_spaces(s: &str, spaces: Spaces) -> String {
    match spaces {
        Spaces::RemoveAll => s.chars().filter(|&c| c != ' ').collect(),
        Spaces::RemoveAllAndHyphens => s
            .chars()
            .filter(|&c| c != ' ' && c != '-' && c != '\u{2010}' && c != '\u{2212}')
            .collect(),
        Spaces::Value | Spaces::Substring => {
            let mut out = String::with_capacity(s.len());
            let mut prev_space = false;
            for c in s.chars() {
                if c == ' ' {
                    if !prev_space {
                        out.push(' ');
                    }
                    prev_space = true;
                } else {
                    out.push(c);
                    prev_space = false;
                }
            }
            if spaces == Spaces::Value {
                let t = out.trim_matches(' ');
                if t.is_empty() {
                    return " ".to_string();
                }
                return t.to_string();
            }
            out
        }
    }
}

/// Prepare raw value bytes: they must be UTF-8.
pub(crate) fn prepare_bytes(v: &[u8], fold: bool, spaces: Spaces) -> Result<Vec<u8>, String> {
    if let Some(out) = prepare_printable_ascii(v, fold, spaces) {
        return Ok(out);
    }
    let s = std::str::from_utf8(v).map_err(|_| "value is not valid UTF-8".to_string())?;
    prepare(s, fold, spaces).map(String::into_bytes)
}

/// [`prepare`] for the common case, in one pass over the bytes: a value
/// of printable ASCII only (U+0020–U+007E), where mapping changes nothing,
/// folding is ASCII lowercasing and NFKC is the identity. None for any
/// other value (the general path handles it).
fn prepare_printable_ascii(v: &[u8], fold: bool, spaces: Spaces) -> Option<Vec<u8>> {
    if !v.iter().all(|&b| (0x20..0x7F).contains(&b)) {
        return None;
    }
    let mut out = Vec::with_capacity(v.len());
    let mut prev_space = false;
    for &b in v {
        let drop = match spaces {
            Spaces::RemoveAll => b == b' ',
            Spaces::RemoveAllAndHyphens => b == b' ' || b == b'-',
            Spaces::Value | Spaces::Substring => b == b' ' && prev_space,
        };
        prev_space = b == b' ';
        if !drop {
            out.push(if fold { b.to_ascii_lowercase() } else { b });
        }
    }
    if spaces == Spaces::Value {
        let start = out.iter().position(|&b| b != b' ');
        let Some(start) = start else {
            return Some(b" ".to_vec());
        };
        let end = out
            .iter()
            .rposition(|&b| b != b' ')
            .map_or(out.len(), |e| e + 1);
        out.truncate(end);
        out.drain(..start);
    }
    Some(out)
}

/// IA5 variant: the value must be ASCII; folding is ASCII only.
pub(crate) fn prepare_ia5(v: &[u8], fold: bool, spaces: Spaces) -> Result<Vec<u8>, String> {
    if !v.is_ascii() {
        return Err("value is not an IA5 (ASCII) string".into());
    }
    let s = std::str::from_utf8(v).map_err(|_| "value is not ASCII".to_string())?;
    let mapped: String = s
        .chars()
        .filter_map(map_char)
        .map(|c| if fold { c.to_ascii_lowercase() } else { c })
        .collect();
    Ok(handle_spaces(&mapped, spaces).into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insignificant_spaces() {
        let a = prepare("  a   b ", true, Spaces::Value).unwrap();
        let b = prepare("A B", true, Spaces::Value).unwrap();
        assert_eq!(a, "a b");
        assert_eq!(a, b);
        assert_eq!(prepare("   ", true, Spaces::Value).unwrap(), " ");
        assert_eq!(
            prepare(" a  b ", false, Spaces::Substring).unwrap(),
            " a b "
        );
        assert_eq!(
            prepare("1 2-3", true, Spaces::RemoveAllAndHyphens).unwrap(),
            "123"
        );
        assert_eq!(prepare(" 1 2 3 ", false, Spaces::RemoveAll).unwrap(), "123");
    }

    #[test]
    fn the_printable_ascii_path_prepares_as_the_general_one() {
        // Every string of up to 5 characters over an alphabet holding each
        // case the fast path treats apart (space, hyphen, upper, lower,
        // digit, the ends of the printable range), every mode, both folds.
        let alphabet = [b' ', b'-', b'A', b'z', b'7', b'!', b'~'];
        let mut strings: Vec<Vec<u8>> = vec![Vec::new()];
        let mut last = strings.clone();
        for _ in 0..5 {
            let next: Vec<Vec<u8>> = last
                .iter()
                .flat_map(|s| {
                    alphabet.iter().map(move |&c| {
                        let mut t = s.clone();
                        t.push(c);
                        t
                    })
                })
                .collect();
            strings.extend(next.iter().cloned());
            last = next;
        }
        let modes = [
            Spaces::Value,
            Spaces::Substring,
            Spaces::RemoveAll,
            Spaces::RemoveAllAndHyphens,
        ];
        for s in &strings {
            let text = std::str::from_utf8(s).unwrap();
            for spaces in modes {
                for fold in [true, false] {
                    let fast = prepare_printable_ascii(s, fold, spaces).unwrap();
                    let general = prepare(text, fold, spaces).unwrap().into_bytes();
                    assert_eq!(fast, general, "{text:?} {spaces:?} fold={fold}");
                }
            }
        }
        // Anything else takes the general path.
        for other in [&b"a\tb"[..], b"\x7f", "é".as_bytes(), b"\x00"] {
            assert!(prepare_printable_ascii(other, true, Spaces::Value).is_none());
        }
    }

    #[test]
    fn mapping_folding_nfkc() {
        // Tab and NBSP map to space; soft hyphen and ZWSP vanish.
        assert_eq!(
            prepare("a\t\u{A0}b\u{AD}c\u{200B}", true, Spaces::Value).unwrap(),
            "a bc"
        );
        assert_eq!(prepare("Straße", true, Spaces::Value).unwrap(), "strasse");
        // Found by the `dn` fuzz target: lunate sigma folds, then NFKC turns
        // it into a final sigma, which must fold again.
        let once = prepare("BB\u{3F9}", true, Spaces::Value).unwrap();
        assert_eq!(prepare(&once, true, Spaces::Value).unwrap(), once);
        assert_eq!(once, "bb\u{3C3}");
        // Removing the space brings two combining marks of different
        // classes together; the result must still be stable.
        assert_eq!(prepare("x\u{2121}", true, Spaces::Value).unwrap(), "xtel");
        let once = prepare("a\u{7FD} \u{7ED}\u{301}", true, Spaces::RemoveAll).unwrap();
        assert_eq!(prepare(&once, true, Spaces::RemoveAll).unwrap(), once);
        // Fullwidth letters normalise under NFKC.
        assert_eq!(prepare("ＡＢＣ", true, Spaces::Value).unwrap(), "abc");
        assert_eq!(prepare("ＡＢＣ", false, Spaces::Value).unwrap(), "ABC");
        // Composed and decomposed forms compare equal.
        assert_eq!(
            prepare("e\u{301}", false, Spaces::Value).unwrap(),
            prepare("\u{e9}", false, Spaces::Value).unwrap()
        );
        assert!(prepare("bad\u{FFFD}", true, Spaces::Value).is_err());
        assert!(prepare_bytes(b"\xff", true, Spaces::Value).is_err());
        assert!(prepare_ia5("é".as_bytes(), true, Spaces::Value).is_err());
        assert_eq!(
            prepare_ia5(b" Foo  Bar", true, Spaces::Value).unwrap(),
            b"foo bar"
        );
    }
}
