//! Byte layouts of the DN databases (`dn2id`, `id2parent`) and DN
//! resolution through them.

use super::*;

pub(crate) fn id_bytes(id: EntryId) -> [u8; 8] {
    id.to_be_bytes()
}

pub(crate) fn id_from(b: &[u8]) -> Result<EntryId, StoreError> {
    <[u8; 8]>::try_from(b)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt(format!("bad entry ID of {} bytes", b.len())))
}

pub(crate) fn dn2id_key(parent: EntryId, norm_rdn: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + norm_rdn.len());
    k.extend_from_slice(&id_bytes(parent));
    k.extend_from_slice(norm_rdn.as_bytes());
    k
}

pub(crate) fn encode_placement(p: &Placement) -> Vec<u8> {
    let mut v = Vec::with_capacity(10 + p.rdn.len() + p.norm_rdn.len());
    v.extend_from_slice(&id_bytes(p.parent));
    v.extend_from_slice(&(p.rdn.len() as u16).to_be_bytes());
    v.extend_from_slice(p.rdn.as_bytes());
    v.extend_from_slice(p.norm_rdn.as_bytes());
    v
}

pub(crate) fn decode_placement(id: EntryId, v: &[u8]) -> Result<Placement, StoreError> {
    let bad = || StoreError::Corrupt(format!("id2parent record {id} is malformed"));
    if v.len() < 10 {
        return Err(bad());
    }
    let parent = id_from(&v[..8])?;
    let len = u16::from_be_bytes([v[8], v[9]]) as usize;
    let rest = &v[10..];
    if rest.len() < len {
        return Err(bad());
    }
    let rdn = std::str::from_utf8(&rest[..len])
        .map_err(|_| bad())?
        .to_string();
    let norm_rdn = std::str::from_utf8(&rest[len..])
        .map_err(|_| bad())?
        .to_string();
    Ok(Placement {
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
        if let Some(v) = inner.dn2id.get(txn, &dn2id_key(0, &suffix))? {
            let mut id = id_from(v)?;
            for i in (0..start).rev() {
                match inner.dn2id.get(txn, &dn2id_key(id, &norm_rdns[i]))? {
                    Some(v) => id = id_from(v)?,
                    None => return Ok(Lookup::Missing { matched: Some(id) }),
                }
            }
            return Ok(Lookup::Found(id));
        }
    }
    Ok(Lookup::Missing { matched: None })
}
