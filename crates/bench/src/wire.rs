//! Reading just the envelope of a response on the hot path.
//!
//! A load generator only needs the message ID, which response it is, the
//! result code, and (for authrate) the DN of an entry; decoding every
//! attribute of every entry would spend the CPU the server should get. This
//! reads those fields with pando-proto's zero-copy BER reader and skips the
//! rest. Errors (rare) are then decoded in full with
//! [`LdapMessage::decode`] to show the server's diagnostic message.
//!
//! ```text
//! LDAPMessage ::= SEQUENCE {
//!      messageID       MessageID,
//!      protocolOp      CHOICE { ..., searchResEntry, searchResDone, ... },
//!      controls       [0] Controls OPTIONAL }
//! SearchResultEntry ::= [APPLICATION 4] SEQUENCE {
//!      objectName      LDAPDN,
//!      attributes      PartialAttributeList }
//! LDAPResult ::= SEQUENCE {
//!      resultCode         ENUMERATED { ... },
//!      matchedDN          LDAPDN,
//!      diagnosticMessage  LDAPString,
//!      referral           [3] Referral OPTIONAL }
//! ```

use pando_proto::ber::{decode_int, tag, Reader};
use pando_proto::{op_tag, DecodeLimits, LdapMessage, ProtocolOp};

/// The fields of a response a load generator looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub msg_id: i32,
    /// The protocolOp's application identifier byte (see [`op_tag`]).
    pub op: u8,
    /// The resultCode of responses that carry an LDAPResult.
    pub code: Option<u32>,
    /// objectName of a SearchResultEntry (empty for other responses).
    pub dn: &'a [u8],
}

/// Whether responses with this identifier start with an LDAPResult.
pub fn carries_result(op: u8) -> bool {
    matches!(
        op,
        op_tag::BIND_RESPONSE
            | op_tag::SEARCH_RESULT_DONE
            | op_tag::MODIFY_RESPONSE
            | op_tag::ADD_RESPONSE
            | op_tag::DEL_RESPONSE
            | op_tag::MODIFY_DN_RESPONSE
            | op_tag::COMPARE_RESPONSE
            | op_tag::EXTENDED_RESPONSE
    )
}

/// Reads the envelope of one whole frame (as delimited by
/// [`pando_proto::frame_length`]).
pub fn envelope(frame: &[u8]) -> Result<Envelope<'_>, String> {
    let mut outer = Reader::new(frame);
    let body = outer
        .read(tag::SEQUENCE)
        .map_err(|e| format!("malformed response: {e}"))?;
    let mut r = Reader::new(body);
    let id = r
        .read(tag::INTEGER)
        .and_then(decode_int)
        .map_err(|e| format!("malformed response messageID: {e}"))?;
    let msg_id = i32::try_from(id)
        .ok()
        .filter(|v| *v >= 0)
        .ok_or_else(|| format!("response messageID {id} out of range"))?;
    let (op, contents) = r
        .read_tlv()
        .map_err(|e| format!("malformed response protocolOp: {e}"))?;
    let mut c = Reader::new(contents);
    let mut env = Envelope {
        msg_id,
        op,
        code: None,
        dn: &[],
    };
    if carries_result(op) {
        let code = c
            .read(tag::ENUMERATED)
            .and_then(decode_int)
            .map_err(|e| format!("malformed resultCode in response 0x{op:02x}: {e}"))?;
        env.code =
            Some(u32::try_from(code).map_err(|_| format!("resultCode {code} out of range"))?);
    } else if op == op_tag::SEARCH_RESULT_ENTRY {
        env.dn = c
            .read(tag::OCTET_STRING)
            .map_err(|e| format!("malformed SearchResultEntry objectName: {e}"))?;
    }
    Ok(env)
}

/// "diagnostic message" of an LDAPResult-bearing response, decoded in full
/// (slow path: only for errors that are shown to the user). Empty when the
/// server sent none or the frame does not decode.
pub fn diagnostic(frame: &[u8]) -> String {
    let Ok(m) = LdapMessage::decode(frame, &DecodeLimits::default()) else {
        return String::new();
    };
    match m.op {
        ProtocolOp::BindResponse(b) => b.result.message,
        ProtocolOp::ExtendedResponse(e) => e.result.message,
        ProtocolOp::SearchResultDone(r)
        | ProtocolOp::ModifyResponse(r)
        | ProtocolOp::AddResponse(r)
        | ProtocolOp::DelResponse(r)
        | ProtocolOp::ModifyDnResponse(r)
        | ProtocolOp::CompareResponse(r) => r.message,
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::{
        BindResponse, ExtendedResponse, LdapResult, PartialAttribute, ResultCode, SearchResultEntry,
    };

    fn frame(id: i32, op: ProtocolOp) -> Vec<u8> {
        LdapMessage {
            id,
            op,
            controls: vec![],
        }
        .to_bytes()
    }

    #[test]
    fn result_responses() {
        let r =
            LdapResult::new(ResultCode::NO_SUCH_OBJECT, "no such entry").with_matched_dn("dc=x");
        for (op, tag) in [
            (
                ProtocolOp::SearchResultDone(r.clone()),
                op_tag::SEARCH_RESULT_DONE,
            ),
            (
                ProtocolOp::ModifyResponse(r.clone()),
                op_tag::MODIFY_RESPONSE,
            ),
            (ProtocolOp::AddResponse(r.clone()), op_tag::ADD_RESPONSE),
            (ProtocolOp::DelResponse(r.clone()), op_tag::DEL_RESPONSE),
            (
                ProtocolOp::BindResponse(BindResponse {
                    result: r.clone(),
                    server_sasl_creds: None,
                }),
                op_tag::BIND_RESPONSE,
            ),
        ] {
            for id in [1, 127, 128, 65_536, i32::MAX] {
                let f = frame(id, op.clone());
                let e = envelope(&f).unwrap();
                assert_eq!(
                    e,
                    Envelope {
                        msg_id: id,
                        op: tag,
                        code: Some(32),
                        dn: b""
                    }
                );
                assert_eq!(diagnostic(&f), "no such entry");
            }
        }
        let ok = frame(5, ProtocolOp::SearchResultDone(LdapResult::success()));
        assert_eq!(envelope(&ok).unwrap().code, Some(0));
    }

    #[test]
    fn entries_give_their_dn() {
        let long_dn = format!("uid={},ou=People,dc=example,dc=com", "u".repeat(300));
        let f = frame(
            9,
            ProtocolOp::SearchResultEntry(SearchResultEntry {
                dn: long_dn.clone(),
                attrs: vec![PartialAttribute {
                    name: "cn".into(),
                    values: vec![b"x".to_vec(); 50],
                }],
            }),
        );
        let e = envelope(&f).unwrap();
        assert_eq!(
            (e.msg_id, e.op, e.code),
            (9, op_tag::SEARCH_RESULT_ENTRY, None)
        );
        assert_eq!(e.dn, long_dn.as_bytes());
        let r = frame(
            9,
            ProtocolOp::SearchResultReference(vec!["ldap://x/".into()]),
        );
        let e = envelope(&r).unwrap();
        assert_eq!(
            (e.op, e.code, e.dn),
            (op_tag::SEARCH_RESULT_REFERENCE, None, &b""[..])
        );
    }

    #[test]
    fn notice_of_disconnection() {
        let f = frame(
            0,
            ProtocolOp::ExtendedResponse(ExtendedResponse {
                result: LdapResult::new(ResultCode::UNAVAILABLE, "shutting down"),
                name: Some("1.3.6.1.4.1.1466.20036".into()),
                value: None,
            }),
        );
        let e = envelope(&f).unwrap();
        assert_eq!(
            (e.msg_id, e.op, e.code),
            (0, op_tag::EXTENDED_RESPONSE, Some(52))
        );
        assert_eq!(diagnostic(&f), "shutting down");
    }

    #[test]
    fn hand_written_bytes_and_garbage() {
        // 30 0c 02 01 07 65 07 0a 01 31 04 00 04 00: SearchResultDone, id 7, code 49.
        let f = [
            0x30, 0x0c, 0x02, 0x01, 0x07, 0x65, 0x07, 0x0a, 0x01, 0x31, 0x04, 0x00, 0x04, 0x00,
        ];
        assert_eq!(
            envelope(&f).unwrap(),
            Envelope {
                msg_id: 7,
                op: 0x65,
                code: Some(49),
                dn: b""
            }
        );
        // Truncated, wrong outer tag, missing result code, negative ID.
        assert!(envelope(&f[..8]).is_err());
        assert!(envelope(&[0x31, 0x03, 0x02, 0x01, 0x01]).is_err());
        let e = envelope(&[0x30, 0x05, 0x02, 0x01, 0x01, 0x65, 0x00]).unwrap_err();
        assert!(e.contains("resultCode"), "{e}");
        let e = envelope(&[0x30, 0x05, 0x02, 0x01, 0xff, 0x42, 0x00]).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        assert!(envelope(&[]).is_err());
        assert_eq!(diagnostic(&[0x30, 0x00]), "");
    }
}
