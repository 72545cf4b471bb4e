//! The password policy as the operations consult it: binds, password
//! changes (modify, add, Password Modify) and failed binds forwarded by
//! replicas ask the configured policy (the ppolicy overlay) through
//! [`PasswordPolicy`](crate::seams::PasswordPolicy); a connection
//! restricted to changing its password (after a bind answered
//! changeAfterReset) is held to that here, for every operation.
//!
//! Must not name the overlay that implements the trait.

use pando_model::Dn;
use pando_proto::control_values::{encode_policy_response, PolicyError, PolicyWarning};
use pando_proto::{oid, Control, ProtocolOp, ResultCode};

use crate::error::{LdapError, OpResult};
use pando_access::Identity;

/// The value of a forwarded-failures request: `<account DN>\n<count>`.
pub fn failures_request(value: Option<&[u8]>) -> OpResult<(&str, usize)> {
    let malformed = || LdapError::protocol("the request value must be '<account DN>\\n<count>'");
    let text = value
        .and_then(|v| std::str::from_utf8(v).ok())
        .ok_or_else(malformed)?;
    let (dn, count) = text.split_once('\n').ok_or_else(malformed)?;
    let count: usize = count
        .trim()
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(malformed)?;
    Ok((dn, count))
}

/// The password policy response control.
pub fn response(warning: Option<PolicyWarning>, error: Option<PolicyError>) -> Control {
    Control {
        oid: oid::PASSWORD_POLICY.to_string(),
        critical: false,
        value: Some(encode_policy_response(warning, error)),
    }
}

/// `e`, with the response control saying `why` when the client asked.
pub fn refusal(code: ResultCode, msg: String, why: PolicyError, wants: bool) -> LdapError {
    let e = LdapError::new(code, msg);
    if wants {
        e.with_control(response(None, Some(why)))
    } else {
        e
    }
}

/// Whether a request may run on a connection restricted to changing its
/// password (after a bind answered changeAfterReset): bind, unbind,
/// abandon, StartTLS, WhoAmI, Password Modify, and a modify of the
/// account's own userPassword only.
pub fn allowed_while_restricted(who: &Identity, request: &ProtocolOp) -> bool {
    match request {
        ProtocolOp::BindRequest(_) | ProtocolOp::UnbindRequest | ProtocolOp::AbandonRequest(_) => {
            true
        }
        ProtocolOp::ExtendedRequest(x) => {
            [oid::START_TLS, oid::PASSWD_MODIFY, oid::WHOAMI].contains(&x.name.as_str())
        }
        ProtocolOp::ModifyRequest(m) => {
            let own = Dn::parse(&m.dn)
                .map(|d| d.to_string().eq_ignore_ascii_case(who.dn()))
                .unwrap_or(false)
                || m.dn.eq_ignore_ascii_case(who.dn());
            own && m
                .changes
                .iter()
                .all(|c| pando_model::desc::is_password(&c.attr.name))
        }
        _ => false,
    }
}

/// The refusal of a request on a restricted connection.
pub fn restricted(wants: bool) -> LdapError {
    refusal(
        ResultCode::INSUFFICIENT_ACCESS_RIGHTS,
        "Operations are restricted to bind/unbind/abandon/StartTLS/modify password".into(),
        PolicyError::ChangeAfterReset,
        wants,
    )
}
