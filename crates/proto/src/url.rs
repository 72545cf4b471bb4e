//! Percent-decoding (RFC 3986 2.1), as LDAP URLs (RFC 4516), ldapi://
//! socket paths and LDIF's `file://` URLs write bytes: the one decoder
//! every caller uses.

/// `s` with each `%XX` (two hexadecimal digits) replaced by its byte;
/// None when a `%` is not followed by two hexadecimal digits.
pub fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if c == b'%' {
            let (hi, lo) = (s.get(i + 1)?, s.get(i + 2)?);
            let hi = (*hi as char).to_digit(16)?;
            let lo = (*lo as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    Some(out)
}

/// [`percent_decode`] of text that must decode to UTF-8 (a socket path
/// in a URL): the error names the text.
pub fn percent_decode_str(s: &str) -> Result<String, String> {
    let bytes = percent_decode(s.as_bytes())
        .ok_or_else(|| format!("'{s}': a % is not followed by two hexadecimal digits"))?;
    String::from_utf8(bytes).map_err(|_| format!("'{s}' does not decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_and_bad_ones_are_refused() {
        assert_eq!(
            percent_decode(b"%2Fvar%2frun%2Fldapi").unwrap(),
            b"/var/run/ldapi"
        );
        assert_eq!(percent_decode(b"a%20b%00").unwrap(), b"a b\0");
        // Not two hexadecimal digits (a sign is not a digit).
        for bad in [&b"%"[..], b"%4", b"%+1", b"%-1", b"%zz", b"x%4"] {
            assert_eq!(percent_decode(bad), None, "{:?}", bad);
        }
        assert_eq!(percent_decode_str("%2Ftmp").unwrap(), "/tmp");
        assert!(percent_decode_str("%ff").unwrap_err().contains("UTF-8"));
        assert!(percent_decode_str("%f")
            .unwrap_err()
            .contains("hexadecimal"));
    }
}
