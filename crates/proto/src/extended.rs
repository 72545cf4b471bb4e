//! Values of the extended operations the codec understands, and the Notice
//! of Disconnection.

use std::fmt;

use crate::ber::{self, tag, Reader};
use crate::message::{ExtendedResponse, LdapMessage, ProtocolOp};
use crate::{oid, DecodeError, LdapResult, ResultCode, MAX_INT};

/// RFC 3062 Password Modify request value. Debug is written by hand so the
/// passwords never reach logs.
#[derive(Clone, PartialEq, Default)]
pub struct PasswdModifyRequest {
    pub user_identity: Option<Vec<u8>>,
    pub old_password: Option<Vec<u8>>,
    pub new_password: Option<Vec<u8>>,
}

impl fmt::Debug for PasswdModifyRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |v: &Option<Vec<u8>>| v.as_ref().map(|_| format_args!("<redacted>"));
        f.debug_struct("PasswdModifyRequest")
            .field(
                "user_identity",
                &self
                    .user_identity
                    .as_ref()
                    .map(|u| String::from_utf8_lossy(u).into_owned()),
            )
            .field("old_password", &redact(&self.old_password))
            .field("new_password", &redact(&self.new_password))
            .finish()
    }
}

impl PasswdModifyRequest {
    // PasswdModifyRequestValue ::= SEQUENCE {
    //   userIdentity    [0]  OCTET STRING OPTIONAL
    //   oldPasswd       [1]  OCTET STRING OPTIONAL
    //   newPasswd       [2]  OCTET STRING OPTIONAL }
    //
    // The requestValue itself may be absent (RFC 3062 section 2); callers
    // then use `PasswdModifyRequest::default()`.
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("password modify request value")?;
        let user_identity = r.read_opt(0x80)?.map(<[u8]>::to_vec);
        let old_password = r.read_opt(0x81)?.map(<[u8]>::to_vec);
        let new_password = r.read_opt(0x82)?.map(<[u8]>::to_vec);
        r.skip_extensions()?;
        Ok(PasswdModifyRequest {
            user_identity,
            old_password,
            new_password,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        for (t, v) in [
            (0x80, &self.user_identity),
            (0x81, &self.old_password),
            (0x82, &self.new_password),
        ] {
            if let Some(v) = v {
                ber::write_tlv(&mut out, t, v);
            }
        }
        ber::end(&mut out, m);
        out
    }
}

// PasswdModifyResponseValue ::= SEQUENCE {
//   genPasswd       [0]     OCTET STRING OPTIONAL }
/// Encodes a Password Modify response value.
pub fn encode_passwd_modify_response(gen_password: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    let m = ber::begin(&mut out, tag::SEQUENCE);
    if let Some(p) = gen_password {
        ber::write_tlv(&mut out, 0x80, p);
    }
    ber::end(&mut out, m);
    out
}

/// RFC 3909 Cancel request value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelRequest {
    /// The message ID of the operation to cancel.
    pub id: i32,
}

impl CancelRequest {
    // cancelRequestValue ::= SEQUENCE {
    //     cancelID        MessageID
    //                     -- MessageID is as defined in [RFC2251]
    // }
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut outer = Reader::new(value);
        let mut r = outer.read_constructed(tag::SEQUENCE)?;
        outer.finish("cancel request value")?;
        let id = r.read_int_in(tag::INTEGER, 0, i64::from(MAX_INT), "cancelID")? as i32;
        r.skip_extensions()?;
        Ok(CancelRequest { id })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let m = ber::begin(&mut out, tag::SEQUENCE);
        ber::write_int(&mut out, tag::INTEGER, i64::from(self.id));
        ber::end(&mut out, m);
        out
    }
}

/// The complete Notice of Disconnection PDU (RFC 4511 4.4.1): an unsolicited
/// ExtendedResponse with message ID 0 and responseName
/// 1.3.6.1.4.1.1466.20036, sent just before the server closes the connection.
pub fn notice_of_disconnection(code: ResultCode, message: &str) -> Vec<u8> {
    LdapMessage {
        id: 0,
        op: ProtocolOp::ExtendedResponse(ExtendedResponse {
            result: LdapResult::new(code, message),
            name: Some(oid::NOTICE_OF_DISCONNECTION.to_owned()),
            value: None,
        }),
        controls: Vec::new(),
    }
    .to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeLimits;

    #[test]
    fn passwd_modify_round_trip() {
        for p in [
            PasswdModifyRequest::default(),
            PasswdModifyRequest {
                user_identity: Some(b"uid=a,dc=x".to_vec()),
                old_password: Some(b"old".to_vec()),
                new_password: Some(vec![0xff, 0x00]),
            },
            PasswdModifyRequest {
                user_identity: None,
                old_password: None,
                new_password: Some(b"n".to_vec()),
            },
        ] {
            assert_eq!(PasswdModifyRequest::decode(&p.encode()).unwrap(), p);
        }
        assert_eq!(PasswdModifyRequest::default().encode(), [0x30, 0x00]);
        // An element after newPasswd is an unknown trailing component
        // (RFC 4511 section 4 extensibility), not a late userIdentity.
        let p =
            PasswdModifyRequest::decode(&[0x30, 0x06, 0x82, 0x01, b'n', 0x80, 0x01, b'u']).unwrap();
        assert_eq!(p.user_identity, None);
        assert_eq!(p.new_password.as_deref(), Some(&b"n"[..]));
        assert!(PasswdModifyRequest::decode(&[0x30, 0x02, 0x82]).is_err());
        assert!(PasswdModifyRequest::decode(&[0x31, 0x00]).is_err());
    }

    #[test]
    fn passwd_modify_debug_redacts() {
        let p = PasswdModifyRequest {
            user_identity: Some(b"uid=a".to_vec()),
            old_password: Some(b"hunter2".to_vec()),
            new_password: Some(b"hunter3".to_vec()),
        };
        let s = format!("{p:?}");
        assert!(
            !s.contains("hunter") && s.contains("uid=a") && s.contains("<redacted>"),
            "{s}"
        );
    }

    #[test]
    fn passwd_modify_response() {
        assert_eq!(encode_passwd_modify_response(None), [0x30, 0x00]);
        assert_eq!(
            encode_passwd_modify_response(Some(b"pw")),
            [0x30, 0x04, 0x80, 0x02, b'p', b'w']
        );
    }

    #[test]
    fn cancel_round_trip() {
        let c = CancelRequest { id: 42 };
        assert_eq!(c.encode(), [0x30, 0x03, 0x02, 0x01, 42]);
        assert_eq!(CancelRequest::decode(&c.encode()).unwrap(), c);
        assert!(CancelRequest::decode(&[0x30, 0x03, 0x02, 0x01, 0xff]).is_err());
    }

    #[test]
    fn notice_of_disconnection_bytes() {
        let b = notice_of_disconnection(ResultCode::UNAVAILABLE, "shutting down");
        let m = LdapMessage::decode(&b, &DecodeLimits::default()).unwrap();
        assert_eq!(m.id, 0);
        let ProtocolOp::ExtendedResponse(r) = m.op else {
            panic!("{m:?}")
        };
        assert_eq!(r.result.code, ResultCode::UNAVAILABLE);
        assert_eq!(r.result.message, "shutting down");
        assert_eq!(r.name.as_deref(), Some("1.3.6.1.4.1.1466.20036"));
        assert_eq!(&b[..7], &[0x30, 0x31, 0x02, 0x01, 0x00, 0x78, 0x2c]);
    }
}
