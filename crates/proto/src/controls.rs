//! Controls (RFC 4511 section 4.1.11), well-known OIDs, and the values of
//! the controls the codec understands. Unknown controls stay raw bytes: the
//! operations layer decides, by criticality, whether to refuse them.

use crate::ber::{self, tag, Reader};
use crate::{DecodeError, MAX_INT};

/// Object identifiers of the controls, extended operations and features
/// Pando deals with.
pub mod oid {
    // Controls.
    /// RFC 2696 Simple Paged Results.
    pub const PAGED_RESULTS: &str = "1.2.840.113556.1.4.319";
    /// RFC 3296 ManageDsaIT.
    pub const MANAGE_DSA_IT: &str = "2.16.840.1.113730.3.4.2";
    /// RFC 4370 Proxied Authorization v2.
    pub const PROXIED_AUTHZ: &str = "2.16.840.1.113730.3.4.18";
    /// RFC 4528 Assertion.
    pub const ASSERTION: &str = "1.3.6.1.1.12";
    /// RFC 4527 Read Entry controls.
    pub const PRE_READ: &str = "1.3.6.1.1.13.1";
    pub const POST_READ: &str = "1.3.6.1.1.13.2";
    /// RFC 2891 Server Side Sorting.
    pub const SORT_REQUEST: &str = "1.2.840.113556.1.4.473";
    pub const SORT_RESPONSE: &str = "1.2.840.113556.1.4.474";
    /// RFC 3672 Subentries.
    pub const SUBENTRIES: &str = "1.3.6.1.4.1.4203.1.10.1";
    /// Permissive Modify (Active Directory, also OpenLDAP).
    pub const PERMISSIVE_MODIFY: &str = "1.2.840.113556.1.4.1413";
    /// RFC 6171 Don't Use Copy.
    pub const DONT_USE_COPY: &str = "1.3.6.1.1.22";
    /// Virtual list view (draft-ietf-ldapext-ldapv3-vlv-09).
    pub const VLV_REQUEST: &str = "2.16.840.1.113730.3.4.9";
    pub const VLV_RESPONSE: &str = "2.16.840.1.113730.3.4.10";
    /// RFC 3876 Matched Values.
    pub const MATCHED_VALUES: &str = "1.2.826.0.1.3344810.2.3";
    /// Tree Delete (Active Directory, also OpenLDAP).
    pub const TREE_DELETE: &str = "1.2.840.113556.1.4.805";
    /// Relax Rules (draft-zeilenga-ldap-relax).
    pub const RELAX: &str = "1.3.6.1.4.1.4203.666.5.12";
    /// Password policy request and response
    /// (draft-behera-ldap-password-policy-10).
    pub const PASSWORD_POLICY: &str = "1.3.6.1.4.1.42.2.27.8.5.1";
    /// OpenLDAP's value sorting control: weighted values keep their
    /// weights in search results when its boolean is TRUE.
    pub const VALSORT: &str = "1.3.6.1.4.1.4203.666.5.14";
    /// No-Op: the OID OpenLDAP 2.5's tools and slapd use, and the one
    /// draft-zeilenga-ldap-noop-01 assigned (older clients).
    pub const NO_OP: &str = "1.3.6.1.4.1.4203.666.5.2";
    pub const NO_OP_DRAFT: &str = "1.3.6.1.4.1.4203.1.10.2";
    /// Persistent search and entry change notification
    /// (draft-ietf-ldapext-psearch-03).
    pub const PERSISTENT_SEARCH: &str = "2.16.840.1.113730.3.4.3";
    pub const ENTRY_CHANGE: &str = "2.16.840.1.113730.3.4.7";
    /// RFC 4533 Content Synchronization.
    pub const SYNC_REQUEST: &str = "1.3.6.1.4.1.4203.1.9.1.1";
    pub const SYNC_STATE: &str = "1.3.6.1.4.1.4203.1.9.1.2";
    pub const SYNC_DONE: &str = "1.3.6.1.4.1.4203.1.9.1.3";
    pub const SYNC_INFO: &str = "1.3.6.1.4.1.4203.1.9.1.4";

    // Extended operations.
    /// RFC 4532 Who am I?
    pub const WHOAMI: &str = "1.3.6.1.4.1.4203.1.11.3";
    /// RFC 3062 Password Modify.
    pub const PASSWD_MODIFY: &str = "1.3.6.1.4.1.4203.1.11.1";
    /// RFC 4511 4.14 StartTLS.
    pub const START_TLS: &str = "1.3.6.1.4.1.1466.20037";
    /// RFC 4511 4.4.1 Notice of Disconnection (unsolicited).
    pub const NOTICE_OF_DISCONNECTION: &str = "1.3.6.1.4.1.1466.20036";
    /// RFC 3909 Cancel.
    pub const CANCEL: &str = "1.3.6.1.1.8";

    // Features (supportedFeatures).
    /// RFC 3673 all operational attributes ("+").
    pub const FEATURE_ALL_OP_ATTRS: &str = "1.3.6.1.4.1.4203.1.5.1";
    /// RFC 4529 requesting attributes by object class ("@class").
    pub const FEATURE_OC_ATTRS: &str = "1.3.6.1.4.1.4203.1.5.2";
    /// RFC 4526 absolute true and false filters.
    pub const FEATURE_TRUE_FALSE_FILTERS: &str = "1.3.6.1.4.1.4203.1.5.3";
    /// RFC 4525 modify-increment.
    pub const FEATURE_MODIFY_INCREMENT: &str = "1.3.6.1.1.14";
}

/// A control as sent: the value is kept raw.
#[derive(Debug, Clone, PartialEq)]
pub struct Control {
    pub oid: String,
    pub critical: bool,
    pub value: Option<Vec<u8>>,
}

// Controls ::= SEQUENCE OF control Control
//
// Control ::= SEQUENCE {
//      controlType             LDAPOID,
//      criticality             BOOLEAN DEFAULT FALSE,
//      controlValue            OCTET STRING OPTIONAL }
//
// `body` is the contents of the [0] Controls element.
pub(crate) fn decode_controls(body: &[u8]) -> Result<Vec<Control>, DecodeError> {
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    while !r.is_empty() {
        let mut c = r.read_constructed(tag::SEQUENCE)?;
        let oid = c.read_str(tag::OCTET_STRING, "controlType")?.to_owned();
        let critical = match c.read_opt(tag::BOOLEAN)? {
            Some(b) => ber::decode_bool(b)?,
            None => false,
        };
        let value = c.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
        c.skip_extensions()?;
        out.push(Control {
            oid,
            critical,
            value,
        });
    }
    Ok(out)
}

/// Appends `[0] Controls` unless `controls` is empty (the field is OPTIONAL).
pub(crate) fn encode_controls(out: &mut Vec<u8>, controls: &[Control]) {
    if controls.is_empty() {
        return;
    }
    let m = ber::begin(out, 0xa0);
    for c in controls {
        let s = ber::begin(out, tag::SEQUENCE);
        ber::write_tlv(out, tag::OCTET_STRING, c.oid.as_bytes());
        // DEFAULT FALSE: omitted when false, as DER requires.
        if c.critical {
            ber::write_bool(out, tag::BOOLEAN, true);
        }
        if let Some(v) = &c.value {
            ber::write_tlv(out, tag::OCTET_STRING, v);
        }
        ber::end(out, s);
    }
    ber::end(out, m);
}

/// RFC 2696 Simple Paged Results control value (request and response).
#[derive(Debug, Clone, PartialEq)]
pub struct PagedResults {
    /// Requested page size (request) or estimated total (response);
    /// 0..=MAX_INT.
    pub size: i32,
    /// Opaque server cookie; empty on the first request and the last response.
    pub cookie: Vec<u8>,
}

impl PagedResults {
    // realSearchControlValue ::= SEQUENCE {
    //         size            INTEGER (0..maxInt),
    //                                 -- requested page size from client
    //                                 -- result set size estimate from server
    //         cookie          OCTET STRING
    // }
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("paged results control value")?;
        let size = r.read_int_in(tag::INTEGER, 0, i64::from(MAX_INT), "page size")? as i32;
        let cookie = r.read(tag::OCTET_STRING)?.to_vec();
        r.skip_extensions()?;
        Ok(PagedResults { size, cookie })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        ber::write_int(&mut out, tag::INTEGER, i64::from(self.size));
        ber::write_tlv(&mut out, tag::OCTET_STRING, &self.cookie);
        ber::end(&mut out, m);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_round_trip_and_bytes() {
        let p = PagedResults {
            size: 500,
            cookie: vec![],
        };
        let b = p.encode();
        assert_eq!(b, [0x30, 0x06, 0x02, 0x02, 0x01, 0xf4, 0x04, 0x00]);
        assert_eq!(PagedResults::decode(&b).unwrap(), p);
        let p = PagedResults {
            size: 0,
            cookie: vec![0xde, 0xad],
        };
        assert_eq!(PagedResults::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn paged_rejections() {
        assert!(PagedResults::decode(&[]).is_err());
        assert!(PagedResults::decode(&[0x30, 0x03, 0x02, 0x01, 0xff]).is_err()); // negative, no cookie
        assert!(PagedResults::decode(&[0x30, 0x05, 0x02, 0x01, 0xff, 0x04, 0x00]).is_err());
        assert!(PagedResults::decode(&[0x30, 0x05, 0x02, 0x01, 0x05, 0x04, 0x00, 0x00]).is_err());
    }

    #[test]
    fn controls_round_trip_and_defaults() {
        let cs = vec![
            Control {
                oid: oid::MANAGE_DSA_IT.into(),
                critical: false,
                value: None,
            },
            Control {
                oid: "1.2.3".into(),
                critical: true,
                value: Some(vec![1, 2, 3]),
            },
        ];
        let mut out = Vec::new();
        encode_controls(&mut out, &cs);
        let mut r = Reader::new(&out);
        let body = r.read(0xa0).unwrap();
        assert_eq!(decode_controls(body).unwrap(), cs);
        // Explicit criticality FALSE is accepted.
        let body = [0x30, 0x08, 0x04, 0x03, b'1', b'.', b'2', 0x01, 0x01, 0x00];
        assert!(!decode_controls(&body).unwrap()[0].critical);
        // Two-byte BOOLEAN is not.
        let body = [
            0x30, 0x09, 0x04, 0x03, b'1', b'.', b'2', 0x01, 0x02, 0x00, 0x00,
        ];
        assert!(decode_controls(&body).is_err());
    }
}
