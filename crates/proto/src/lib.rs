//! Pando's LDAPv3 wire codec: strict BER, RFC 4511 messages, RFC 4515
//! string filters, and the values of the controls and extended operations
//! the server implements.
//!
//! The crate is pure (bytes in, values out; no I/O, no dependencies) because
//! it is both the hot path and the attack surface. Decoding is strict:
//! definite lengths only, exact identifiers, range-checked integers and
//! enumerations, UTF-8-checked strings, and hard limits on filter nesting and
//! size, with no panics on any input. The connection layer calls
//! [`frame_length`] to find a complete PDU (rejecting oversize ones from the
//! header alone), then [`LdapMessage::decode`]. Responses are encoded with
//! [`LdapMessage::encode`], or for search entries with [`EntryEncoder`], which
//! writes straight from the caller's bytes without building intermediate
//! vectors.

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod ber;
pub mod control_values;
pub mod controls;
mod entry;
pub mod extended;
mod filter;
mod message;
mod result;
pub mod sync;
pub mod url;

use std::fmt;

pub use controls::{oid, Control, PagedResults};
pub use entry::EntryEncoder;
pub use extended::{
    encode_passwd_modify_response, notice_of_disconnection, CancelRequest, PasswdModifyRequest,
};
pub use filter::{
    Ava, Filter, FilterParseError, MatchingRuleAssertion, SubstringFilter, HARD_MAX_DEPTH,
    STRING_FILTER_MAX_DEPTH,
};
pub use message::{
    frame_length, op_tag, AddRequest, BindAuth, BindRequest, BindResponse, Change, CompareRequest,
    DerefAliases, ExtendedRequest, ExtendedResponse, FrameError, LdapMessage, ModOp,
    ModifyDnRequest, ModifyRequest, PartialAttribute, ProtocolOp, Scope, SearchRequest,
    SearchResultEntry,
};
pub use result::{LdapResult, ResultCode};

/// maxInt (2^31-1), the upper bound of MessageID, sizeLimit, timeLimit, ...
pub const MAX_INT: i32 = i32::MAX;

/// Limits applied while decoding an LDAPMessage.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    /// Maximum nesting of filters; a simple item is depth 1. Default 64.
    /// Capped at [`HARD_MAX_DEPTH`] whatever the value.
    pub max_depth: usize,
    /// Maximum number of filter nodes (items and and/or/not). Default 10,000.
    pub max_filter_terms: usize,
    /// Most keys of a server-side sort request read (RFC 2891); past it
    /// the rest of the list is not decoded. Default 8.
    pub max_sort_keys: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_depth: 64,
            max_filter_terms: 10_000,
            max_sort_keys: 8,
        }
    }
}

/// Why a message (or a control or extended-operation value) did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The message ID, when it was decoded before the error, so the server
    /// can answer that operation with protocolError instead of disconnecting.
    pub msg_id: Option<i32>,
    /// The protocolOp's application identifier byte (e.g. 0x63 for a
    /// SearchRequest), when it was read.
    pub op_tag: Option<u8>,
    pub reason: String,
    /// The BER structure itself is broken (bad tag form, indefinite or
    /// inconsistent lengths): RFC 4511 4.1.1 says to disconnect, even when
    /// the message ID was read.
    pub structural: bool,
}

impl DecodeError {
    pub fn new(reason: impl Into<String>) -> Self {
        DecodeError {
            msg_id: None,
            op_tag: None,
            reason: reason.into(),
            structural: false,
        }
    }

    /// An error in the BER structure (see [`DecodeError::structural`] field).
    pub fn structural(reason: impl Into<String>) -> Self {
        DecodeError {
            structural: true,
            ..DecodeError::new(reason)
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LDAP decode error")?;
        if let Some(id) = self.msg_id {
            write!(f, " (message {id}")?;
            if let Some(t) = self.op_tag {
                write!(f, ", op 0x{t:02x}")?;
            }
            f.write_str(")")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for DecodeError {}
