//! The one place where internal errors become LDAP results.

use pando_model::SchemaViolation;
use pando_proto::{LdapResult, ResultCode};
use pando_store::StoreError;

/// An operation's failure: result code, diagnostic message and matchedDN.
#[derive(Debug, Clone, PartialEq)]
pub struct LdapError {
    pub code: ResultCode,
    pub message: String,
    pub matched_dn: String,
    /// Where to go instead (with [`ResultCode::REFERRAL`]).
    pub referral: Vec<String>,
    /// Response controls that go with the error (the password policy
    /// control says why a bind or a password change failed).
    pub controls: Vec<pando_proto::Control>,
}

impl LdapError {
    pub fn new(code: ResultCode, message: impl Into<String>) -> Self {
        LdapError {
            code,
            message: message.into(),
            matched_dn: String::new(),
            referral: Vec::new(),
            controls: Vec::new(),
        }
    }

    /// A referral to `url`.
    pub fn referral(url: String, message: impl Into<String>) -> Self {
        LdapError {
            referral: vec![url],
            ..Self::new(ResultCode::REFERRAL, message)
        }
    }

    pub fn with_control(mut self, c: pando_proto::Control) -> Self {
        self.controls.push(c);
        self
    }

    /// The result and the response controls that go with it.
    pub fn into_response(mut self) -> (LdapResult, Vec<pando_proto::Control>) {
        let controls = std::mem::take(&mut self.controls);
        (self.into_result(), controls)
    }

    pub fn with_matched(mut self, dn: String) -> Self {
        self.matched_dn = dn;
        self
    }

    pub fn into_result(self) -> LdapResult {
        LdapResult {
            code: self.code,
            matched_dn: self.matched_dn,
            message: self.message,
            referral: self.referral,
        }
    }

    pub fn protocol(msg: impl Into<String>) -> Self {
        Self::new(ResultCode::PROTOCOL_ERROR, msg)
    }
    pub fn invalid_dn(msg: impl Into<String>) -> Self {
        Self::new(ResultCode::INVALID_DN_SYNTAX, msg)
    }
    pub fn invalid_syntax(msg: impl Into<String>) -> Self {
        Self::new(ResultCode::INVALID_ATTRIBUTE_SYNTAX, msg)
    }
    pub fn unwilling(msg: impl Into<String>) -> Self {
        Self::new(ResultCode::UNWILLING_TO_PERFORM, msg)
    }
    pub fn access(msg: impl Into<String>) -> Self {
        Self::new(ResultCode::INSUFFICIENT_ACCESS_RIGHTS, msg)
    }
}

impl From<StoreError> for LdapError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::MapFull => LdapError::unwilling(
                "the database is full (store.map_size_mb reached); the change was not made",
            ),
            StoreError::DiskFull => LdapError::unwilling(
                "the disk holding the database is full; the change was not made",
            ),
            StoreError::Closed => LdapError::new(
                ResultCode::UNAVAILABLE,
                "the operation was not completed: the server is shutting down or its writer failed",
            ),
            other => {
                tracing::error!(error = %other, "store error");
                LdapError::new(
                    ResultCode::OTHER,
                    format!("internal storage error: {other}"),
                )
            }
        }
    }
}

impl From<SchemaViolation> for LdapError {
    fn from(v: SchemaViolation) -> Self {
        LdapError::new(v.code, v.message)
    }
}

pub type OpResult<T> = Result<T, LdapError>;
