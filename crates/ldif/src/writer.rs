//! LDIF writer (RFC 2849).

use std::io::{self, Write};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// Fold column commonly used by LDIF tools (OpenLDAP's ldif_put wraps here).
pub const DEFAULT_WRAP: usize = 76;

/// True when `value` cannot be written as an RFC 2849 SAFE-STRING and must be
/// base64-encoded:
///
/// ```text
/// SAFE-CHAR       = %x01-09 / %x0B-0C / %x0E-7F   ; not NUL, LF, CR
/// SAFE-INIT-CHAR  = %x01-09 / %x0B-0C / %x0E-1F / %x21-39 / %x3B / %x3D-7F
///                   ; also not SPACE, colon, less-than
/// SAFE-STRING     = [SAFE-INIT-CHAR *SAFE-CHAR]
/// ```
///
/// plus the RFC's note that a value ending in a space should be base64 too
/// (readers may strip trailing spaces). The empty value is a SAFE-STRING.
pub fn needs_base64(value: &[u8]) -> bool {
    match value {
        [] => false,
        [b' ' | b':' | b'<', ..] | [.., b' '] => true,
        _ => value
            .iter()
            .any(|&b| b == 0 || b == b'\n' || b == b'\r' || b >= 0x80),
    }
}

/// Same character set the reader accepts for an AttributeDescription; anything
/// else (a newline in particular) would corrupt the output.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.first().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b';' || c == b'.')
}

/// Appends `name: value` (or `name:: base64`) to `out`, folded so no physical
/// line exceeds `wrap` bytes; continuation lines start with one space.
/// `logical` is scratch space, reused across calls. The caller has checked
/// that `name` is a valid attribute description (ASCII, no line breaks).
pub fn append_line(
    out: &mut Vec<u8>,
    logical: &mut Vec<u8>,
    name: &[u8],
    value: &[u8],
    wrap: Option<usize>,
) {
    logical.clear();
    logical.extend_from_slice(name);
    if needs_base64(value) {
        logical.extend_from_slice(b":: ");
        let start = logical.len();
        let encoded = base64::encoded_len(value.len(), true).unwrap_or(0);
        logical.resize(start + encoded, 0);
        // encoded_len is exact for padded output, so the slice always fits.
        match STANDARD.encode_slice(value, &mut logical[start..]) {
            Ok(n) => logical.truncate(start + n),
            Err(_) => {
                logical.truncate(start);
                let s = STANDARD.encode(value);
                logical.extend_from_slice(s.as_bytes());
            }
        }
    } else if value.is_empty() {
        logical.push(b':');
    } else {
        logical.extend_from_slice(b": ");
        logical.extend_from_slice(value);
    }
    // A width below 2 leaves no room for content after the leading space of
    // a continuation line, so it means "do not fold".
    let width = match wrap {
        Some(w) if w >= 2 && logical.len() > w => w,
        _ => {
            out.extend_from_slice(logical);
            out.push(b'\n');
            return;
        }
    };
    // Output is ASCII here (non-ASCII values are base64, names are checked),
    // so folding at any byte never splits a character.
    let (head, mut rest) = logical.split_at(width);
    out.extend_from_slice(head);
    out.push(b'\n');
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(width - 1));
        out.push(b' ');
        out.extend_from_slice(chunk);
        out.push(b'\n');
        rest = tail;
    }
}

/// Writes one content record: the `dn:` line, one line per attribute value in
/// the order given, and the blank line that ends the record (so consecutive
/// calls produce a valid file). Values that are not SAFE-STRINGs (see
/// [`needs_base64`]) and non-ASCII DNs are base64-encoded. `wrap` folds lines
/// longer than that many bytes (use [`DEFAULT_WRAP`]); `None` never folds.
///
/// The record is assembled in memory and handed to `w` in one `write_all`.
/// Fails with `InvalidInput` if an attribute name is not a valid attribute
/// description, before anything is written.
pub fn write_entry<'a, 'b, W: Write>(
    w: &mut W,
    dn: &str,
    attrs: impl IntoIterator<Item = (&'a str, &'b [u8])>,
    wrap: Option<usize>,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(512);
    let mut logical = Vec::with_capacity(128);
    append_line(&mut out, &mut logical, b"dn", dn.as_bytes(), wrap);
    for (name, value) in attrs {
        if !valid_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid attribute description {name:?}"),
            ));
        }
        append_line(&mut out, &mut logical, name.as_bytes(), value, wrap);
    }
    out.push(b'\n');
    w.write_all(&out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LdifReader, ReaderOptions, Record};

    fn write(dn: &str, attrs: &[(&str, &[u8])], wrap: Option<usize>) -> String {
        let mut out = Vec::new();
        write_entry(&mut out, dn, attrs.iter().copied(), wrap).expect("write to Vec");
        String::from_utf8(out).expect("LDIF output is ASCII")
    }

    fn read_back(text: &str) -> Record {
        let mut r = LdifReader::new(text.as_bytes(), ReaderOptions::default());
        let rec = match r.next() {
            Some(Ok(rec)) => rec,
            other => panic!("expected one record, got {other:?}"),
        };
        assert!(r.next().is_none());
        rec
    }

    #[test]
    fn needs_base64_follows_safe_string() {
        for v in [
            &b""[..],
            b"abc",
            b"a b",
            b"a:b",
            b"a<b",
            b"#x",
            b"x\x7f",
            b"-",
        ] {
            assert!(!needs_base64(v), "{v:?}");
        }
        for v in [
            &b" lead"[..],
            b":colon",
            b"<lt",
            b"trail ",
            b"nul\0",
            b"cr\r",
            b"lf\n",
            "caf\u{e9}".as_bytes(),
            b"\xff",
            b" ",
        ] {
            assert!(needs_base64(v), "{v:?}");
        }
    }

    #[test]
    fn plain_and_base64_output() {
        let text = write(
            "cn=Jos\u{e9},dc=x",
            &[
                ("cn", b"plain"),
                ("sn", b" lead"),
                ("empty", b""),
                ("bin", &[0, 1, 2]),
            ],
            None,
        );
        assert_eq!(
            text,
            "dn:: Y249Sm9zw6ksZGM9eA==\ncn: plain\nsn:: IGxlYWQ=\nempty:\nbin:: AAEC\n\n"
        );
    }

    #[test]
    fn folding_at_the_given_column() {
        let value = "abcdefghijklmnopqrstuvwxyz";
        let text = write("dc=x", &[("description", value.as_bytes())], Some(10));
        assert_eq!(
            text,
            "dn: dc=x\ndescriptio\n n: abcdef\n ghijklmno\n pqrstuvwx\n yz\n\n"
        );
        for line in text.lines() {
            assert!(line.len() <= 10, "{line:?}");
        }
        // Exactly at the width: no fold.
        let text = write("dc=x", &[("cn", b"1234567")], Some(11));
        assert_eq!(text, "dn: dc=x\ncn: 1234567\n\n");
        let text = write("dc=x", &[("cn", b"12345678")], Some(11));
        assert_eq!(text, "dn: dc=x\ncn: 1234567\n 8\n\n");
        // Degenerate widths mean no folding.
        let text = write("dc=x", &[("cn", b"12345678")], Some(1));
        assert_eq!(text, "dn: dc=x\ncn: 12345678\n\n");
    }

    #[test]
    fn folded_base64_round_trips() {
        let value: Vec<u8> = (0..=255u8).collect();
        let text = write(
            "cn=bin",
            &[("userCertificate;binary", &value)],
            Some(DEFAULT_WRAP),
        );
        assert!(text.lines().all(|l| l.len() <= DEFAULT_WRAP));
        assert!(text.lines().count() > 5);
        assert_eq!(
            read_back(&text),
            Record::Content {
                dn: "cn=bin".into(),
                attrs: vec![("userCertificate;binary".into(), value)],
                line: 1
            }
        );
    }

    #[test]
    fn round_trip_generated_values() {
        // Deterministic xorshift so failures replay.
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let alphabet = b" :<#-=,abcXYZ019\r\n\0\x7f\xc3\xa9\xff";
        for round in 0..300 {
            let mut attrs: Vec<(String, Vec<u8>)> = Vec::new();
            for k in 0..(rnd() % 6 + 1) {
                let len = (rnd() % 200) as usize;
                let v = (0..len)
                    .map(|_| alphabet[(rnd() % alphabet.len() as u64) as usize])
                    .collect();
                attrs.push((format!("attr{k};x-opt"), v));
            }
            let dn = format!("cn= odd\u{e9} {round},dc=example,dc=com ");
            let wrap = match round % 4 {
                0 => None,
                1 => Some(2),
                2 => Some(DEFAULT_WRAP),
                _ => Some((rnd() % 100 + 2) as usize),
            };
            let mut out = Vec::new();
            write_entry(
                &mut out,
                &dn,
                attrs.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
                wrap,
            )
            .expect("write");
            let text = String::from_utf8(out).expect("ASCII");
            if let Some(w) = wrap {
                assert!(text.lines().all(|l| l.len() <= w), "wrap {w}: {text}");
            }
            assert_eq!(
                read_back(&text),
                Record::Content { dn, attrs, line: 1 },
                "round {round}"
            );
        }
    }

    #[test]
    fn consecutive_entries_form_a_file() {
        let mut out = Vec::new();
        write_entry(&mut out, "dc=a", [("dc", &b"a"[..])], None).expect("write");
        write_entry(&mut out, "dc=b", [("dc", &b"b"[..])], None).expect("write");
        let recs: Vec<_> = LdifReader::new(&out[..], ReaderOptions::default()).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].as_ref().ok().map(|r| r.line()), Some(4));
    }

    #[test]
    fn invalid_attribute_name_is_refused() {
        let mut out = Vec::new();
        let e = write_entry(&mut out, "dc=a", [("bad\nname", &b"x"[..])], None);
        assert_eq!(e.map_err(|e| e.kind()), Err(io::ErrorKind::InvalidInput));
        assert!(out.is_empty());
    }
}
