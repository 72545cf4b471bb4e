//! Byte layouts of the DN records (`dn2id`, an entry's placement, and
//! `id2parent` of stores before format 6) and DN resolution through them.

use super::*;

pub(crate) fn id_bytes(id: EntryId) -> [u8; 8] {
    id.to_be_bytes()
}

pub(crate) fn id_from(b: &[u8]) -> Result<EntryId, StoreError> {
    <[u8; 8]>::try_from(b)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt(format!("bad entry ID of {} bytes", b.len())))
}

/// A `dn2id` value: the entry's ID big-endian without its leading zero
/// bytes (3 bytes below 16M entries; store format 7). The 8-byte values
/// written before read the same ([`dn2id_id`]).
pub(crate) fn dn2id_value(id: EntryId) -> ShortId {
    ShortId {
        bytes: id.to_be_bytes(),
        start: (id.leading_zeros() as usize / 8).min(7),
    }
}

/// An entry ID in as few big-endian bytes as it takes (at least one).
pub(crate) struct ShortId {
    bytes: [u8; 8],
    start: usize,
}

impl std::ops::Deref for ShortId {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

/// The entry ID a `dn2id` value names (1 to 8 bytes, big-endian).
pub(crate) fn dn2id_id(v: &[u8]) -> Result<EntryId, StoreError> {
    if v.is_empty() || v.len() > 8 {
        return Err(StoreError::Corrupt(format!(
            "bad dn2id value of {} bytes",
            v.len()
        )));
    }
    let mut b = [0u8; 8];
    b[8 - v.len()..].copy_from_slice(v);
    Ok(u64::from_be_bytes(b))
}

/// How a `dn2id` key begins: its parent's ID, then the normalised RDN.
///
/// ```text
/// Short (store format 8):  1 byte n (1 to 8), then the ID in n big-endian
///                          bytes, as few as it takes (ID 0 is one zero byte)
/// Wide (formats 1 to 7):   the ID in 8 big-endian bytes
/// ```
///
/// Both sort keys by parent ID, then RDN, and no parent's prefix begins
/// another's, so a parent's children are one range of keys. The short
/// form saves 6 bytes of a user's ~38-byte record below ou=People. A
/// wide key begins with a zero byte (IDs stay below 2^56) and a short
/// one never does: while a store is upgraded both kinds share the
/// database, the wide ones first ([`Dn2idLayout::shorten`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dn2idLayout {
    Wide,
    Short,
}

/// The parent-ID prefix of `dn2id` keys (at most 9 bytes, on the stack).
pub(crate) struct ParentPrefix {
    bytes: [u8; 9],
    len: usize,
}

impl std::ops::Deref for ParentPrefix {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The first store format with short `dn2id` keys.
pub(crate) const SHORT_DN2ID_FORMAT: u32 = 8;

impl Dn2idLayout {
    pub(crate) fn of_format(format: u32) -> Dn2idLayout {
        if format >= SHORT_DN2ID_FORMAT {
            Dn2idLayout::Short
        } else {
            Dn2idLayout::Wide
        }
    }

    /// What every key of `parent`'s children begins with.
    pub(crate) fn prefix(self, parent: EntryId) -> ParentPrefix {
        let mut bytes = [0u8; 9];
        match self {
            Dn2idLayout::Wide => {
                bytes[..8].copy_from_slice(&id_bytes(parent));
                ParentPrefix { bytes, len: 8 }
            }
            Dn2idLayout::Short => {
                let id = dn2id_value(parent);
                bytes[0] = id.len() as u8;
                bytes[1..=id.len()].copy_from_slice(&id);
                ParentPrefix {
                    bytes,
                    len: 1 + id.len(),
                }
            }
        }
    }

    pub(crate) fn key(self, parent: EntryId, norm_rdn: &str) -> Vec<u8> {
        let prefix = self.prefix(parent);
        let mut k = Vec::with_capacity(prefix.len() + norm_rdn.len());
        k.extend_from_slice(&prefix);
        k.extend_from_slice(norm_rdn.as_bytes());
        k
    }

    /// Rewrite every wide key of `dn2id` short, in place, in `txn` (the
    /// upgrade to store format 8); the number of keys rewritten. Wide keys
    /// sort before short ones and keep their order when shortened, so
    /// each batch taken from the front is appended at the end.
    pub(crate) fn shorten(dn2id: Db, txn: &mut RwTxn<'_>) -> Result<u64, StoreError> {
        const BATCH: usize = 10_000;
        let mut moved = 0u64;
        loop {
            let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(BATCH);
            for item in dn2id.iter(txn)? {
                let (k, v) = item?;
                if k.first() != Some(&0) || batch.len() == BATCH {
                    break;
                }
                batch.push((k.to_vec(), v.to_vec()));
            }
            if batch.is_empty() {
                return Ok(moved);
            }
            for (k, _) in &batch {
                dn2id.delete(txn, k)?;
            }
            for (k, v) in &batch {
                let (parent, rdn) = k.split_at_checked(8).ok_or_else(|| {
                    StoreError::Corrupt(format!("dn2id key of {} bytes", k.len()))
                })?;
                let mut short = Dn2idLayout::Short.prefix(id_from(parent)?).to_vec();
                short.extend_from_slice(rdn);
                dn2id.put_with_flags(txn, heed::PutFlags::APPEND, &short, v)?;
            }
            moved += batch.len() as u64;
        }
    }
}

/// Set in an id2parent record's length field: the normalised RDN is the
/// RDN as given, and is not stored again (format 4).
const NORM_SAME: u16 = 0x8000;
/// Set in the length field: the normalised RDN is the RDN as given with
/// ASCII letters lowercased, not stored again (format 4).
const NORM_LOWER: u16 = 0x4000;
/// RDNs are far shorter than this (a DN is at most 8 KiB), so the two
/// bits above are never part of a length.
const LEN_MASK: u16 = 0x3FFF;

/// The placement an entry's record holds (format 6, see `entry_codec`):
/// the parent's ID as LEB128, then the RDN field.
pub(crate) fn put_place(p: &Placement, out: &mut Vec<u8>) {
    out.clear();
    crate::entry_codec::put_varint(out, p.parent);
    put_rdn_field(p, out);
}

/// The RDN as given, with its length and flags, and the normalised RDN
/// unless a flag says how to derive it.
fn put_rdn_field(p: &Placement, v: &mut Vec<u8>) {
    let len = p.rdn.len() as u16;
    let flag = if p.rdn.len() > usize::from(LEN_MASK) {
        0
    } else if p.norm_rdn == p.rdn {
        NORM_SAME
    } else if p
        .norm_rdn
        .bytes()
        .eq(p.rdn.bytes().map(|b| b.to_ascii_lowercase()))
    {
        NORM_LOWER
    } else {
        0
    };
    v.extend_from_slice(&(len | flag).to_be_bytes());
    v.extend_from_slice(p.rdn.as_bytes());
    if flag == 0 {
        v.extend_from_slice(p.norm_rdn.as_bytes());
    }
}

/// An `id2parent` record of entry `id`.
pub(crate) fn decode_placement(id: EntryId, v: &[u8]) -> Result<Placement, StoreError> {
    let bad = || StoreError::Corrupt(format!("id2parent record {id} is malformed"));
    if v.len() < 10 {
        return Err(bad());
    }
    let parent = id_from(&v[..8])?;
    read_rdn_field(parent, &v[8..]).ok_or_else(bad)
}

/// The placement held in entry `id`'s record ([`put_place`]).
pub(crate) fn read_place(id: EntryId, v: &[u8]) -> Result<Placement, StoreError> {
    let mut r = crate::entry_codec::Reader { buf: v };
    r.varint()
        .and_then(|parent| read_rdn_field(parent, r.buf))
        .ok_or_else(|| StoreError::Corrupt(format!("the placement of entry {id} is malformed")))
}

/// The parent's ID alone from entry `id`'s placement ([`put_place`]).
pub(crate) fn place_parent(id: EntryId, v: &[u8]) -> Result<EntryId, StoreError> {
    crate::entry_codec::Reader { buf: v }
        .varint()
        .ok_or_else(|| StoreError::Corrupt(format!("the placement of entry {id} is malformed")))
}

fn read_rdn_field(parent: EntryId, v: &[u8]) -> Option<Placement> {
    let field = u16::from_be_bytes([*v.first()?, *v.get(1)?]);
    let len = usize::from(field & LEN_MASK);
    let rest = &v[2..];
    if rest.len() < len {
        return None;
    }
    let rdn = std::str::from_utf8(&rest[..len]).ok()?.to_string();
    let tail = &rest[len..];
    let norm_rdn = match field & !LEN_MASK {
        0 => std::str::from_utf8(tail).ok()?.to_string(),
        NORM_SAME if tail.is_empty() => rdn.clone(),
        NORM_LOWER if tail.is_empty() => rdn.to_ascii_lowercase(),
        _ => return None,
    };
    Some(Placement {
        parent,
        rdn,
        norm_rdn,
    })
}

/// Resolve normalised RDNs (most specific first) through dn2id.
pub(crate) fn lookup_in(
    inner: &Inner,
    txn: &RoTxn<'_>,
    norm_rdns: &[String],
) -> Result<Lookup, StoreError> {
    // Find the longest suffix entry (parent 0) that ends this DN, then walk down.
    for start in 0..norm_rdns.len() {
        let suffix = norm_rdns[start..].join(",");
        if let Some(v) = inner.dn2id.get(txn, &inner.dn2id_layout.key(0, &suffix))? {
            let mut id = dn2id_id(v)?;
            for i in (0..start).rev() {
                match inner
                    .dn2id
                    .get(txn, &inner.dn2id_layout.key(id, &norm_rdns[i]))?
                {
                    Some(v) => id = dn2id_id(v)?,
                    None => return Ok(Lookup::Missing { matched: Some(id) }),
                }
            }
            return Ok(Lookup::Found(id));
        }
    }
    Ok(Lookup::Missing { matched: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `id2parent` record (stores before format 6): the parent's ID as
    /// 8 bytes, then the RDN field.
    fn encode_placement(p: &Placement) -> Vec<u8> {
        let mut v = Vec::with_capacity(10 + p.rdn.len() + p.norm_rdn.len());
        v.extend_from_slice(&id_bytes(p.parent));
        put_rdn_field(p, &mut v);
        v
    }

    fn place(rdn: &str, norm: &str) -> Placement {
        Placement {
            parent: 7,
            rdn: rdn.into(),
            norm_rdn: norm.into(),
        }
    }

    #[test]
    fn short_dn2id_prefixes_keep_order_and_never_begin_one_another() {
        let ids = [
            0u64,
            1,
            2,
            255,
            256,
            65_535,
            65_536,
            1_000_002,
            u32::MAX as u64,
            1 << 40,
            (1 << 56) - 1,
        ];
        for layout in [Dn2idLayout::Wide, Dn2idLayout::Short] {
            for pair in ids.windows(2) {
                let (a, b) = (layout.prefix(pair[0]), layout.prefix(pair[1]));
                assert!(*a < *b, "{layout:?} {pair:?}");
                // No child key of one parent falls among another's.
                assert!(!b.starts_with(&a) && !a.starts_with(&b), "{pair:?}");
                let (ka, kb) = (layout.key(pair[0], "\u{ff}"), layout.key(pair[1], ""));
                assert!(ka < kb, "{layout:?} {pair:?}");
            }
        }
        assert_eq!(&*Dn2idLayout::Short.prefix(0), &[1, 0]);
        assert_eq!(&*Dn2idLayout::Short.prefix(2), &[1, 2]);
        assert_eq!(
            &*Dn2idLayout::Short.prefix(1_000_002),
            &[3, 0x0F, 0x42, 0x42]
        );
        assert_eq!(Dn2idLayout::Short.key(2, "uid=a"), b"\x01\x02uid=a");
        // Wide keys begin with a zero byte, short ones never do.
        for id in ids {
            assert_eq!(Dn2idLayout::Wide.prefix(id)[0], 0);
            assert_ne!(Dn2idLayout::Short.prefix(id)[0], 0);
        }
        assert_eq!(Dn2idLayout::of_format(7), Dn2idLayout::Wide);
        assert_eq!(Dn2idLayout::of_format(8), Dn2idLayout::Short);
    }

    #[test]
    fn dn2id_values_are_short_and_eight_bytes_read_the_same() {
        for (id, len) in [
            (0u64, 1),
            (1, 1),
            (255, 1),
            (256, 2),
            (1_000_002, 3),
            (u64::MAX, 8),
        ] {
            let v = dn2id_value(id);
            assert_eq!(v.len(), len, "{id}");
            assert_eq!(dn2id_id(&v).unwrap(), id);
            assert_eq!(
                dn2id_id(&id_bytes(id)).unwrap(),
                id,
                "the 8-byte form of {id}"
            );
        }
        assert!(dn2id_id(&[]).is_err());
        assert!(dn2id_id(&[1; 9]).is_err());
    }

    #[test]
    fn placements_round_trip_and_store_the_normalised_rdn_only_when_it_differs() {
        for (p, stored) in [
            (place("uid=ann", "uid=ann"), 10 + 7),
            (place("UID=Ann", "uid=ann"), 10 + 7),
            (place("cn=Ann  Lee", "cn=ann lee"), 10 + 11 + 10),
            (place("cn=Åsa", "cn=åsa"), 10 + 7 + 7),
            (place("", ""), 10),
        ] {
            let v = encode_placement(&p);
            assert_eq!(v.len(), stored, "{}", p.rdn);
            let back = decode_placement(1, &v).unwrap();
            assert_eq!(
                (back.parent, back.rdn, back.norm_rdn),
                (7, p.rdn, p.norm_rdn)
            );
        }
        // Format 3 records (the normalised RDN always stored) still read.
        let mut old = id_bytes(7).to_vec();
        old.extend_from_slice(&7u16.to_be_bytes());
        old.extend_from_slice(b"uid=annuid=ann");
        let back = decode_placement(1, &old).unwrap();
        assert_eq!(
            (back.rdn.as_str(), back.norm_rdn.as_str()),
            ("uid=ann", "uid=ann")
        );
        // The form an entry's record holds: the parent as LEB128.
        for p in [place("uid=ann", "uid=ann"), place("cn=Åsa", "cn=åsa")] {
            let mut v = Vec::new();
            put_place(
                &Placement {
                    parent: 300,
                    ..p.clone()
                },
                &mut v,
            );
            assert_eq!(v.len(), encode_placement(&p).len() - 8 + 2);
            assert_eq!(place_parent(1, &v).unwrap(), 300);
            let back = read_place(1, &v).unwrap();
            assert_eq!(
                (back.parent, back.rdn, back.norm_rdn),
                (300, p.rdn, p.norm_rdn)
            );
            assert!(read_place(1, &v[..3]).is_err());
        }
        assert!(read_place(1, &[0x80]).is_err());
        assert!(place_parent(1, &[0x80]).is_err());
        // A flag with bytes after the RDN, or both flags, is damage.
        let mut bad = encode_placement(&place("uid=ann", "uid=ann"));
        bad.push(b'x');
        assert!(decode_placement(1, &bad).is_err());
        let mut both = encode_placement(&place("uid=ann", "uid=ann"));
        both[8] |= 0xC0;
        assert!(decode_placement(1, &both).is_err());
    }
}
