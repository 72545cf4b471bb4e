//! Values of the request and response controls the server implements,
//! beyond paged results (in `controls`). Each decoder takes a control's
//! value bytes and is strict like the rest of the codec: exact tags,
//! range-checked integers, UTF-8 where the ASN.1 says LDAPString, trailing
//! bytes refused, unknown trailing SEQUENCE components skipped.

use crate::ber::{self, tag, Reader};
use crate::{DecodeError, DecodeLimits, Filter, MAX_INT};

/// Decode a filter standing alone as a control value (the assertion
/// control, RFC 4528: `controlValue ::= Filter`).
pub fn decode_assertion(value: &[u8], limits: &DecodeLimits) -> Result<Filter, DecodeError> {
    let mut r = Reader::new(value);
    let (t, body) = r.read_tlv()?;
    r.finish("assertion control value")?;
    Filter::decode(t, body, limits)
}

/// The pre-read and post-read request value (RFC 4527):
/// `AttributeSelection ::= SEQUENCE OF selector LDAPString`.
pub fn decode_attribute_selection(value: &[u8]) -> Result<Vec<String>, DecodeError> {
    let mut outer = Reader::new(value);
    let mut r = outer.read_constructed(tag::SEQUENCE)?;
    outer.finish("attribute selection")?;
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(
            r.read_str(tag::OCTET_STRING, "attribute selector")?
                .to_owned(),
        );
    }
    Ok(out)
}

/// Subentries (RFC 3672): `visibility BOOLEAN`.
pub fn decode_subentries(value: &[u8]) -> Result<bool, DecodeError> {
    let mut r = Reader::new(value);
    let v = r.read_bool(tag::BOOLEAN, "subentries visibility")?;
    r.finish("subentries control value")?;
    Ok(v)
}

/// One key of a server-side sort request (RFC 2891).
#[derive(Debug, Clone, PartialEq)]
pub struct SortKey {
    pub attr: String,
    pub ordering_rule: Option<String>,
    pub reverse: bool,
}

// SortKeyList ::= SEQUENCE OF SEQUENCE {
//          attributeType   AttributeDescription,
//          orderingRule    [0] MatchingRuleId OPTIONAL,
//          reverseOrder    [1] BOOLEAN DEFAULT FALSE }
//
// At most `limits.max_sort_keys` + 1 keys are decoded: a longer list comes
// back cut there, unread past it, so the caller can tell it is too long
// without holding every key (the PDU limit alone lets through ~150,000).
pub fn decode_sort_request(
    value: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<SortKey>, DecodeError> {
    let mut outer = Reader::new(value);
    let mut r = outer.read_constructed(tag::SEQUENCE)?;
    outer.finish("sort request")?;
    let mut keys = Vec::new();
    while !r.is_empty() && keys.len() <= limits.max_sort_keys {
        let mut k = r.read_constructed(tag::SEQUENCE)?;
        let attr = k.read_str(tag::OCTET_STRING, "sort attribute")?.to_owned();
        let ordering_rule = k.read_str_opt(0x80, "ordering rule")?.map(str::to_owned);
        let reverse = match k.read_opt(0x81)? {
            Some(b) => ber::decode_bool(b)?,
            None => false,
        };
        // SortKeyList is not extensible: anything else is malformed.
        k.finish("sort key")?;
        keys.push(SortKey {
            attr,
            ordering_rule,
            reverse,
        });
    }
    if keys.is_empty() {
        return Err(DecodeError::new("sort request with no keys"));
    }
    Ok(keys)
}

// SortResult ::= SEQUENCE {
//    sortResult  ENUMERATED { success (0), operationsError (1),
//                             timeLimitExceeded (3), strongAuthRequired (8),
//                             adminLimitExceeded (11), noSuchAttribute (16),
//                             inappropriateMatching (18),
//                             insufficientAccessRights (50), busy (51),
//                             unwillingToPerform (53), other (80) },
//    attributeType [0] AttributeDescription OPTIONAL }
pub fn encode_sort_response(code: u32, attr: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    let m = ber::begin(&mut out, tag::SEQUENCE);
    ber::write_int(&mut out, tag::ENUMERATED, i64::from(code));
    if let Some(a) = attr {
        ber::write_tlv(&mut out, 0x80, a.as_bytes());
    }
    ber::end(&mut out, m);
    out
}

/// Where a virtual list view request points (draft-ietf-ldapext-ldapv3-vlv-09).
#[derive(Debug, Clone, PartialEq)]
pub enum VlvTarget {
    /// 1-based offset into a list the client believes has `content_count`
    /// entries (0: unknown).
    ByOffset { offset: i32, content_count: i32 },
    /// The first entry whose sort key is at or after the value.
    GreaterOrEqual(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct VlvRequest {
    pub before: i32,
    pub after: i32,
    pub target: VlvTarget,
    pub context_id: Option<Vec<u8>>,
}

impl VlvRequest {
    // VirtualListViewRequest ::= SEQUENCE {
    //       beforeCount    INTEGER (0..maxInt),
    //       afterCount     INTEGER (0..maxInt),
    //       target       CHOICE {
    //                      byOffset        [0] SEQUENCE {
    //                           offset          INTEGER (1 .. maxInt),
    //                           contentCount    INTEGER (0 .. maxInt) },
    //                      greaterThanOrEqual [1] AssertionValue },
    //       contextID     OCTET STRING OPTIONAL }
    //
    // An offset of 0 is accepted (and treated as 1 by the server), as
    // OpenLDAP's clients send it for "the start".
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("virtual list view request")?;
        let max = i64::from(MAX_INT);
        let before = r.read_int_in(tag::INTEGER, 0, max, "beforeCount")? as i32;
        let after = r.read_int_in(tag::INTEGER, 0, max, "afterCount")? as i32;
        let target = match r.peek_tag() {
            Some(0xa0) => {
                let mut o = r.read_constructed(0xa0)?;
                let offset = o.read_int_in(tag::INTEGER, 0, max, "offset")? as i32;
                let content_count = o.read_int_in(tag::INTEGER, 0, max, "contentCount")? as i32;
                o.finish("byOffset")?;
                VlvTarget::ByOffset {
                    offset,
                    content_count,
                }
            }
            Some(0x81) => VlvTarget::GreaterOrEqual(r.read(0x81)?.to_vec()),
            _ => {
                return Err(DecodeError::new(
                    "virtual list view target missing or unknown",
                ))
            }
        };
        let context_id = r.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
        r.skip_extensions()?;
        Ok(VlvRequest {
            before,
            after,
            target,
            context_id,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        ber::write_int(&mut out, tag::INTEGER, i64::from(self.before));
        ber::write_int(&mut out, tag::INTEGER, i64::from(self.after));
        match &self.target {
            VlvTarget::ByOffset {
                offset,
                content_count,
            } => {
                let o = ber::begin(&mut out, 0xa0);
                ber::write_int(&mut out, tag::INTEGER, i64::from(*offset));
                ber::write_int(&mut out, tag::INTEGER, i64::from(*content_count));
                ber::end(&mut out, o);
            }
            VlvTarget::GreaterOrEqual(v) => ber::write_tlv(&mut out, 0x81, v),
        }
        if let Some(c) = &self.context_id {
            ber::write_tlv(&mut out, tag::OCTET_STRING, c);
        }
        ber::end(&mut out, m);
        out
    }
}

/// The virtual list view response.
#[derive(Debug, Clone, PartialEq)]
pub struct VlvResponse {
    pub target_position: i32,
    pub content_count: i32,
    /// success, operationsError, unwillingToPerform, insufficientAccessRights,
    /// busy, timeLimitExceeded, adminLimitExceeded, sortControlMissing (60),
    /// offsetRangeError (61), other.
    pub result: u32,
    pub context_id: Option<Vec<u8>>,
}

impl VlvResponse {
    // VirtualListViewResponse ::= SEQUENCE {
    //       targetPosition    INTEGER (0 .. maxInt),
    //       contentCount     INTEGER (0 .. maxInt),
    //       virtualListViewResult ENUMERATED { ... },
    //       contextID     OCTET STRING OPTIONAL }
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        ber::write_int(&mut out, tag::INTEGER, i64::from(self.target_position));
        ber::write_int(&mut out, tag::INTEGER, i64::from(self.content_count));
        ber::write_int(&mut out, tag::ENUMERATED, i64::from(self.result));
        if let Some(c) = &self.context_id {
            ber::write_tlv(&mut out, tag::OCTET_STRING, c);
        }
        ber::end(&mut out, m);
        out
    }

    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("virtual list view response")?;
        let max = i64::from(MAX_INT);
        let target_position = r.read_int_in(tag::INTEGER, 0, max, "targetPosition")? as i32;
        let content_count = r.read_int_in(tag::INTEGER, 0, max, "contentCount")? as i32;
        let result = r.read_int_in(tag::ENUMERATED, 0, max, "virtualListViewResult")? as u32;
        let context_id = r.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
        r.skip_extensions()?;
        Ok(VlvResponse {
            target_position,
            content_count,
            result,
            context_id,
        })
    }
}

/// Persistent search request (draft-ietf-ldapext-psearch-03).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PersistentSearch {
    /// A bit set of [`change_type`] values.
    pub change_types: u8,
    pub changes_only: bool,
    pub return_ecs: bool,
}

/// Change types of the persistent search and entry change notification.
pub mod change_type {
    pub const ADD: u8 = 1;
    pub const DELETE: u8 = 2;
    pub const MODIFY: u8 = 4;
    pub const MOD_DN: u8 = 8;
    pub const ALL: u8 = ADD | DELETE | MODIFY | MOD_DN;
}

impl PersistentSearch {
    // PersistentSearch ::= SEQUENCE {
    //         changeTypes INTEGER,
    //         changesOnly BOOLEAN,
    //         returnECs BOOLEAN }
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("persistent search")?;
        let types = r.read_int_in(tag::INTEGER, 1, i64::from(change_type::ALL), "changeTypes")?;
        let changes_only = r.read_bool(tag::BOOLEAN, "changesOnly")?;
        let return_ecs = r.read_bool(tag::BOOLEAN, "returnECs")?;
        r.skip_extensions()?;
        Ok(PersistentSearch {
            change_types: types as u8,
            changes_only,
            return_ecs,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        ber::write_int(&mut out, tag::INTEGER, i64::from(self.change_types));
        ber::write_bool(&mut out, tag::BOOLEAN, self.changes_only);
        ber::write_bool(&mut out, tag::BOOLEAN, self.return_ecs);
        ber::end(&mut out, m);
        out
    }
}

// EntryChangeNotification ::= SEQUENCE {
//         changeType ENUMERATED { add (1), delete (2), modify (4), modDN (8) },
//         previousDN   LDAPDN OPTIONAL,     -- modifyDN ops. only
//         changeNumber INTEGER OPTIONAL }   -- if supported
pub fn encode_entry_change(change: u8, previous_dn: Option<&str>, number: Option<i64>) -> Vec<u8> {
    let mut out = Vec::new();
    let m = ber::begin(&mut out, tag::SEQUENCE);
    ber::write_int(&mut out, tag::ENUMERATED, i64::from(change));
    if let Some(dn) = previous_dn {
        ber::write_tlv(&mut out, tag::OCTET_STRING, dn.as_bytes());
    }
    if let Some(n) = number {
        ber::write_int(&mut out, tag::INTEGER, n);
    }
    ber::end(&mut out, m);
    out
}

/// One item of a matched values filter (RFC 3876): a filter with no
/// and/or/not.
pub type ValuesReturnFilter = Vec<Filter>;

// ValuesReturnFilter ::= SEQUENCE OF SimpleFilterItem
//
// SimpleFilterItem ::= CHOICE {
//      equalityMatch   [3] AttributeValueAssertion,
//      substrings      [4] SubstringFilter,
//      greaterOrEqual  [5] AttributeValueAssertion,
//      lessOrEqual     [6] AttributeValueAssertion,
//      present         [7] AttributeDescription,
//      approxMatch     [8] AttributeValueAssertion,
//      extensibleMatch [9] SimpleMatchingAssertion }
pub fn decode_matched_values(
    value: &[u8],
    limits: &DecodeLimits,
) -> Result<ValuesReturnFilter, DecodeError> {
    let mut outer = Reader::new(value);
    let mut r = outer.read_constructed(tag::SEQUENCE)?;
    outer.finish("matched values filter")?;
    let mut items = Vec::new();
    while !r.is_empty() {
        let (t, body) = r.read_tlv()?;
        // and, or, not are not simple items.
        if matches!(t, 0xa0..=0xa2) {
            return Err(DecodeError::new(
                "matched values filter items cannot be and, or or not",
            ));
        }
        let item = Filter::decode(t, body, limits)?;
        // SimpleMatchingAssertion has no dnAttributes.
        if matches!(&item, Filter::Extensible(m) if m.dn_attributes) {
            return Err(DecodeError::new(
                "matched values extensible items cannot use dnAttributes",
            ));
        }
        items.push(item);
        if items.len() > limits.max_filter_terms {
            return Err(DecodeError::new("matched values filter has too many items"));
        }
    }
    if items.is_empty() {
        return Err(DecodeError::new("matched values filter with no items"));
    }
    Ok(items)
}

/// OpenLDAP's value sorting control value: `SEQUENCE { BOOLEAN }`.
pub fn decode_valsort(value: &[u8]) -> Result<bool, DecodeError> {
    let mut outer = Reader::new(value);
    let mut r = outer.read_constructed(tag::SEQUENCE)?;
    outer.finish("value sorting control")?;
    let b = ber::decode_bool(r.read(tag::BOOLEAN)?)?;
    r.finish("value sorting control")?;
    Ok(b)
}

/// The warning of a password policy response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyWarning {
    /// Seconds until the password expires.
    TimeBeforeExpiration(u32),
    /// Binds still allowed with the expired password.
    GraceAuthNsRemaining(u32),
}

/// The errors of a password policy response (draft-behera-ldap-password-
/// policy-10 6.2), by their ENUMERATED values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyError {
    PasswordExpired = 0,
    AccountLocked = 1,
    ChangeAfterReset = 2,
    PasswordModNotAllowed = 3,
    MustSupplyOldPassword = 4,
    InsufficientPasswordQuality = 5,
    PasswordTooShort = 6,
    PasswordTooYoung = 7,
    PasswordInHistory = 8,
    PasswordTooLong = 9,
}

// PasswordPolicyResponseValue ::= SEQUENCE {
//    warning [0] CHOICE {
//       timeBeforeExpiration [0] INTEGER (0 .. maxInt),
//       graceAuthNsRemaining [1] INTEGER (0 .. maxInt) } OPTIONAL,
//    error   [1] ENUMERATED { … } OPTIONAL }
pub fn encode_policy_response(
    warning: Option<PolicyWarning>,
    error: Option<PolicyError>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let m = ber::begin(&mut out, tag::SEQUENCE);
    if let Some(w) = warning {
        let c = ber::begin(&mut out, 0xa0);
        match w {
            PolicyWarning::TimeBeforeExpiration(s) => ber::write_int(&mut out, 0x80, i64::from(s)),
            PolicyWarning::GraceAuthNsRemaining(n) => ber::write_int(&mut out, 0x81, i64::from(n)),
        }
        ber::end(&mut out, c);
    }
    if let Some(e) = error {
        ber::write_int(&mut out, 0x81, e as i64);
    }
    ber::end(&mut out, m);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(items: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        for i in items {
            out.extend_from_slice(i);
        }
        ber::end(&mut out, m);
        out
    }

    #[test]
    fn assertion_is_one_filter() {
        let f = Filter::parse("(&(cn=a)(sn=b))").unwrap();
        let mut v = Vec::new();
        f.encode(&mut v);
        assert_eq!(decode_assertion(&v, &DecodeLimits::default()).unwrap(), f);
        v.push(0);
        assert!(decode_assertion(&v, &DecodeLimits::default()).is_err());
        assert!(decode_assertion(&[], &DecodeLimits::default()).is_err());
    }

    #[test]
    fn attribute_selection() {
        let v = seq(&[b"\x04\x02cn", b"\x04\x01*"]);
        assert_eq!(decode_attribute_selection(&v).unwrap(), ["cn", "*"]);
        assert_eq!(
            decode_attribute_selection(&seq(&[])).unwrap(),
            Vec::<String>::new()
        );
        assert!(decode_attribute_selection(&seq(&[b"\x04\x01\xff"])).is_err());
        assert!(decode_attribute_selection(&seq(&[b"\x02\x01\x01"])).is_err());
    }

    #[test]
    fn sort_request_keys() {
        let v = seq(&[
            &seq(&[b"\x04\x02sn", b"\x80\x0fcaseIgnoreMatch", b"\x81\x01\xff"]),
            &seq(&[b"\x04\x02cn"]),
        ]);
        let keys = decode_sort_request(&v, &DecodeLimits::default()).unwrap();
        assert_eq!(
            keys,
            [
                SortKey {
                    attr: "sn".into(),
                    ordering_rule: Some("caseIgnoreMatch".into()),
                    reverse: true
                },
                SortKey {
                    attr: "cn".into(),
                    ordering_rule: None,
                    reverse: false
                }
            ]
        );
        assert!(decode_sort_request(&seq(&[]), &DecodeLimits::default()).is_err());
        // A long list is read no further than one key past the limit.
        let one = seq(&[b"\x04\x02cn"]);
        let many: Vec<&[u8]> = std::iter::repeat_n(one.as_slice(), 1000).collect();
        let two = DecodeLimits {
            max_sort_keys: 2,
            ..DecodeLimits::default()
        };
        assert_eq!(decode_sort_request(&seq(&many), &two).unwrap().len(), 3);
        assert_eq!(
            encode_sort_response(16, Some("sn")),
            [0x30, 0x07, 0x0a, 0x01, 0x10, 0x80, 0x02, b's', b'n']
        );
    }

    #[test]
    fn vlv_round_trips() {
        for target in [
            VlvTarget::ByOffset {
                offset: 50_000,
                content_count: 0,
            },
            VlvTarget::GreaterOrEqual(b"smith".to_vec()),
        ] {
            let req = VlvRequest {
                before: 2,
                after: 10,
                target,
                context_id: Some(vec![1, 2]),
            };
            assert_eq!(VlvRequest::decode(&req.encode()).unwrap(), req);
        }
        let resp = VlvResponse {
            target_position: 7,
            content_count: 100,
            result: 0,
            context_id: None,
        };
        assert_eq!(VlvResponse::decode(&resp.encode()).unwrap(), resp);
        // Negative counts and a missing target are refused.
        assert!(
            VlvRequest::decode(&seq(&[b"\x02\x01\xff", b"\x02\x01\x01", b"\x81\x00"])).is_err()
        );
        assert!(VlvRequest::decode(&seq(&[b"\x02\x01\x00", b"\x02\x01\x01"])).is_err());
    }

    #[test]
    fn persistent_search_and_entry_change() {
        let p = PersistentSearch {
            change_types: change_type::ALL,
            changes_only: true,
            return_ecs: true,
        };
        assert_eq!(PersistentSearch::decode(&p.encode()).unwrap(), p);
        assert!(PersistentSearch::decode(&seq(&[
            b"\x02\x01\x00",
            b"\x01\x01\x00",
            b"\x01\x01\x00"
        ]))
        .is_err());
        assert!(PersistentSearch::decode(&seq(&[
            b"\x02\x01\x10",
            b"\x01\x01\x00",
            b"\x01\x01\x00"
        ]))
        .is_err());
        assert_eq!(
            encode_entry_change(change_type::MOD_DN, Some("cn=a"), None),
            [0x30, 0x09, 0x0a, 0x01, 0x08, 0x04, 0x04, b'c', b'n', b'=', b'a']
        );
    }

    #[test]
    fn matched_values_items() {
        let mut eq = Vec::new();
        Filter::parse("(mail=a@b)").unwrap().encode(&mut eq);
        let mut pres = Vec::new();
        Filter::parse("(cn=*)").unwrap().encode(&mut pres);
        let v = seq(&[&eq, &pres]);
        assert_eq!(
            decode_matched_values(&v, &DecodeLimits::default())
                .unwrap()
                .len(),
            2
        );
        let mut and = Vec::new();
        Filter::parse("(&(cn=a))").unwrap().encode(&mut and);
        assert!(decode_matched_values(&seq(&[&and]), &DecodeLimits::default()).is_err());
        assert!(decode_matched_values(&seq(&[]), &DecodeLimits::default()).is_err());
    }

    #[test]
    fn subentries_visibility() {
        assert!(decode_subentries(b"\x01\x01\xff").unwrap());
        assert!(!decode_subentries(b"\x01\x01\x00").unwrap());
        assert!(decode_subentries(b"\x01\x01\x00\x00").is_err());
    }
}

#[cfg(test)]
mod valsort_tests {
    #[test]
    fn valsort_value_is_a_sequence_of_one_boolean() {
        assert!(super::decode_valsort(&[0x30, 0x03, 0x01, 0x01, 0xff]).unwrap());
        assert!(!super::decode_valsort(&[0x30, 0x03, 0x01, 0x01, 0x00]).unwrap());
        assert!(super::decode_valsort(&[0x30, 0x00]).is_err());
        assert!(super::decode_valsort(&[0x01, 0x01, 0xff]).is_err());
    }
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    #[test]
    fn policy_responses_encode_as_the_draft_says() {
        assert_eq!(encode_policy_response(None, None), [0x30, 0x00]);
        assert_eq!(
            encode_policy_response(None, Some(PolicyError::AccountLocked)),
            [0x30, 0x03, 0x81, 0x01, 0x01]
        );
        assert_eq!(
            encode_policy_response(Some(PolicyWarning::GraceAuthNsRemaining(2)), None),
            [0x30, 0x05, 0xa0, 0x03, 0x81, 0x01, 0x02]
        );
        assert_eq!(
            encode_policy_response(
                Some(PolicyWarning::TimeBeforeExpiration(300)),
                Some(PolicyError::ChangeAfterReset)
            ),
            [0x30, 0x09, 0xa0, 0x04, 0x80, 0x02, 0x01, 0x2c, 0x81, 0x01, 0x02]
        );
    }
}
