//! Strict BER primitives: a zero-copy TLV reader and an appending writer.
//!
//! Only the subset of X.690 that LDAP (RFC 4511 section 5.1) uses is accepted:
//!
//! - one-byte identifiers (tag numbers 0..=30); high tag numbers are rejected;
//! - definite lengths only; the long form is accepted with up to
//!   [`MAX_LENGTH_OCTETS`] length octets, including non-minimal long forms,
//!   which BER permits; the indefinite form (0x80) is rejected;
//! - the reader compares whole identifier bytes, so a constructed encoding
//!   where a primitive one is expected (e.g. a constructed OCTET STRING, 0x24)
//!   is a tag mismatch and therefore rejected.
//!
//! The writer always produces definite, minimal lengths (DER style).

use crate::DecodeError;

/// Universal and LDAP-relevant identifier bytes.
pub mod tag {
    pub const BOOLEAN: u8 = 0x01;
    pub const INTEGER: u8 = 0x02;
    pub const OCTET_STRING: u8 = 0x04;
    pub const NULL: u8 = 0x05;
    pub const ENUMERATED: u8 = 0x0a;
    pub const SEQUENCE: u8 = 0x30;
    pub const SET: u8 = 0x31;
}

/// Longest accepted long-form length: 4 octets, i.e. contents up to 4 GiB - 1.
/// Anything larger could never pass a sane max PDU size anyway.
pub const MAX_LENGTH_OCTETS: usize = 4;

/// Reads TLVs from a byte slice. Every returned slice borrows from the input;
/// nothing is copied. A failed read leaves the reader unchanged.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

/// Parses an identifier and length at the start of `buf`.
/// Returns (identifier, header length, contents length); the contents are not
/// required to be present.
fn parse_header(buf: &[u8]) -> Result<(u8, usize, usize), DecodeError> {
    let tag = *buf
        .first()
        .ok_or_else(|| DecodeError::structural("truncated element: missing identifier"))?;
    if tag & 0x1f == 0x1f {
        return Err(DecodeError::structural(format!(
            "unsupported high tag number form (identifier 0x{tag:02x})"
        )));
    }
    let first = *buf
        .get(1)
        .ok_or_else(|| DecodeError::structural("truncated element: missing length"))?;
    if first < 0x80 {
        return Ok((tag, 2, usize::from(first)));
    }
    let n = usize::from(first & 0x7f);
    if n == 0 {
        return Err(DecodeError::structural("indefinite length is not allowed"));
    }
    if n > MAX_LENGTH_OCTETS {
        return Err(DecodeError::structural(format!(
            "length of length {n} exceeds {MAX_LENGTH_OCTETS}"
        )));
    }
    let octets = buf
        .get(2..2 + n)
        .ok_or_else(|| DecodeError::structural("truncated element: incomplete length"))?;
    // n <= 4, so the value fits in u32 and, on all supported targets, usize.
    let len = octets
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    let len = usize::try_from(len).map_err(|_| DecodeError::structural("length too large"))?;
    Ok((tag, 2 + n, len))
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes not yet consumed.
    pub fn remaining(&self) -> &'a [u8] {
        self.buf
    }

    /// The identifier byte of the next element, if any.
    pub fn peek_tag(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    /// Reads the next element, returning its identifier byte and contents.
    pub fn read_tlv(&mut self) -> Result<(u8, &'a [u8]), DecodeError> {
        let (tag, hdr, len) = parse_header(self.buf)?;
        let end = hdr
            .checked_add(len)
            .ok_or_else(|| DecodeError::structural("length overflow"))?;
        let contents = self.buf.get(hdr..end).ok_or_else(|| {
            DecodeError::structural(format!(
                "truncated element 0x{tag:02x}: {len} content bytes declared, {} present",
                self.buf.len().saturating_sub(hdr)
            ))
        })?;
        self.buf = self.buf.get(end..).unwrap_or_default();
        Ok((tag, contents))
    }

    /// Reads the next element, which must have identifier `expected`.
    pub fn read(&mut self, expected: u8) -> Result<&'a [u8], DecodeError> {
        match self.peek_tag() {
            Some(t) if t == expected => Ok(self.read_tlv()?.1),
            Some(t) => Err(DecodeError::new(format!(
                "expected identifier 0x{expected:02x}, found 0x{t:02x}"
            ))),
            None => Err(DecodeError::new(format!(
                "expected identifier 0x{expected:02x}, found end of data"
            ))),
        }
    }

    /// Reads the next element if its identifier is `tag`.
    pub fn read_opt(&mut self, tag: u8) -> Result<Option<&'a [u8]>, DecodeError> {
        if self.peek_tag() == Some(tag) {
            Ok(Some(self.read_tlv()?.1))
        } else {
            Ok(None)
        }
    }

    /// Reads a constructed element and returns a reader over its contents.
    pub fn read_constructed(&mut self, tag: u8) -> Result<Reader<'a>, DecodeError> {
        Ok(Reader::new(self.read(tag)?))
    }

    /// Reads an INTEGER-like element (INTEGER, ENUMERATED or an implicitly
    /// tagged one) and checks that it lies in `min..=max`.
    pub fn read_int_in(
        &mut self,
        tag: u8,
        min: i64,
        max: i64,
        what: &str,
    ) -> Result<i64, DecodeError> {
        let v = decode_int(self.read(tag)?)
            .map_err(|e| DecodeError::new(format!("{what}: {}", e.reason)))?;
        if v < min || v > max {
            return Err(DecodeError::new(format!(
                "{what} {v} out of range {min}..={max}"
            )));
        }
        Ok(v)
    }

    /// Reads a BOOLEAN-like element (contents exactly one byte).
    pub fn read_bool(&mut self, tag: u8, what: &str) -> Result<bool, DecodeError> {
        decode_bool(self.read(tag)?).map_err(|e| DecodeError::new(format!("{what}: {}", e.reason)))
    }

    /// Reads an OCTET STRING-like element whose contents must be UTF-8
    /// (LDAPString, LDAPDN, LDAPOID, URI, AttributeDescription).
    pub fn read_str(&mut self, tag: u8, what: &str) -> Result<&'a str, DecodeError> {
        decode_str(self.read(tag)?, what)
    }

    /// Like [`Reader::read_str`] for an OPTIONAL element.
    pub fn read_str_opt(&mut self, tag: u8, what: &str) -> Result<Option<&'a str>, DecodeError> {
        self.read_opt(tag)?.map(|b| decode_str(b, what)).transpose()
    }

    /// Requires that every byte has been consumed.
    pub fn finish(&self, what: &str) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::new(format!(
                "{} unexpected trailing bytes in {what}",
                self.buf.len()
            )))
        }
    }

    /// Consumes trailing SEQUENCE components that this decoder does not know.
    ///
    /// RFC 4511 section 4: "clients and servers MUST (unless otherwise
    /// specified) ignore trailing SEQUENCE components whose tags they do not
    /// recognize". They must still be well-formed TLVs: bytes that do not
    /// parse as BER are an error, not an extension.
    pub fn skip_extensions(&mut self) -> Result<(), DecodeError> {
        while !self.buf.is_empty() {
            self.read_tlv()?;
        }
        Ok(())
    }
}

/// Decodes the contents of an INTEGER. Redundant leading sign octets (a
/// non-minimal encoding) are tolerated; the value must fit in an i64.
pub fn decode_int(bytes: &[u8]) -> Result<i64, DecodeError> {
    let mut b = bytes;
    if b.is_empty() {
        return Err(DecodeError::new("empty INTEGER"));
    }
    // Strip octets that only repeat the sign of the next one.
    while let [first, second, ..] = b {
        let redundant =
            (*first == 0x00 && second & 0x80 == 0) || (*first == 0xff && second & 0x80 != 0);
        if !redundant {
            break;
        }
        b = b.get(1..).unwrap_or_default();
    }
    if b.len() > 8 {
        return Err(DecodeError::new("INTEGER too large"));
    }
    let negative = b.first().is_some_and(|&x| x & 0x80 != 0);
    let mut v: i64 = if negative { -1 } else { 0 };
    for &x in b {
        // Shifting left by 8 over at most 8 octets keeps the sign-extended value exact.
        v = (v << 8) | i64::from(x);
    }
    Ok(v)
}

/// Decodes the contents of a BOOLEAN: exactly one octet, zero is FALSE and any
/// other value TRUE (X.690 8.2.2; DER's 0xFF-only rule is not imposed).
pub fn decode_bool(bytes: &[u8]) -> Result<bool, DecodeError> {
    match bytes {
        [b] => Ok(*b != 0),
        _ => Err(DecodeError::new(format!(
            "BOOLEAN must be 1 byte, got {}",
            bytes.len()
        ))),
    }
}

/// Checks that an LDAPString-like value is UTF-8.
pub fn decode_str<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, DecodeError> {
    std::str::from_utf8(bytes).map_err(|e| {
        DecodeError::new(format!(
            "{what} is not valid UTF-8 (at byte {})",
            e.valid_up_to()
        ))
    })
}

// ---------------------------------------------------------------- writer

/// Appends a definite, minimal length.
pub fn write_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = (len as u64).to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        let significant = bytes.get(skip..).unwrap_or_default();
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
}

/// Appends a primitive element.
pub fn write_tlv(out: &mut Vec<u8>, tag: u8, contents: &[u8]) {
    out.push(tag);
    write_len(out, contents.len());
    out.extend_from_slice(contents);
}

/// Appends an INTEGER-like element in minimal two's complement form.
pub fn write_int(out: &mut Vec<u8>, tag: u8, v: i64) {
    let bytes = v.to_be_bytes();
    let mut start = 0;
    while start < 7 {
        let (Some(&a), Some(&b)) = (bytes.get(start), bytes.get(start + 1)) else {
            break;
        };
        if (a == 0x00 && b & 0x80 == 0) || (a == 0xff && b & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    write_tlv(out, tag, bytes.get(start..).unwrap_or_default());
}

/// Appends a BOOLEAN-like element (TRUE as 0xFF, as DER requires).
pub fn write_bool(out: &mut Vec<u8>, tag: u8, v: bool) {
    write_tlv(out, tag, &[if v { 0xff } else { 0x00 }]);
}

/// Starts a constructed element; returns a mark for [`end`]. Elements opened
/// with `begin` must be closed with `end` in LIFO order, and `out` must not
/// be truncated below the mark in between.
pub fn begin(out: &mut Vec<u8>, tag: u8) -> usize {
    out.push(tag);
    // One-byte placeholder: most elements are short; longer ones shift their
    // contents right once in `end` (a single memmove).
    out.push(0);
    out.len()
}

/// Closes a constructed element opened by [`begin`], writing its length.
pub fn end(out: &mut Vec<u8>, mark: usize) {
    let len = out.len().saturating_sub(mark);
    let Some(placeholder) = mark.checked_sub(1) else {
        debug_assert!(false, "invalid BER writer mark");
        return;
    };
    if len < 0x80 {
        if let Some(b) = out.get_mut(placeholder) {
            *b = len as u8;
        }
    } else {
        let mut hdr = Vec::with_capacity(9);
        write_len(&mut hdr, len);
        if placeholder < out.len() {
            out.splice(placeholder..mark, hdr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_round_trip_and_minimal() {
        for v in [
            0i64,
            1,
            -1,
            127,
            128,
            -128,
            -129,
            255,
            256,
            i32::MAX as i64,
            i32::MIN as i64,
            i64::MAX,
            i64::MIN,
        ] {
            let mut out = Vec::new();
            write_int(&mut out, tag::INTEGER, v);
            let mut r = Reader::new(&out);
            let got = r
                .read_int_in(tag::INTEGER, i64::MIN, i64::MAX, "x")
                .unwrap();
            assert_eq!(got, v);
            assert!(r.is_empty());
        }
        let mut out = Vec::new();
        write_int(&mut out, tag::INTEGER, 128);
        assert_eq!(out, [0x02, 0x02, 0x00, 0x80]);
        out.clear();
        write_int(&mut out, tag::INTEGER, -129);
        assert_eq!(out, [0x02, 0x02, 0xff, 0x7f]);
    }

    #[test]
    fn int_non_minimal_tolerated_but_bounded() {
        assert_eq!(decode_int(&[0x00, 0x00, 0x05]).unwrap(), 5);
        assert_eq!(decode_int(&[0xff, 0xff, 0x80]).unwrap(), -128);
        assert_eq!(decode_int(&[0; 20]).unwrap(), 0);
        assert!(decode_int(&[]).is_err());
        assert!(decode_int(&[0x01, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn long_lengths() {
        for len in [0usize, 1, 127, 128, 255, 256, 65535, 65536, 1 << 20] {
            let mut out = Vec::new();
            let m = begin(&mut out, tag::SEQUENCE);
            out.resize(out.len() + len, 7u8);
            end(&mut out, m);
            let mut r = Reader::new(&out);
            let c = r.read(tag::SEQUENCE).unwrap();
            assert_eq!(c.len(), len);
            assert!(r.is_empty());
        }
        let mut out = Vec::new();
        write_len(&mut out, 300);
        assert_eq!(out, [0x82, 0x01, 0x2c]);
    }

    #[test]
    fn header_rejections() {
        assert!(Reader::new(&[0x04, 0x80, 0, 0]).read_tlv().is_err()); // indefinite
        assert!(Reader::new(&[0x04, 0x85, 0, 0, 0, 0, 1, 0])
            .read_tlv()
            .is_err());
        assert!(Reader::new(&[0x1f, 0x01, 0x00]).read_tlv().is_err()); // high tag
        assert!(Reader::new(&[0x04, 0x05, 1, 2]).read_tlv().is_err()); // truncated
        assert!(Reader::new(&[0x04]).read_tlv().is_err());
        // Non-minimal long form is legal BER.
        let mut r = Reader::new(&[0x04, 0x81, 0x01, 0x41]);
        assert_eq!(r.read(tag::OCTET_STRING).unwrap(), b"A");
        // Constructed OCTET STRING is a different identifier.
        assert!(Reader::new(&[0x24, 0x03, 0x04, 0x01, 0x41])
            .read(tag::OCTET_STRING)
            .is_err());
    }

    #[test]
    fn bool_rules() {
        assert!(!decode_bool(&[0]).unwrap());
        assert!(decode_bool(&[1]).unwrap());
        assert!(decode_bool(&[0xff]).unwrap());
        assert!(decode_bool(&[]).is_err());
        assert!(decode_bool(&[0, 0]).is_err());
    }

    #[test]
    fn failed_read_does_not_advance() {
        let data = [0x04, 0x01, 0x41];
        let mut r = Reader::new(&data);
        assert!(r.read(tag::INTEGER).is_err());
        assert_eq!(r.read(tag::OCTET_STRING).unwrap(), b"A");
    }

    #[test]
    fn extensions_must_be_well_formed() {
        let mut r = Reader::new(&[0x8f, 0x01, 0x00, 0x04, 0x00]);
        assert!(r.skip_extensions().is_ok());
        let mut r = Reader::new(&[0x8f, 0x05, 0x00]);
        assert!(r.skip_extensions().is_err());
    }
}
