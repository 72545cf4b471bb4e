//! Paged results (RFC 2696), stateless: the cookie carries where the
//! next page starts.

use std::hash::{Hash, Hasher};

use pando_proto::{oid, Control, PagedResults, SearchRequest};
use pando_store::EntryId;

/// Stateless paging cookie: resume after `last` having sent `sent` entries
/// of the search whose parameters hash to `hash`. The client holds it, so
/// it is sealed with a MAC under a key made at start: a forged `sent` would
/// let a client page past the size limit (which counts across pages).
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 8 | last entry ID sent (BE) |
/// | 8 | 8 | entries sent so far (BE) |
/// | 16 | 8 | request hash (BE) |
/// | 24 | 16 | HMAC-SHA256 of bytes 0..24, cut to 16 bytes |
pub(super) struct Cookie {
    pub(super) last: EntryId,
    pub(super) sent: u64,
    pub(super) hash: u64,
}

pub(super) const COOKIE_BODY: usize = 24;

pub(super) const COOKIE_MAC: usize = 16;

/// This process's cookie key: cookies do not outlive a restart (the client
/// then starts its paged search again).
pub(super) fn cookie_mac(body: &[u8]) -> [u8; COOKIE_MAC] {
    use hmac::{Hmac, Mac};
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut k);
        k
    });
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("any key length");
    mac.update(body);
    let full = mac.finalize().into_bytes();
    let mut out = [0u8; COOKIE_MAC];
    out.copy_from_slice(&full[..COOKIE_MAC]);
    out
}

impl Cookie {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(COOKIE_BODY + COOKIE_MAC);
        v.extend_from_slice(&self.last.to_be_bytes());
        v.extend_from_slice(&self.sent.to_be_bytes());
        v.extend_from_slice(&self.hash.to_be_bytes());
        let mac = cookie_mac(&v);
        v.extend_from_slice(&mac);
        v
    }

    pub(super) fn decode(b: &[u8]) -> Option<Cookie> {
        if b.len() != COOKIE_BODY + COOKIE_MAC {
            return None;
        }
        let (body, mac) = b.split_at(COOKIE_BODY);
        if !pando_password::ct_eq(&cookie_mac(body), mac) {
            return None;
        }
        let n = |i: usize| {
            body.get(i..i + 8)
                .and_then(|s| <[u8; 8]>::try_from(s).ok())
                .map(u64::from_be_bytes)
        };
        Some(Cookie {
            last: n(0)?,
            sent: n(8)?,
            hash: n(16)?,
        })
    }
}

pub(super) fn request_hash(req: &SearchRequest) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    req.base.to_ascii_lowercase().hash(&mut h);
    (req.scope as u8).hash(&mut h);
    req.filter.to_string().hash(&mut h);
    req.attrs.hash(&mut h);
    req.types_only.hash(&mut h);
    h.finish()
}

pub(super) fn paged_control(size: i32, cookie: Vec<u8>) -> Control {
    Control {
        oid: oid::PAGED_RESULTS.to_string(),
        critical: false,
        value: Some(PagedResults { size, cookie }.encode()),
    }
}

/// Hash of a sort request's keys, folded into a sorted search's cookie
/// hash: a position in one order means nothing in another.
pub(super) fn keys_hash(keys: &[pando_proto::control_values::SortKey]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for k in keys {
        k.attr.to_ascii_lowercase().hash(&mut h);
        k.ordering_rule.hash(&mut h);
        k.reverse.hash(&mut h);
    }
    h.finish() | 1
}
