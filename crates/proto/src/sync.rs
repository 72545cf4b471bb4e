//! RFC 4533 Content Synchronization: the values of the Sync Request,
//! State and Done controls and of the Sync Info intermediate message, and
//! the cookie text OpenLDAP puts in them (`rid=…,sid=…,csn=…`).
//!
//! Encoders leave out values equal to their DEFAULT, as DER (and OpenLDAP)
//! do; decoders accept them either way.

use crate::ber::{self, tag, Reader};
use crate::DecodeError;

/// A syncUUID: an entry's entryUUID as 16 raw bytes.
pub type SyncUuid = [u8; 16];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    RefreshOnly = 1,
    RefreshAndPersist = 3,
}

/// syncRequestValue ::= SEQUENCE {
///     mode ENUMERATED { refreshOnly (1), -- 2 reserved
///                       refreshAndPersist (3) },
///     cookie     syncCookie OPTIONAL,
///     reloadHint BOOLEAN DEFAULT FALSE }
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRequest {
    pub mode: SyncMode,
    pub cookie: Option<Vec<u8>>,
    pub reload_hint: bool,
}

impl SyncRequest {
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("sync request")?;
        let mode = match r.read_int_in(tag::ENUMERATED, 1, 3, "sync request mode")? {
            1 => SyncMode::RefreshOnly,
            3 => SyncMode::RefreshAndPersist,
            _ => return Err(DecodeError::new("sync request mode 2 is reserved")),
        };
        let cookie = r.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
        let reload_hint = match r.peek_tag() {
            Some(tag::BOOLEAN) => r.read_bool(tag::BOOLEAN, "reloadHint")?,
            _ => false,
        };
        r.skip_extensions()?;
        Ok(SyncRequest {
            mode,
            cookie,
            reload_hint,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        ber::write_int(&mut out, tag::ENUMERATED, self.mode as i64);
        if let Some(c) = &self.cookie {
            ber::write_tlv(&mut out, tag::OCTET_STRING, c);
        }
        if self.reload_hint {
            ber::write_bool(&mut out, tag::BOOLEAN, true);
        }
        ber::end(&mut out, m);
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStateKind {
    Present = 0,
    Add = 1,
    Modify = 2,
    Delete = 3,
}

/// syncStateValue ::= SEQUENCE {
///     state ENUMERATED { present (0), add (1), modify (2), delete (3) },
///     entryUUID syncUUID,
///     cookie    syncCookie OPTIONAL }
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncState {
    pub state: SyncStateKind,
    pub uuid: SyncUuid,
    pub cookie: Option<Vec<u8>>,
}

impl SyncState {
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("sync state")?;
        let state = match r.read_int_in(tag::ENUMERATED, 0, 3, "sync state")? {
            0 => SyncStateKind::Present,
            1 => SyncStateKind::Add,
            2 => SyncStateKind::Modify,
            _ => SyncStateKind::Delete,
        };
        let uuid = read_uuid(&mut r)?;
        let cookie = r.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
        r.skip_extensions()?;
        Ok(SyncState {
            state,
            uuid,
            cookie,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.cookie.as_ref().map_or(0, Vec::len));
        let m = ber::begin(&mut out, tag::SEQUENCE);
        ber::write_int(&mut out, tag::ENUMERATED, self.state as i64);
        ber::write_tlv(&mut out, tag::OCTET_STRING, &self.uuid);
        if let Some(c) = &self.cookie {
            ber::write_tlv(&mut out, tag::OCTET_STRING, c);
        }
        ber::end(&mut out, m);
        out
    }
}

fn read_uuid(r: &mut Reader<'_>) -> Result<SyncUuid, DecodeError> {
    let b = r.read(tag::OCTET_STRING)?;
    SyncUuid::try_from(b)
        .map_err(|_| DecodeError::new(format!("a syncUUID has 16 bytes, this one has {}", b.len())))
}

/// syncDoneValue ::= SEQUENCE {
///     cookie          syncCookie OPTIONAL,
///     refreshDeletes  BOOLEAN DEFAULT FALSE }
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncDone {
    pub cookie: Option<Vec<u8>>,
    pub refresh_deletes: bool,
}

impl SyncDone {
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("sync done")?;
        let cookie = r.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
        let refresh_deletes = match r.peek_tag() {
            Some(tag::BOOLEAN) => r.read_bool(tag::BOOLEAN, "refreshDeletes")?,
            _ => false,
        };
        r.skip_extensions()?;
        Ok(SyncDone {
            cookie,
            refresh_deletes,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        if let Some(c) = &self.cookie {
            ber::write_tlv(&mut out, tag::OCTET_STRING, c);
        }
        if self.refresh_deletes {
            ber::write_bool(&mut out, tag::BOOLEAN, true);
        }
        ber::end(&mut out, m);
        out
    }
}

/// syncInfoValue ::= CHOICE {
///     newcookie      [0] syncCookie,
///     refreshDelete  [1] SEQUENCE {
///         cookie         syncCookie OPTIONAL,
///         refreshDone    BOOLEAN DEFAULT TRUE },
///     refreshPresent [2] SEQUENCE {
///         cookie         syncCookie OPTIONAL,
///         refreshDone    BOOLEAN DEFAULT TRUE },
///     syncIdSet      [3] SEQUENCE {
///         cookie         syncCookie OPTIONAL,
///         refreshDeletes BOOLEAN DEFAULT FALSE,
///         syncUUIDs      SET OF syncUUID } }
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncInfo {
    NewCookie(Vec<u8>),
    RefreshDelete {
        cookie: Option<Vec<u8>>,
        done: bool,
    },
    RefreshPresent {
        cookie: Option<Vec<u8>>,
        done: bool,
    },
    IdSet {
        cookie: Option<Vec<u8>>,
        refresh_deletes: bool,
        uuids: Vec<SyncUuid>,
    },
}

const NEW_COOKIE: u8 = 0x80;
const REFRESH_DELETE: u8 = 0xa1;
const REFRESH_PRESENT: u8 = 0xa2;
const ID_SET: u8 = 0xa3;

impl SyncInfo {
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let (t, body) = outer.read_tlv()?;
        outer.finish("sync info")?;
        let mut r = Reader::new(body);
        let info = match t {
            NEW_COOKIE => return Ok(SyncInfo::NewCookie(body.to_vec())),
            REFRESH_DELETE | REFRESH_PRESENT => {
                let cookie = r.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
                let done = match r.peek_tag() {
                    Some(tag::BOOLEAN) => r.read_bool(tag::BOOLEAN, "refreshDone")?,
                    _ => true,
                };
                if t == REFRESH_DELETE {
                    SyncInfo::RefreshDelete { cookie, done }
                } else {
                    SyncInfo::RefreshPresent { cookie, done }
                }
            }
            ID_SET => {
                let cookie = r.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
                let refresh_deletes = match r.peek_tag() {
                    Some(tag::BOOLEAN) => r.read_bool(tag::BOOLEAN, "refreshDeletes")?,
                    _ => false,
                };
                let mut set = r.read_constructed(tag::SET)?;
                let mut uuids = Vec::new();
                while !set.is_empty() {
                    uuids.push(read_uuid(&mut set)?);
                }
                SyncInfo::IdSet {
                    cookie,
                    refresh_deletes,
                    uuids,
                }
            }
            other => {
                return Err(DecodeError::new(format!(
                    "unknown sync info choice 0x{other:02x}"
                )))
            }
        };
        r.skip_extensions()?;
        Ok(info)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            SyncInfo::NewCookie(c) => ber::write_tlv(&mut out, NEW_COOKIE, c),
            SyncInfo::RefreshDelete { cookie, done }
            | SyncInfo::RefreshPresent { cookie, done } => {
                let t = match self {
                    SyncInfo::RefreshDelete { .. } => REFRESH_DELETE,
                    _ => REFRESH_PRESENT,
                };
                let m = ber::begin(&mut out, t);
                if let Some(c) = cookie {
                    ber::write_tlv(&mut out, tag::OCTET_STRING, c);
                }
                if !done {
                    ber::write_bool(&mut out, tag::BOOLEAN, false);
                }
                ber::end(&mut out, m);
            }
            SyncInfo::IdSet {
                cookie,
                refresh_deletes,
                uuids,
            } => {
                let m = ber::begin(&mut out, ID_SET);
                if let Some(c) = cookie {
                    ber::write_tlv(&mut out, tag::OCTET_STRING, c);
                }
                if *refresh_deletes {
                    ber::write_bool(&mut out, tag::BOOLEAN, true);
                }
                let s = ber::begin(&mut out, tag::SET);
                for u in uuids {
                    ber::write_tlv(&mut out, tag::OCTET_STRING, u);
                }
                ber::end(&mut out, s);
                ber::end(&mut out, m);
            }
        }
        out
    }
}

/// An OpenLDAP sync cookie: `rid=NNN[,sid=SSS][,csn=CSN[;CSN…]][,delcsn=CSN]`
/// (rid decimal, up to 3 digits; sid hexadecimal, up to 3 digits; one CSN
/// per server ID). Unknown keys are skipped, as OpenLDAP skips them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cookie {
    pub rid: Option<u16>,
    /// The server ID of whoever sent the cookie.
    pub sid: Option<u16>,
    /// CSNs, one per server ID, as given.
    pub csns: Vec<String>,
    pub delcsn: Option<String>,
}

impl Cookie {
    /// Parse cookie text; what does not parse is an error naming it.
    pub fn parse(text: &[u8]) -> Result<Cookie, DecodeError> {
        let text = std::str::from_utf8(text)
            .map_err(|_| DecodeError::new("a sync cookie is not UTF-8"))?;
        let mut c = Cookie::default();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            let bad = || DecodeError::new(format!("malformed sync cookie field {part:?}"));
            match k {
                "rid" => {
                    if v.is_empty() || v.len() > 3 || !v.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(bad());
                    }
                    c.rid = Some(v.parse().map_err(|_| bad())?);
                }
                "sid" => {
                    if v.is_empty() || v.len() > 3 {
                        return Err(bad());
                    }
                    c.sid = Some(u16::from_str_radix(v, 16).map_err(|_| bad())?);
                }
                "csn" => {
                    for csn in v.split(';').filter(|s| !s.is_empty()) {
                        if csn_sid(csn).is_none() {
                            return Err(bad());
                        }
                        c.csns.push(csn.to_string());
                    }
                }
                "delcsn" => {
                    if csn_sid(v).is_none() {
                        return Err(bad());
                    }
                    c.delcsn = Some(v.to_string());
                }
                _ => {}
            }
        }
        Ok(c)
    }

    /// The cookie's text: rid (three digits, as OpenLDAP writes it), sid
    /// (three hex digits), the CSNs ordered by server ID.
    pub fn format(&self) -> String {
        let mut out = String::new();
        if let Some(rid) = self.rid {
            out.push_str(&format!("rid={rid:03}"));
        }
        if let Some(sid) = self.sid {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&format!("sid={sid:03x}"));
        }
        if !self.csns.is_empty() {
            if !out.is_empty() {
                out.push(',');
            }
            let mut csns: Vec<&String> = self.csns.iter().collect();
            csns.sort_by_key(|c| csn_sid(c));
            out.push_str("csn=");
            out.push_str(
                &csns
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(";"),
            );
        }
        if let Some(d) = &self.delcsn {
            out.push_str(",delcsn=");
            out.push_str(d);
        }
        out
    }

    /// The CSN given for server `sid`.
    pub fn csn_for(&self, sid: u16) -> Option<&str> {
        self.csns
            .iter()
            .find(|c| csn_sid(c) == Some(sid))
            .map(String::as_str)
    }

    /// Whether the state this cookie names takes in the change `csn`:
    /// the cookie holds a CSN of the same server ID at least as new (a
    /// server's changes travel every path in CSN order).
    pub fn has_seen(&self, csn: &str) -> bool {
        csn_sid(csn)
            .and_then(|sid| self.csn_for(sid))
            .is_some_and(|held| held >= csn)
    }

    /// Keep `csn` as its server's CSN unless a newer one is held.
    pub fn advance(&mut self, csn: &str) {
        let Some(sid) = csn_sid(csn) else { return };
        match self.csns.iter_mut().find(|c| csn_sid(c) == Some(sid)) {
            Some(held) if held.as_str() >= csn => {}
            Some(held) => *held = csn.to_string(),
            None => self.csns.push(csn.to_string()),
        }
    }
}

/// The server ID of a CSN (`time#count#sid#mod`, checked for form:
/// 22-character time ending in Z, hexadecimal fields); None if not a CSN.
pub fn csn_sid(csn: &str) -> Option<u16> {
    let mut f = csn.split('#');
    let (Some(time), Some(count), Some(sid), Some(modn), None) =
        (f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return None;
    };
    let hex = |s: &str, n: usize| {
        !s.is_empty() && s.len() <= n && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if time.len() != 22 || !time.ends_with('Z') || !hex(count, 6) || !hex(sid, 3) || !hex(modn, 6) {
        return None;
    }
    u16::from_str_radix(sid, 16).ok()
}

/// A UUID's text form (RFC 4122, lowercase) from its 16 bytes.
pub fn uuid_text(u: &SyncUuid) -> String {
    let hex = |n: u8| char::from_digit(u32::from(n), 16).unwrap_or('0');
    let mut out = String::with_capacity(36);
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(hex(b >> 4));
        out.push(hex(b & 0x0f));
    }
    out
}

/// The 16 bytes of a UUID in text form (hyphens optional, any case).
pub fn uuid_bytes(text: &str) -> Option<SyncUuid> {
    let hex: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        *out.get_mut(i)? = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSN: &str = "20191104065849.472236Z#000000#00c#000000";

    #[test]
    fn values_round_trip_and_defaults_are_left_out() {
        let r = SyncRequest {
            mode: SyncMode::RefreshAndPersist,
            cookie: Some(b"rid=001".to_vec()),
            reload_hint: false,
        };
        assert_eq!(SyncRequest::decode(&r.encode()).unwrap(), r);
        // No cookie, no hint: mode only.
        let bare = SyncRequest {
            mode: SyncMode::RefreshOnly,
            cookie: None,
            reload_hint: false,
        };
        assert_eq!(bare.encode(), [0x30, 3, 0x0a, 1, 1]);
        assert!(SyncRequest::decode(&[0x30, 3, 0x0a, 1, 2]).is_err());
        let s = SyncState {
            state: SyncStateKind::Modify,
            uuid: [7; 16],
            cookie: Some(b"x".to_vec()),
        };
        assert_eq!(SyncState::decode(&s.encode()).unwrap(), s);
        // A 36-character text UUID is refused.
        let mut bad = Vec::new();
        let m = ber::begin(&mut bad, tag::SEQUENCE);
        ber::write_int(&mut bad, tag::ENUMERATED, 1);
        ber::write_tlv(&mut bad, tag::OCTET_STRING, uuid_text(&[1; 16]).as_bytes());
        ber::end(&mut bad, m);
        let e = SyncState::decode(&bad).unwrap_err();
        assert!(e.reason.contains("16 bytes"), "{e:?}");
        let d = SyncDone {
            cookie: None,
            refresh_deletes: true,
        };
        assert_eq!(SyncDone::decode(&d.encode()).unwrap(), d);
        assert_eq!(SyncDone::default().encode(), [0x30, 0]);
        for info in [
            SyncInfo::NewCookie(b"rid=001,csn=x".to_vec()),
            SyncInfo::RefreshDelete {
                cookie: None,
                done: true,
            },
            SyncInfo::RefreshPresent {
                cookie: Some(b"c".to_vec()),
                done: false,
            },
            SyncInfo::IdSet {
                cookie: None,
                refresh_deletes: true,
                uuids: vec![[1; 16], [2; 16]],
            },
        ] {
            assert_eq!(SyncInfo::decode(&info.encode()).unwrap(), info);
        }
        // refreshDone TRUE is the default: not written.
        assert_eq!(
            SyncInfo::RefreshDelete {
                cookie: None,
                done: true
            }
            .encode(),
            [0xa1, 0]
        );
    }

    #[test]
    fn cookies_parse_and_format_as_openldap_writes_them() {
        let text = format!("rid=001,sid=00c,csn={CSN};20191104065849.472236Z#000000#001#000000");
        let c = Cookie::parse(text.as_bytes()).unwrap();
        assert_eq!((c.rid, c.sid, c.csns.len()), (Some(1), Some(12), 2));
        assert_eq!(c.csn_for(12), Some(CSN));
        // CSNs come out ordered by server ID.
        assert_eq!(
            c.format(),
            format!("rid=001,sid=00c,csn=20191104065849.472236Z#000000#001#000000;{CSN}")
        );
        assert_eq!(Cookie::parse(b"").unwrap(), Cookie::default());
        assert_eq!(Cookie::parse(b"rid=5,future=1").unwrap().rid, Some(5));
        for bad in ["rid=1000", "rid=x", "sid=1000", "csn=garbage", "delcsn=1"] {
            assert!(Cookie::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        let mut c = Cookie::default();
        c.advance(CSN);
        c.advance("20000101000000.000000Z#000000#00c#000000");
        assert_eq!(c.csns, [CSN]);
    }

    #[test]
    fn a_cookie_has_seen_changes_of_its_server_ids_up_to_their_csns() {
        let held = "20200101000000.000000Z#000000#001#000000";
        let c = Cookie::parse(format!("csn={held}").as_bytes()).unwrap();
        assert!(c.has_seen(held));
        assert!(c.has_seen("20191231235959.999999Z#000005#001#000000"));
        assert!(!c.has_seen("20200101000000.000000Z#000001#001#000000"));
        // Another server ID, or not a CSN at all: not seen.
        assert!(!c.has_seen("20000101000000.000000Z#000000#002#000000"));
        assert!(!c.has_seen("garbage"));
    }

    #[test]
    fn uuids_convert_between_text_and_bytes() {
        let t = "7dc0117a-76af-4211-9667-f2fa35a45213";
        let b = uuid_bytes(t).unwrap();
        assert_eq!(uuid_text(&b), t);
        assert_eq!(uuid_bytes(&t.to_uppercase()), Some(b));
        assert_eq!(uuid_bytes("xyz"), None);
    }
}
