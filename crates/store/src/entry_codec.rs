//! The stored form of an entry in `id2entry`.
//!
//! ```text
//! offset  size  field
//! 0       1     format version (ENTRY_FORMAT = 1)
//! 1       4     CRC-32 (IEEE) of every byte after this field, little-endian
//! 5       var   attribute count (LEB128)
//!         per attribute:
//!           var   description length (LEB128), then the canonical description bytes
//!           var   value count (LEB128)
//!           per value: var length (LEB128), then the value bytes
//! ```
//!
//! The DN is not stored here: it is derived from `id2parent` so that renaming
//! or moving a subtree rewrites one record, not every descendant. The checksum
//! lets reads and `pando verify` detect corruption end to end.

use pando_model::{Attribute, Dn, Entry};

use crate::StoreError;

pub const ENTRY_FORMAT: u8 = 1;
const HEADER: usize = 5;

/// Append the stored form of `attrs` to `out` (which is cleared first).
pub fn encode(attrs: &[Attribute], out: &mut Vec<u8>) {
    out.clear();
    out.push(ENTRY_FORMAT);
    out.extend_from_slice(&[0; 4]);
    put_varint(out, attrs.len() as u64);
    for a in attrs {
        put_varint(out, a.desc.len() as u64);
        out.extend_from_slice(a.desc.as_bytes());
        put_varint(out, a.values.len() as u64);
        for v in &a.values {
            put_varint(out, v.len() as u64);
            out.extend_from_slice(v);
        }
    }
    let crc = crc32fast::hash(&out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// Decode a stored entry; `dn` comes from `id2parent`.
pub fn decode(id: u64, dn: Dn, bytes: &[u8]) -> Result<Entry, StoreError> {
    let corrupt = |why: &str| StoreError::Corrupt(format!("id2entry record {id}: {why}"));
    if bytes.len() < HEADER {
        return Err(corrupt("shorter than its header"));
    }
    if bytes[0] != ENTRY_FORMAT {
        return Err(corrupt(&format!("unknown entry format {}", bytes[0])));
    }
    let stored_crc = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    if crc32fast::hash(&bytes[HEADER..]) != stored_crc {
        return Err(corrupt("checksum mismatch"));
    }
    let mut r = Reader {
        buf: &bytes[HEADER..],
    };
    let count = r
        .varint()
        .ok_or_else(|| corrupt("truncated attribute count"))?;
    let mut attrs = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        let desc = r.bytes().ok_or_else(|| corrupt("truncated description"))?;
        let desc = std::str::from_utf8(desc).map_err(|_| corrupt("description is not UTF-8"))?;
        let n = r.varint().ok_or_else(|| corrupt("truncated value count"))?;
        let mut values = Vec::with_capacity(n.min(4096) as usize);
        for _ in 0..n {
            values.push(
                r.bytes()
                    .ok_or_else(|| corrupt("truncated value"))?
                    .to_vec(),
            );
        }
        attrs.push(Attribute {
            desc: desc.to_string(),
            values,
        });
    }
    if !r.buf.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    Ok(Entry { dn, attrs })
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first()?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(len);
        self.buf = rest;
        Some(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Attribute> {
        vec![
            Attribute {
                desc: "objectClass".into(),
                values: vec![b"top".to_vec(), b"person".to_vec()],
            },
            Attribute {
                desc: "cn".into(),
                values: vec![vec![0xff; 300]],
            },
        ]
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        let e = decode(7, Dn { rdns: vec![] }, &buf).unwrap();
        assert_eq!(e.attrs, sample());
    }

    #[test]
    fn flipped_byte_is_detected() {
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        for i in 0..buf.len() {
            let mut copy = buf.clone();
            copy[i] ^= 0x10;
            assert!(
                decode(1, Dn { rdns: vec![] }, &copy).is_err(),
                "flip at {i} undetected"
            );
        }
    }

    #[test]
    fn truncation_is_detected() {
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        for len in 0..buf.len() {
            assert!(decode(1, Dn { rdns: vec![] }, &buf[..len]).is_err());
        }
    }
}
