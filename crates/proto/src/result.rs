//! Result codes and LDAPResult (RFC 4511 section 4.1.9 and appendix A).

use std::fmt;

use crate::ber::{self, tag, Reader};
use crate::{DecodeError, MAX_INT};

/// An LDAP resultCode. RFC 4511 makes the enumeration extensible, so any
/// value in 0..=maxInt is representable; the constants name the ones Pando
/// knows.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResultCode(pub u32);

macro_rules! result_codes {
    ($($name:ident = $value:expr, $text:expr;)*) => {
        impl ResultCode {
            $(pub const $name: ResultCode = ResultCode($value);)*

            /// The RFC 4511 name, e.g. "noSuchObject"; "unknown" for codes
            /// this crate does not know.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $($value => $text,)*
                    _ => "unknown",
                }
            }
        }
    };
}

result_codes! {
    SUCCESS = 0, "success";
    OPERATIONS_ERROR = 1, "operationsError";
    PROTOCOL_ERROR = 2, "protocolError";
    TIME_LIMIT_EXCEEDED = 3, "timeLimitExceeded";
    SIZE_LIMIT_EXCEEDED = 4, "sizeLimitExceeded";
    COMPARE_FALSE = 5, "compareFalse";
    COMPARE_TRUE = 6, "compareTrue";
    AUTH_METHOD_NOT_SUPPORTED = 7, "authMethodNotSupported";
    STRONGER_AUTH_REQUIRED = 8, "strongerAuthRequired";
    REFERRAL = 10, "referral";
    ADMIN_LIMIT_EXCEEDED = 11, "adminLimitExceeded";
    UNAVAILABLE_CRITICAL_EXTENSION = 12, "unavailableCriticalExtension";
    CONFIDENTIALITY_REQUIRED = 13, "confidentialityRequired";
    SASL_BIND_IN_PROGRESS = 14, "saslBindInProgress";
    NO_SUCH_ATTRIBUTE = 16, "noSuchAttribute";
    UNDEFINED_ATTRIBUTE_TYPE = 17, "undefinedAttributeType";
    INAPPROPRIATE_MATCHING = 18, "inappropriateMatching";
    CONSTRAINT_VIOLATION = 19, "constraintViolation";
    ATTRIBUTE_OR_VALUE_EXISTS = 20, "attributeOrValueExists";
    INVALID_ATTRIBUTE_SYNTAX = 21, "invalidAttributeSyntax";
    NO_SUCH_OBJECT = 32, "noSuchObject";
    ALIAS_PROBLEM = 33, "aliasProblem";
    INVALID_DN_SYNTAX = 34, "invalidDNSyntax";
    ALIAS_DEREFERENCING_PROBLEM = 36, "aliasDereferencingProblem";
    INAPPROPRIATE_AUTHENTICATION = 48, "inappropriateAuthentication";
    INVALID_CREDENTIALS = 49, "invalidCredentials";
    INSUFFICIENT_ACCESS_RIGHTS = 50, "insufficientAccessRights";
    BUSY = 51, "busy";
    UNAVAILABLE = 52, "unavailable";
    UNWILLING_TO_PERFORM = 53, "unwillingToPerform";
    LOOP_DETECT = 54, "loopDetect";
    NAMING_VIOLATION = 64, "namingViolation";
    OBJECT_CLASS_VIOLATION = 65, "objectClassViolation";
    NOT_ALLOWED_ON_NON_LEAF = 66, "notAllowedOnNonLeaf";
    NOT_ALLOWED_ON_RDN = 67, "notAllowedOnRDN";
    ENTRY_ALREADY_EXISTS = 68, "entryAlreadyExists";
    OBJECT_CLASS_MODS_PROHIBITED = 69, "objectClassModsProhibited";
    // Virtual list view (draft-ietf-ldapext-ldapv3-vlv-09, IANA-registered).
    SORT_CONTROL_MISSING = 60, "sortControlMissing";
    OFFSET_RANGE_ERROR = 61, "offsetRangeError";
    AFFECTS_MULTIPLE_DSAS = 71, "affectsMultipleDSAs";
    VIRTUAL_LIST_VIEW_ERROR = 76, "virtualListViewError";
    OTHER = 80, "other";
    CANCELED = 118, "canceled";
    NO_SUCH_OPERATION = 119, "noSuchOperation";
    TOO_LATE = 120, "tooLate";
    CANNOT_CANCEL = 121, "cannotCancel";
    ASSERTION_FAILED = 122, "assertionFailed";
    AUTHORIZATION_DENIED = 123, "authorizationDenied";
    // draft-zeilenga-ldap-noop; OpenLDAP's value (0x410e).
    NO_OPERATION = 16654, "noOperation";
    // RFC 4533 e-syncRefreshRequired.
    SYNC_REFRESH_REQUIRED = 4096, "e-syncRefreshRequired";
}

impl fmt::Debug for ResultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResultCode({} {})", self.0, self.name())
    }
}

impl fmt::Display for ResultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// The common result of every response except SearchResultEntry/Reference.
#[derive(Debug, Clone, PartialEq)]
pub struct LdapResult {
    pub code: ResultCode,
    pub matched_dn: String,
    pub message: String,
    /// Referral URIs; only meaningful with [`ResultCode::REFERRAL`]. Empty
    /// means the optional field is absent (RFC 4511 requires SIZE (1..MAX)).
    pub referral: Vec<String>,
}

impl LdapResult {
    pub fn success() -> Self {
        LdapResult::new(ResultCode::SUCCESS, "")
    }

    pub fn new(code: ResultCode, message: impl Into<String>) -> Self {
        LdapResult {
            code,
            matched_dn: String::new(),
            message: message.into(),
            referral: Vec::new(),
        }
    }

    /// Sets matchedDN (builder style).
    pub fn with_matched_dn(mut self, dn: impl Into<String>) -> Self {
        self.matched_dn = dn.into();
        self
    }
}

const REFERRAL_TAG: u8 = 0xa3;

// LDAPResult ::= SEQUENCE {
//      resultCode         ENUMERATED { success (0), ... },
//      matchedDN          LDAPDN,
//      diagnosticMessage  LDAPString,
//      referral           [3] Referral OPTIONAL }
//
// Referral ::= SEQUENCE SIZE (1..MAX) OF uri URI
// URI ::= LDAPString     -- limited to characters permitted in URIs
//
// Decodes the components of an LDAPResult from `r` (the caller owns the
// enclosing SEQUENCE, since responses embed it with COMPONENTS OF).
pub(crate) fn decode_result_components(r: &mut Reader<'_>) -> Result<LdapResult, DecodeError> {
    let code = r.read_int_in(tag::ENUMERATED, 0, i64::from(MAX_INT), "resultCode")?;
    let matched_dn = r.read_str(tag::OCTET_STRING, "matchedDN")?.to_owned();
    let message = r
        .read_str(tag::OCTET_STRING, "diagnosticMessage")?
        .to_owned();
    let mut referral = Vec::new();
    if let Some(body) = r.read_opt(REFERRAL_TAG)? {
        let mut rr = Reader::new(body);
        while !rr.is_empty() {
            referral.push(rr.read_str(tag::OCTET_STRING, "referral URI")?.to_owned());
        }
        if referral.is_empty() {
            return Err(DecodeError::new("empty referral"));
        }
    }
    Ok(LdapResult {
        // Range-checked to 0..=MAX_INT above.
        code: ResultCode(code as u32),
        matched_dn,
        message,
        referral,
    })
}

pub(crate) fn encode_result_components(out: &mut Vec<u8>, res: &LdapResult) {
    ber::write_int(out, tag::ENUMERATED, i64::from(res.code.0));
    ber::write_tlv(out, tag::OCTET_STRING, res.matched_dn.as_bytes());
    ber::write_tlv(out, tag::OCTET_STRING, res.message.as_bytes());
    if !res.referral.is_empty() {
        let m = ber::begin(out, REFERRAL_TAG);
        for uri in &res.referral {
            ber::write_tlv(out, tag::OCTET_STRING, uri.as_bytes());
        }
        ber::end(out, m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(ResultCode::NO_SUCH_OBJECT.name(), "noSuchObject");
        assert_eq!(ResultCode::SUCCESS.name(), "success");
        assert_eq!(ResultCode(4097).name(), "unknown");
        assert_eq!(ResultCode::CANNOT_CANCEL.0, 121);
        assert_eq!(format!("{}", ResultCode::BUSY), "busy (51)");
    }

    #[test]
    fn result_round_trip_with_referral() {
        let mut res = LdapResult::new(ResultCode::REFERRAL, "go away");
        res.referral = vec!["ldap://a/".into(), "ldap://b/".into()];
        let res = res.with_matched_dn("dc=x");
        let mut out = Vec::new();
        encode_result_components(&mut out, &res);
        let mut r = Reader::new(&out);
        assert_eq!(decode_result_components(&mut r).unwrap(), res);
        assert!(r.is_empty());
    }

    #[test]
    fn empty_referral_rejected() {
        let bytes = [0x0a, 0x01, 0x0a, 0x04, 0x00, 0x04, 0x00, 0xa3, 0x00];
        assert!(decode_result_components(&mut Reader::new(&bytes)).is_err());
    }
}
