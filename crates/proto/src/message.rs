//! LDAPMessage framing, types, decoding and encoding (RFC 4511 section 4).
//!
//! Decoding follows RFC 4511 section 4: every SEQUENCE is implicitly
//! extensible, so well-formed trailing components with unknown tags are
//! skipped, while bytes that are not well-formed BER are an error. SEQUENCE
//! OF / SET OF bodies must consist exactly of their elements.

use std::fmt;

use crate::ber::{self, tag, Reader};
use crate::controls::{decode_controls, encode_controls, Control};
use crate::filter::{decode_ava, Ava, Filter};
use crate::result::{decode_result_components, encode_result_components, LdapResult};
use crate::{DecodeError, DecodeLimits, MAX_INT};

// ---------------------------------------------------------------- framing

/// Why a PDU header was refused by [`frame_length`]. Any of these ends the
/// connection: the stream can no longer be delimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The first byte is not a universal SEQUENCE (0x30).
    BadTag(u8),
    /// Length octet 0x80: BER's indefinite form, which LDAP forbids.
    IndefiniteLength,
    /// A length of more than 4 octets (or the reserved 0xFF).
    BadLength,
    /// `len` is the total PDU size (header included) the header announced.
    TooLarge { len: usize, max: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadTag(t) => write!(f, "PDU does not start with SEQUENCE (0x{t:02x})"),
            FrameError::IndefiniteLength => f.write_str("indefinite length PDU"),
            FrameError::BadLength => f.write_str("PDU length field too long"),
            FrameError::TooLarge { len, max } => {
                write!(f, "PDU of {len} bytes exceeds the limit of {max}")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Finds the extent of the LDAPMessage at the start of `buf`.
///
/// Returns `Ok(Some(total_len))` when `buf` starts with one complete
/// LDAPMessage TLV of `total_len` bytes, `Ok(None)` when more bytes are
/// needed, and an error for an invalid header. The size check uses the
/// header alone, so an oversize PDU is refused before its body is buffered.
pub fn frame_length(buf: &[u8], max_pdu: usize) -> Result<Option<usize>, FrameError> {
    let Some(&t) = buf.first() else {
        return Ok(None);
    };
    if t != tag::SEQUENCE {
        return Err(FrameError::BadTag(t));
    }
    let Some(&first) = buf.get(1) else {
        return Ok(None);
    };
    let (hdr, len) = if first < 0x80 {
        (2usize, usize::from(first))
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 {
            return Err(FrameError::IndefiniteLength);
        }
        if n > ber::MAX_LENGTH_OCTETS {
            return Err(FrameError::BadLength);
        }
        let Some(octets) = buf.get(2..2 + n) else {
            return Ok(None);
        };
        let len = octets
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        (
            2 + n,
            usize::try_from(len).map_err(|_| FrameError::BadLength)?,
        )
    };
    let total = hdr.checked_add(len).ok_or(FrameError::BadLength)?;
    if total > max_pdu {
        return Err(FrameError::TooLarge {
            len: total,
            max: max_pdu,
        });
    }
    Ok(if buf.len() >= total {
        Some(total)
    } else {
        None
    })
}

// ---------------------------------------------------------------- types

#[derive(Debug, Clone, PartialEq)]
pub struct LdapMessage {
    pub id: i32,
    pub op: ProtocolOp,
    pub controls: Vec<Control>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ProtocolOp {
    BindRequest(BindRequest),
    BindResponse(BindResponse),
    UnbindRequest,
    SearchRequest(SearchRequest),
    SearchResultEntry(SearchResultEntry),
    SearchResultDone(LdapResult),
    SearchResultReference(Vec<String>),
    ModifyRequest(ModifyRequest),
    ModifyResponse(LdapResult),
    AddRequest(AddRequest),
    AddResponse(LdapResult),
    DelRequest(String),
    DelResponse(LdapResult),
    ModifyDnRequest(ModifyDnRequest),
    ModifyDnResponse(LdapResult),
    CompareRequest(CompareRequest),
    CompareResponse(LdapResult),
    AbandonRequest(i32),
    ExtendedRequest(ExtendedRequest),
    ExtendedResponse(ExtendedResponse),
    IntermediateResponse {
        name: Option<String>,
        value: Option<Vec<u8>>,
    },
}

/// Application identifier bytes of the protocolOp CHOICE.
pub mod op_tag {
    pub const BIND_REQUEST: u8 = 0x60;
    pub const BIND_RESPONSE: u8 = 0x61;
    pub const UNBIND_REQUEST: u8 = 0x42;
    pub const SEARCH_REQUEST: u8 = 0x63;
    pub const SEARCH_RESULT_ENTRY: u8 = 0x64;
    pub const SEARCH_RESULT_DONE: u8 = 0x65;
    pub const MODIFY_REQUEST: u8 = 0x66;
    pub const MODIFY_RESPONSE: u8 = 0x67;
    pub const ADD_REQUEST: u8 = 0x68;
    pub const ADD_RESPONSE: u8 = 0x69;
    pub const DEL_REQUEST: u8 = 0x4a;
    pub const DEL_RESPONSE: u8 = 0x6b;
    pub const MODIFY_DN_REQUEST: u8 = 0x6c;
    pub const MODIFY_DN_RESPONSE: u8 = 0x6d;
    pub const COMPARE_REQUEST: u8 = 0x6e;
    pub const COMPARE_RESPONSE: u8 = 0x6f;
    pub const ABANDON_REQUEST: u8 = 0x50;
    pub const SEARCH_RESULT_REFERENCE: u8 = 0x73;
    pub const EXTENDED_REQUEST: u8 = 0x77;
    pub const EXTENDED_RESPONSE: u8 = 0x78;
    pub const INTERMEDIATE_RESPONSE: u8 = 0x79;
}
use op_tag as ot;

impl ProtocolOp {
    /// The application identifier byte this op is encoded with.
    pub fn tag(&self) -> u8 {
        match self {
            ProtocolOp::BindRequest(_) => ot::BIND_REQUEST,
            ProtocolOp::BindResponse(_) => ot::BIND_RESPONSE,
            ProtocolOp::UnbindRequest => ot::UNBIND_REQUEST,
            ProtocolOp::SearchRequest(_) => ot::SEARCH_REQUEST,
            ProtocolOp::SearchResultEntry(_) => ot::SEARCH_RESULT_ENTRY,
            ProtocolOp::SearchResultDone(_) => ot::SEARCH_RESULT_DONE,
            ProtocolOp::SearchResultReference(_) => ot::SEARCH_RESULT_REFERENCE,
            ProtocolOp::ModifyRequest(_) => ot::MODIFY_REQUEST,
            ProtocolOp::ModifyResponse(_) => ot::MODIFY_RESPONSE,
            ProtocolOp::AddRequest(_) => ot::ADD_REQUEST,
            ProtocolOp::AddResponse(_) => ot::ADD_RESPONSE,
            ProtocolOp::DelRequest(_) => ot::DEL_REQUEST,
            ProtocolOp::DelResponse(_) => ot::DEL_RESPONSE,
            ProtocolOp::ModifyDnRequest(_) => ot::MODIFY_DN_REQUEST,
            ProtocolOp::ModifyDnResponse(_) => ot::MODIFY_DN_RESPONSE,
            ProtocolOp::CompareRequest(_) => ot::COMPARE_REQUEST,
            ProtocolOp::CompareResponse(_) => ot::COMPARE_RESPONSE,
            ProtocolOp::AbandonRequest(_) => ot::ABANDON_REQUEST,
            ProtocolOp::ExtendedRequest(_) => ot::EXTENDED_REQUEST,
            ProtocolOp::ExtendedResponse(_) => ot::EXTENDED_RESPONSE,
            ProtocolOp::IntermediateResponse { .. } => ot::INTERMEDIATE_RESPONSE,
        }
    }

    /// The response op carrying `result` for a request with application
    /// identifier `request_tag` (e.g. the `op_tag` of a [`DecodeError`]).
    /// `None` for requests without a response (unbind, abandon) and for
    /// identifiers that are not requests.
    pub fn response_for(request_tag: u8, result: LdapResult) -> Option<ProtocolOp> {
        Some(match request_tag {
            ot::BIND_REQUEST => ProtocolOp::BindResponse(BindResponse {
                result,
                server_sasl_creds: None,
            }),
            ot::SEARCH_REQUEST => ProtocolOp::SearchResultDone(result),
            ot::MODIFY_REQUEST => ProtocolOp::ModifyResponse(result),
            ot::ADD_REQUEST => ProtocolOp::AddResponse(result),
            ot::DEL_REQUEST => ProtocolOp::DelResponse(result),
            ot::MODIFY_DN_REQUEST => ProtocolOp::ModifyDnResponse(result),
            ot::COMPARE_REQUEST => ProtocolOp::CompareResponse(result),
            ot::EXTENDED_REQUEST => ProtocolOp::ExtendedResponse(ExtendedResponse {
                result,
                name: None,
                value: None,
            }),
            _ => return None,
        })
    }
}

/// BindRequest. Debug is written by hand so credentials never reach logs.
#[derive(Clone, PartialEq)]
pub struct BindRequest {
    /// 1..=127, range-checked when decoding; only 3 is LDAPv3.
    pub version: u8,
    pub name: String,
    pub auth: BindAuth,
}

/// AuthenticationChoice. Debug redacts the password and SASL credentials.
#[derive(Clone, PartialEq)]
pub enum BindAuth {
    /// The simple password; may be non-UTF-8 bytes.
    Simple(Vec<u8>),
    Sasl {
        mechanism: String,
        credentials: Option<Vec<u8>>,
    },
}

impl fmt::Debug for BindAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindAuth::Simple(p) => {
                // Revealing only whether the password is empty (an
                // unauthenticated bind) helps debugging and leaks nothing.
                let shown = if p.is_empty() {
                    "<empty>"
                } else {
                    "<redacted>"
                };
                f.debug_tuple("Simple")
                    .field(&format_args!("{shown}"))
                    .finish()
            }
            BindAuth::Sasl {
                mechanism,
                credentials,
            } => f
                .debug_struct("Sasl")
                .field("mechanism", mechanism)
                .field(
                    "credentials",
                    &credentials.as_ref().map(|_| format_args!("<redacted>")),
                )
                .finish(),
        }
    }
}

impl fmt::Debug for BindRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BindRequest")
            .field("version", &self.version)
            .field("name", &self.name)
            .field("auth", &self.auth)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BindResponse {
    pub result: LdapResult,
    pub server_sasl_creds: Option<Vec<u8>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scope {
    Base = 0,
    One = 1,
    Sub = 2,
    /// subordinateSubtree (draft-sermersheim-ldap-subordinate-scope).
    Children = 3,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DerefAliases {
    Never = 0,
    InSearching = 1,
    FindingBase = 2,
    Always = 3,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SearchRequest {
    pub base: String,
    pub scope: Scope,
    pub deref: DerefAliases,
    /// 0..=MAX_INT; 0 means no client-requested limit.
    pub size_limit: i32,
    /// Seconds, 0..=MAX_INT; 0 means no client-requested limit.
    pub time_limit: i32,
    pub types_only: bool,
    pub filter: Filter,
    pub attrs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PartialAttribute {
    pub name: String,
    pub values: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SearchResultEntry {
    pub dn: String,
    pub attrs: Vec<PartialAttribute>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ModOp {
    Add = 0,
    Delete = 1,
    Replace = 2,
    /// RFC 4525.
    Increment = 3,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub op: ModOp,
    pub attr: PartialAttribute,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModifyRequest {
    pub dn: String,
    pub changes: Vec<Change>,
}

/// AddRequest. Invariant after decoding: every attribute has at least one
/// value (RFC 4511 Attribute is `vals (SIZE(1..MAX))`).
#[derive(Debug, Clone, PartialEq)]
pub struct AddRequest {
    pub dn: String,
    pub attrs: Vec<PartialAttribute>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModifyDnRequest {
    pub dn: String,
    pub new_rdn: String,
    pub delete_old_rdn: bool,
    pub new_superior: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompareRequest {
    pub dn: String,
    pub ava: Ava,
}

/// ExtendedRequest. Debug is written by hand and shows only the value's
/// length: some values (Password Modify) carry passwords.
#[derive(Clone, PartialEq)]
pub struct ExtendedRequest {
    pub name: String,
    pub value: Option<Vec<u8>>,
}

impl fmt::Debug for ExtendedRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtendedRequest")
            .field("name", &self.name)
            .field("value", &self.value.as_ref().map(|v| ByteCount(v.len())))
            .finish()
    }
}

/// Debug-prints as `<N bytes>`.
struct ByteCount(usize);

impl fmt::Debug for ByteCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExtendedResponse {
    pub result: LdapResult,
    pub name: Option<String>,
    pub value: Option<Vec<u8>>,
}

// ---------------------------------------------------------------- decoding

impl LdapMessage {
    // LDAPMessage ::= SEQUENCE {
    //      messageID       MessageID,
    //      protocolOp      CHOICE {
    //           bindRequest           BindRequest,
    //           bindResponse          BindResponse,
    //           unbindRequest         UnbindRequest,
    //           searchRequest         SearchRequest,
    //           searchResEntry        SearchResultEntry,
    //           searchResDone         SearchResultDone,
    //           searchResRef          SearchResultReference,
    //           modifyRequest         ModifyRequest,
    //           modifyResponse        ModifyResponse,
    //           addRequest            AddRequest,
    //           addResponse           AddResponse,
    //           delRequest            DelRequest,
    //           delResponse           DelResponse,
    //           modDNRequest          ModifyDNRequest,
    //           modDNResponse         ModifyDNResponse,
    //           compareRequest        CompareRequest,
    //           compareResponse       CompareResponse,
    //           abandonRequest        AbandonRequest,
    //           extendedReq           ExtendedRequest,
    //           extendedResp          ExtendedResponse,
    //           ...,
    //           intermediateResponse  IntermediateResponse },
    //      controls       [0] Controls OPTIONAL }
    //
    // MessageID ::= INTEGER (0 ..  maxInt)
    //
    /// Decodes exactly one complete frame, as delimited by [`frame_length`].
    ///
    /// Errors carry the message ID and op identifier when they were read, so
    /// the caller can answer that operation with protocolError.
    pub fn decode(frame: &[u8], limits: &DecodeLimits) -> Result<LdapMessage, DecodeError> {
        let mut outer = Reader::new(frame);
        let body = outer.read(tag::SEQUENCE)?;
        outer.finish("frame")?;
        let mut r = Reader::new(body);
        let id = r.read_int_in(tag::INTEGER, 0, i64::from(MAX_INT), "messageID")? as i32;
        let with_id = |mut e: DecodeError| {
            e.msg_id = Some(id);
            e
        };
        let (t, op_body) = r.read_tlv().map_err(with_id)?;
        let with_op = |mut e: DecodeError| {
            e.msg_id = Some(id);
            e.op_tag = Some(t);
            e
        };
        let op = decode_op(t, op_body, limits).map_err(with_op)?;
        let controls = match r.read_opt(0xa0).map_err(with_op)? {
            Some(c) => decode_controls(c).map_err(with_op)?,
            None => Vec::new(),
        };
        r.skip_extensions().map_err(with_op)?;
        Ok(LdapMessage { id, op, controls })
    }
}

fn decode_op(t: u8, body: &[u8], limits: &DecodeLimits) -> Result<ProtocolOp, DecodeError> {
    let mut r = Reader::new(body);
    let op = match t {
        ot::BIND_REQUEST => ProtocolOp::BindRequest(decode_bind_request(&mut r)?),
        ot::BIND_RESPONSE => ProtocolOp::BindResponse(decode_bind_response(&mut r)?),
        // UnbindRequest ::= [APPLICATION 2] NULL
        ot::UNBIND_REQUEST => {
            r.finish("UnbindRequest")?;
            ProtocolOp::UnbindRequest
        }
        ot::SEARCH_REQUEST => ProtocolOp::SearchRequest(decode_search_request(&mut r, limits)?),
        ot::SEARCH_RESULT_ENTRY => ProtocolOp::SearchResultEntry(decode_search_entry(&mut r)?),
        ot::SEARCH_RESULT_REFERENCE => {
            // SearchResultReference ::= [APPLICATION 19] SEQUENCE
            //                           SIZE (1..MAX) OF uri URI
            let mut uris = Vec::new();
            while !r.is_empty() {
                uris.push(r.read_str(tag::OCTET_STRING, "reference URI")?.to_owned());
            }
            if uris.is_empty() {
                return Err(DecodeError::new("empty SearchResultReference"));
            }
            ProtocolOp::SearchResultReference(uris)
        }
        ot::MODIFY_REQUEST => ProtocolOp::ModifyRequest(decode_modify_request(&mut r)?),
        ot::ADD_REQUEST => ProtocolOp::AddRequest(decode_add_request(&mut r)?),
        // DelRequest ::= [APPLICATION 10] LDAPDN
        ot::DEL_REQUEST => {
            // Primitive: the whole body is the DN, so there is nothing left
            // for the trailing-component check below.
            let dn = ber::decode_str(body, "entry DN")?.to_owned();
            return Ok(ProtocolOp::DelRequest(dn));
        }
        ot::MODIFY_DN_REQUEST => ProtocolOp::ModifyDnRequest(decode_moddn_request(&mut r)?),
        ot::COMPARE_REQUEST => ProtocolOp::CompareRequest(decode_compare_request(&mut r)?),
        // AbandonRequest ::= [APPLICATION 16] MessageID
        ot::ABANDON_REQUEST => {
            let v = ber::decode_int(body)?;
            if !(0..=i64::from(MAX_INT)).contains(&v) {
                return Err(DecodeError::new(format!(
                    "abandoned messageID {v} out of range"
                )));
            }
            // Primitive, like DelRequest.
            return Ok(ProtocolOp::AbandonRequest(v as i32));
        }
        ot::EXTENDED_REQUEST => ProtocolOp::ExtendedRequest(decode_extended_request(&mut r)?),
        ot::EXTENDED_RESPONSE => ProtocolOp::ExtendedResponse(decode_extended_response(&mut r)?),
        ot::INTERMEDIATE_RESPONSE => {
            // IntermediateResponse ::= [APPLICATION 25] SEQUENCE {
            //         responseName     [0] LDAPOID OPTIONAL,
            //         responseValue    [1] OCTET STRING OPTIONAL }
            let name = r.read_str_opt(0x80, "responseName")?.map(str::to_owned);
            let value = r.read_opt(0x81)?.map(<[u8]>::to_vec);
            ProtocolOp::IntermediateResponse { name, value }
        }
        // SearchResultDone ::= [APPLICATION 5] LDAPResult
        // ModifyResponse ::= [APPLICATION 7] LDAPResult
        // AddResponse ::= [APPLICATION 9] LDAPResult
        // DelResponse ::= [APPLICATION 11] LDAPResult
        // ModifyDNResponse ::= [APPLICATION 13] LDAPResult
        // CompareResponse ::= [APPLICATION 15] LDAPResult
        ot::SEARCH_RESULT_DONE => ProtocolOp::SearchResultDone(decode_result_components(&mut r)?),
        ot::MODIFY_RESPONSE => ProtocolOp::ModifyResponse(decode_result_components(&mut r)?),
        ot::ADD_RESPONSE => ProtocolOp::AddResponse(decode_result_components(&mut r)?),
        ot::DEL_RESPONSE => ProtocolOp::DelResponse(decode_result_components(&mut r)?),
        ot::MODIFY_DN_RESPONSE => ProtocolOp::ModifyDnResponse(decode_result_components(&mut r)?),
        ot::COMPARE_RESPONSE => ProtocolOp::CompareResponse(decode_result_components(&mut r)?),
        other => {
            return Err(DecodeError::new(format!(
                "unknown protocolOp 0x{other:02x}"
            )))
        }
    };
    // SEQUENCE ops may carry unknown trailing components (RFC 4511 section
    // 4); UnbindRequest and SearchResultReference have consumed everything.
    r.skip_extensions()?;
    Ok(op)
}

// BindRequest ::= [APPLICATION 0] SEQUENCE {
//      version                 INTEGER (1 ..  127),
//      name                    LDAPDN,
//      authentication          AuthenticationChoice }
//
// AuthenticationChoice ::= CHOICE {
//      simple                  [0] OCTET STRING,
//                              -- 1 and 2 reserved
//      sasl                    [3] SaslCredentials,
//      ...  }
//
// SaslCredentials ::= SEQUENCE {
//      mechanism               LDAPString,
//      credentials             OCTET STRING OPTIONAL }
fn decode_bind_request(r: &mut Reader<'_>) -> Result<BindRequest, DecodeError> {
    let version = r.read_int_in(tag::INTEGER, 1, 127, "version")? as u8;
    let name = r.read_str(tag::OCTET_STRING, "bind name")?.to_owned();
    let auth = match r.read_tlv()? {
        (0x80, pw) => BindAuth::Simple(pw.to_vec()),
        (0xa3, body) => {
            let mut s = Reader::new(body);
            let mechanism = s.read_str(tag::OCTET_STRING, "SASL mechanism")?.to_owned();
            let credentials = s.read_opt(tag::OCTET_STRING)?.map(<[u8]>::to_vec);
            s.skip_extensions()?;
            BindAuth::Sasl {
                mechanism,
                credentials,
            }
        }
        (other, _) => {
            return Err(DecodeError::new(format!(
                "unsupported authentication choice 0x{other:02x}"
            )))
        }
    };
    Ok(BindRequest {
        version,
        name,
        auth,
    })
}

// BindResponse ::= [APPLICATION 1] SEQUENCE {
//      COMPONENTS OF LDAPResult,
//      serverSaslCreds    [7] OCTET STRING OPTIONAL }
fn decode_bind_response(r: &mut Reader<'_>) -> Result<BindResponse, DecodeError> {
    let result = decode_result_components(r)?;
    let server_sasl_creds = r.read_opt(0x87)?.map(<[u8]>::to_vec);
    Ok(BindResponse {
        result,
        server_sasl_creds,
    })
}

// SearchRequest ::= [APPLICATION 3] SEQUENCE {
//      baseObject      LDAPDN,
//      scope           ENUMERATED {
//           baseObject              (0),
//           singleLevel             (1),
//           wholeSubtree            (2),
//           ...  },
//      derefAliases    ENUMERATED {
//           neverDerefAliases       (0),
//           derefInSearching        (1),
//           derefFindingBaseObj     (2),
//           derefAlways             (3) },
//      sizeLimit       INTEGER (0 ..  maxInt),
//      timeLimit       INTEGER (0 ..  maxInt),
//      typesOnly       BOOLEAN,
//      filter          Filter,
//      attributes      AttributeSelection }
//
// AttributeSelection ::= SEQUENCE OF selector LDAPString
//
// Scope 3 (subordinateSubtree) is accepted as an extension value.
fn decode_search_request(
    r: &mut Reader<'_>,
    limits: &DecodeLimits,
) -> Result<SearchRequest, DecodeError> {
    let base = r.read_str(tag::OCTET_STRING, "baseObject")?.to_owned();
    let scope = match r.read_int_in(tag::ENUMERATED, 0, 3, "scope")? {
        0 => Scope::Base,
        1 => Scope::One,
        2 => Scope::Sub,
        _ => Scope::Children,
    };
    let deref = match r.read_int_in(tag::ENUMERATED, 0, 3, "derefAliases")? {
        0 => DerefAliases::Never,
        1 => DerefAliases::InSearching,
        2 => DerefAliases::FindingBase,
        _ => DerefAliases::Always,
    };
    let max = i64::from(MAX_INT);
    let size_limit = r.read_int_in(tag::INTEGER, 0, max, "sizeLimit")? as i32;
    let time_limit = r.read_int_in(tag::INTEGER, 0, max, "timeLimit")? as i32;
    let types_only = r.read_bool(tag::BOOLEAN, "typesOnly")?;
    let (ft, fb) = r.read_tlv()?;
    let filter = Filter::decode(ft, fb, limits)?;
    let mut sel = r.read_constructed(tag::SEQUENCE)?;
    let mut attrs = Vec::new();
    while !sel.is_empty() {
        attrs.push(
            sel.read_str(tag::OCTET_STRING, "attribute selector")?
                .to_owned(),
        );
    }
    Ok(SearchRequest {
        base,
        scope,
        deref,
        size_limit,
        time_limit,
        types_only,
        filter,
        attrs,
    })
}

// PartialAttribute ::= SEQUENCE {
//      type       AttributeDescription,
//      vals       SET OF value AttributeValue }
//
// Attribute ::= PartialAttribute(WITH COMPONENTS {
//      ...,
//      vals (SIZE(1..MAX))})
fn decode_partial_attribute(body: &[u8], non_empty: bool) -> Result<PartialAttribute, DecodeError> {
    let mut r = Reader::new(body);
    let name = r
        .read_str(tag::OCTET_STRING, "attribute description")?
        .to_owned();
    let mut set = r.read_constructed(tag::SET)?;
    r.skip_extensions()?;
    let mut values = Vec::new();
    while !set.is_empty() {
        values.push(set.read(tag::OCTET_STRING)?.to_vec());
    }
    if non_empty && values.is_empty() {
        return Err(DecodeError::new(format!("no values for attribute {name}")));
    }
    Ok(PartialAttribute { name, values })
}

fn decode_attribute_list(
    r: &mut Reader<'_>,
    non_empty: bool,
) -> Result<Vec<PartialAttribute>, DecodeError> {
    let mut list = r.read_constructed(tag::SEQUENCE)?;
    let mut attrs = Vec::new();
    while !list.is_empty() {
        attrs.push(decode_partial_attribute(
            list.read(tag::SEQUENCE)?,
            non_empty,
        )?);
    }
    Ok(attrs)
}

// SearchResultEntry ::= [APPLICATION 4] SEQUENCE {
//      objectName      LDAPDN,
//      attributes      PartialAttributeList }
//
// PartialAttributeList ::= SEQUENCE OF
//                      partialAttribute PartialAttribute
fn decode_search_entry(r: &mut Reader<'_>) -> Result<SearchResultEntry, DecodeError> {
    let dn = r.read_str(tag::OCTET_STRING, "objectName")?.to_owned();
    let attrs = decode_attribute_list(r, false)?;
    Ok(SearchResultEntry { dn, attrs })
}

// ModifyRequest ::= [APPLICATION 6] SEQUENCE {
//      object          LDAPDN,
//      changes         SEQUENCE OF change SEQUENCE {
//           operation       ENUMERATED {
//                add     (0),
//                delete  (1),
//                replace (2),
//                ...  },
//           modification    PartialAttribute } }
//
// increment (3) is RFC 4525.
fn decode_modify_request(r: &mut Reader<'_>) -> Result<ModifyRequest, DecodeError> {
    let dn = r.read_str(tag::OCTET_STRING, "object")?.to_owned();
    let mut list = r.read_constructed(tag::SEQUENCE)?;
    let mut changes = Vec::new();
    while !list.is_empty() {
        let mut c = list.read_constructed(tag::SEQUENCE)?;
        let op = match c.read_int_in(tag::ENUMERATED, 0, 3, "modify operation")? {
            0 => ModOp::Add,
            1 => ModOp::Delete,
            2 => ModOp::Replace,
            _ => ModOp::Increment,
        };
        let attr = decode_partial_attribute(c.read(tag::SEQUENCE)?, false)?;
        c.skip_extensions()?;
        changes.push(Change { op, attr });
    }
    Ok(ModifyRequest { dn, changes })
}

// AddRequest ::= [APPLICATION 8] SEQUENCE {
//      entry           LDAPDN,
//      attributes      AttributeList }
//
// AttributeList ::= SEQUENCE OF attribute Attribute
fn decode_add_request(r: &mut Reader<'_>) -> Result<AddRequest, DecodeError> {
    let dn = r.read_str(tag::OCTET_STRING, "entry")?.to_owned();
    let attrs = decode_attribute_list(r, true)?;
    Ok(AddRequest { dn, attrs })
}

// ModifyDNRequest ::= [APPLICATION 12] SEQUENCE {
//      entry           LDAPDN,
//      newrdn          RelativeLDAPDN,
//      deleteoldrdn    BOOLEAN,
//      newSuperior     [0] LDAPDN OPTIONAL }
fn decode_moddn_request(r: &mut Reader<'_>) -> Result<ModifyDnRequest, DecodeError> {
    let dn = r.read_str(tag::OCTET_STRING, "entry")?.to_owned();
    let new_rdn = r.read_str(tag::OCTET_STRING, "newrdn")?.to_owned();
    let delete_old_rdn = r.read_bool(tag::BOOLEAN, "deleteoldrdn")?;
    let new_superior = r.read_str_opt(0x80, "newSuperior")?.map(str::to_owned);
    Ok(ModifyDnRequest {
        dn,
        new_rdn,
        delete_old_rdn,
        new_superior,
    })
}

// CompareRequest ::= [APPLICATION 14] SEQUENCE {
//      entry           LDAPDN,
//      ava             AttributeValueAssertion }
fn decode_compare_request(r: &mut Reader<'_>) -> Result<CompareRequest, DecodeError> {
    let dn = r.read_str(tag::OCTET_STRING, "entry")?.to_owned();
    let ava = decode_ava(r.read(tag::SEQUENCE)?)?;
    Ok(CompareRequest { dn, ava })
}

// ExtendedRequest ::= [APPLICATION 23] SEQUENCE {
//      requestName      [0] LDAPOID,
//      requestValue     [1] OCTET STRING OPTIONAL }
fn decode_extended_request(r: &mut Reader<'_>) -> Result<ExtendedRequest, DecodeError> {
    let name = r.read_str(0x80, "requestName")?.to_owned();
    let value = r.read_opt(0x81)?.map(<[u8]>::to_vec);
    Ok(ExtendedRequest { name, value })
}

// ExtendedResponse ::= [APPLICATION 24] SEQUENCE {
//      COMPONENTS OF LDAPResult,
//      responseName     [10] LDAPOID OPTIONAL,
//      responseValue    [11] OCTET STRING OPTIONAL }
fn decode_extended_response(r: &mut Reader<'_>) -> Result<ExtendedResponse, DecodeError> {
    let result = decode_result_components(r)?;
    let name = r.read_str_opt(0x8a, "responseName")?.map(str::to_owned);
    let value = r.read_opt(0x8b)?.map(<[u8]>::to_vec);
    Ok(ExtendedResponse {
        result,
        name,
        value,
    })
}

// ---------------------------------------------------------------- encoding

fn write_str(out: &mut Vec<u8>, s: &str) {
    ber::write_tlv(out, tag::OCTET_STRING, s.as_bytes());
}

fn encode_partial_attribute(out: &mut Vec<u8>, a: &PartialAttribute) {
    let m = ber::begin(out, tag::SEQUENCE);
    write_str(out, &a.name);
    let s = ber::begin(out, tag::SET);
    for v in &a.values {
        ber::write_tlv(out, tag::OCTET_STRING, v);
    }
    ber::end(out, s);
    ber::end(out, m);
}

fn encode_attribute_list(out: &mut Vec<u8>, attrs: &[PartialAttribute]) {
    let m = ber::begin(out, tag::SEQUENCE);
    for a in attrs {
        encode_partial_attribute(out, a);
    }
    ber::end(out, m);
}

fn encode_op(out: &mut Vec<u8>, op: &ProtocolOp) {
    let t = op.tag();
    match op {
        ProtocolOp::UnbindRequest => ber::write_tlv(out, t, &[]),
        ProtocolOp::DelRequest(dn) => ber::write_tlv(out, t, dn.as_bytes()),
        ProtocolOp::AbandonRequest(id) => ber::write_int(out, t, i64::from(*id)),
        _ => {
            let m = ber::begin(out, t);
            encode_op_body(out, op);
            ber::end(out, m);
        }
    }
}

/// A BindRequest's body: version, name, simple or SASL credentials.
fn encode_bind_request(out: &mut Vec<u8>, b: &BindRequest) {
    ber::write_int(out, tag::INTEGER, i64::from(b.version));
    write_str(out, &b.name);
    match &b.auth {
        BindAuth::Simple(pw) => ber::write_tlv(out, 0x80, pw),
        BindAuth::Sasl {
            mechanism,
            credentials,
        } => {
            let m = ber::begin(out, 0xa3);
            write_str(out, mechanism);
            if let Some(c) = credentials {
                ber::write_tlv(out, tag::OCTET_STRING, c);
            }
            ber::end(out, m);
        }
    }
}

/// A SearchRequest's body: base, scope, aliases, limits, filter, attributes.
fn encode_search_request(out: &mut Vec<u8>, s: &SearchRequest) {
    write_str(out, &s.base);
    ber::write_int(out, tag::ENUMERATED, s.scope as i64);
    ber::write_int(out, tag::ENUMERATED, s.deref as i64);
    ber::write_int(out, tag::INTEGER, i64::from(s.size_limit));
    ber::write_int(out, tag::INTEGER, i64::from(s.time_limit));
    ber::write_bool(out, tag::BOOLEAN, s.types_only);
    s.filter.encode(out);
    let m = ber::begin(out, tag::SEQUENCE);
    for a in &s.attrs {
        write_str(out, a);
    }
    ber::end(out, m);
}

fn encode_op_body(out: &mut Vec<u8>, op: &ProtocolOp) {
    match op {
        // Primitive ops are written whole by encode_op.
        ProtocolOp::UnbindRequest | ProtocolOp::DelRequest(_) | ProtocolOp::AbandonRequest(_) => {}
        ProtocolOp::BindRequest(b) => encode_bind_request(out, b),
        ProtocolOp::BindResponse(b) => {
            encode_result_components(out, &b.result);
            if let Some(c) = &b.server_sasl_creds {
                ber::write_tlv(out, 0x87, c);
            }
        }
        ProtocolOp::SearchRequest(s) => encode_search_request(out, s),
        ProtocolOp::SearchResultEntry(e) => {
            write_str(out, &e.dn);
            encode_attribute_list(out, &e.attrs);
        }
        ProtocolOp::SearchResultReference(uris) => {
            for u in uris {
                write_str(out, u);
            }
        }
        ProtocolOp::SearchResultDone(r)
        | ProtocolOp::ModifyResponse(r)
        | ProtocolOp::AddResponse(r)
        | ProtocolOp::DelResponse(r)
        | ProtocolOp::ModifyDnResponse(r)
        | ProtocolOp::CompareResponse(r) => encode_result_components(out, r),
        ProtocolOp::ModifyRequest(m) => {
            write_str(out, &m.dn);
            let l = ber::begin(out, tag::SEQUENCE);
            for c in &m.changes {
                let s = ber::begin(out, tag::SEQUENCE);
                ber::write_int(out, tag::ENUMERATED, c.op as i64);
                encode_partial_attribute(out, &c.attr);
                ber::end(out, s);
            }
            ber::end(out, l);
        }
        ProtocolOp::AddRequest(a) => {
            write_str(out, &a.dn);
            encode_attribute_list(out, &a.attrs);
        }
        ProtocolOp::ModifyDnRequest(m) => {
            write_str(out, &m.dn);
            write_str(out, &m.new_rdn);
            ber::write_bool(out, tag::BOOLEAN, m.delete_old_rdn);
            if let Some(s) = &m.new_superior {
                ber::write_tlv(out, 0x80, s.as_bytes());
            }
        }
        ProtocolOp::CompareRequest(c) => {
            write_str(out, &c.dn);
            let m = ber::begin(out, tag::SEQUENCE);
            write_str(out, &c.ava.attr);
            ber::write_tlv(out, tag::OCTET_STRING, &c.ava.value);
            ber::end(out, m);
        }
        ProtocolOp::ExtendedRequest(e) => {
            ber::write_tlv(out, 0x80, e.name.as_bytes());
            if let Some(v) = &e.value {
                ber::write_tlv(out, 0x81, v);
            }
        }
        ProtocolOp::ExtendedResponse(e) => {
            encode_result_components(out, &e.result);
            if let Some(n) = &e.name {
                ber::write_tlv(out, 0x8a, n.as_bytes());
            }
            if let Some(v) = &e.value {
                ber::write_tlv(out, 0x8b, v);
            }
        }
        ProtocolOp::IntermediateResponse { name, value } => {
            if let Some(n) = name {
                ber::write_tlv(out, 0x80, n.as_bytes());
            }
            if let Some(v) = value {
                ber::write_tlv(out, 0x81, v);
            }
        }
    }
}

impl LdapMessage {
    /// Appends the encoding (definite, minimal lengths) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let m = ber::begin(out, tag::SEQUENCE);
        ber::write_int(out, tag::INTEGER, i64::from(self.id));
        encode_op(out, &self.op);
        encode_controls(out, &self.controls);
        ber::end(out, m);
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResultCode;

    fn limits() -> DecodeLimits {
        DecodeLimits::default()
    }

    fn rt(msg: LdapMessage) {
        let bytes = msg.to_bytes();
        assert_eq!(frame_length(&bytes, 1 << 20).unwrap(), Some(bytes.len()));
        let back = LdapMessage::decode(&bytes, &limits()).unwrap();
        assert_eq!(back, msg);
        // Encoding is deterministic.
        assert_eq!(back.to_bytes(), bytes);
    }

    fn msg(id: i32, op: ProtocolOp) -> LdapMessage {
        LdapMessage {
            id,
            op,
            controls: vec![],
        }
    }

    fn pa(name: &str, vals: &[&[u8]]) -> PartialAttribute {
        PartialAttribute {
            name: name.into(),
            values: vals.iter().map(|v| v.to_vec()).collect(),
        }
    }

    fn referral_result() -> LdapResult {
        let mut r = LdapResult::new(ResultCode::REFERRAL, "see elsewhere").with_matched_dn("dc=x");
        r.referral = vec!["ldap://h/dc=x".into()];
        r
    }

    #[test]
    fn round_trip_every_op() {
        let res = LdapResult::new(ResultCode::NO_SUCH_OBJECT, "nope");
        let ops = vec![
            ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: "cn=admin,dc=example,dc=com".into(),
                auth: BindAuth::Simple(vec![0xff, 0x00, b's']),
            }),
            ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: "".into(),
                auth: BindAuth::Sasl {
                    mechanism: "EXTERNAL".into(),
                    credentials: None,
                },
            }),
            ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: "".into(),
                auth: BindAuth::Sasl {
                    mechanism: "PLAIN".into(),
                    credentials: Some(b"\0u\0p".to_vec()),
                },
            }),
            ProtocolOp::BindResponse(BindResponse {
                result: LdapResult::success(),
                server_sasl_creds: None,
            }),
            ProtocolOp::BindResponse(BindResponse {
                result: LdapResult::new(ResultCode::SASL_BIND_IN_PROGRESS, ""),
                server_sasl_creds: Some(b"challenge".to_vec()),
            }),
            ProtocolOp::UnbindRequest,
            ProtocolOp::SearchRequest(SearchRequest {
                base: "dc=example,dc=com".into(),
                scope: Scope::Sub,
                deref: DerefAliases::Always,
                size_limit: MAX_INT,
                time_limit: 30,
                types_only: true,
                filter: Filter::parse("(&(objectClass=person)(|(cn=a*b)(sn:dn:1.2:=x)))").unwrap(),
                attrs: vec!["cn".into(), "+".into(), "1.1".into()],
            }),
            ProtocolOp::SearchRequest(SearchRequest {
                base: "".into(),
                scope: Scope::Children,
                deref: DerefAliases::Never,
                size_limit: 0,
                time_limit: 0,
                types_only: false,
                filter: Filter::Present("objectClass".into()),
                attrs: vec![],
            }),
            ProtocolOp::SearchResultEntry(SearchResultEntry {
                dn: "cn=x,dc=example,dc=com".into(),
                attrs: vec![
                    pa("cn", &[b"x", b"y"]),
                    pa("jpegPhoto", &[&[0xff, 0xd8, 0x00]]),
                    pa("empty", &[]),
                ],
            }),
            ProtocolOp::SearchResultDone(referral_result()),
            ProtocolOp::SearchResultReference(vec!["ldap://a/dc=x".into(), "ldap://b/dc=x".into()]),
            ProtocolOp::ModifyRequest(ModifyRequest {
                dn: "cn=x".into(),
                changes: vec![
                    Change {
                        op: ModOp::Add,
                        attr: pa("mail", &[b"a@b"]),
                    },
                    Change {
                        op: ModOp::Delete,
                        attr: pa("phone", &[]),
                    },
                    Change {
                        op: ModOp::Replace,
                        attr: pa("sn", &[b"z"]),
                    },
                    Change {
                        op: ModOp::Increment,
                        attr: pa("uidNumber", &[b"1"]),
                    },
                ],
            }),
            ProtocolOp::ModifyResponse(res.clone()),
            ProtocolOp::AddRequest(AddRequest {
                dn: "cn=new,dc=x".into(),
                attrs: vec![pa("objectClass", &[b"top", b"person"]), pa("cn", &[b"new"])],
            }),
            ProtocolOp::AddResponse(res.clone()),
            ProtocolOp::DelRequest("cn=old,dc=x".into()),
            ProtocolOp::DelRequest("".into()),
            ProtocolOp::DelResponse(res.clone()),
            ProtocolOp::ModifyDnRequest(ModifyDnRequest {
                dn: "cn=a,dc=x".into(),
                new_rdn: "cn=b".into(),
                delete_old_rdn: true,
                new_superior: Some("ou=y,dc=x".into()),
            }),
            ProtocolOp::ModifyDnRequest(ModifyDnRequest {
                dn: "cn=a,dc=x".into(),
                new_rdn: "cn=b".into(),
                delete_old_rdn: false,
                new_superior: None,
            }),
            ProtocolOp::ModifyDnResponse(res.clone()),
            ProtocolOp::CompareRequest(CompareRequest {
                dn: "cn=a".into(),
                ava: Ava {
                    attr: "userCertificate;binary".into(),
                    value: vec![0, 1, 2, 0xff],
                },
            }),
            ProtocolOp::CompareResponse(LdapResult::new(ResultCode::COMPARE_TRUE, "")),
            ProtocolOp::AbandonRequest(0),
            ProtocolOp::AbandonRequest(MAX_INT),
            ProtocolOp::ExtendedRequest(ExtendedRequest {
                name: crate::oid::WHOAMI.into(),
                value: None,
            }),
            ProtocolOp::ExtendedRequest(ExtendedRequest {
                name: crate::oid::PASSWD_MODIFY.into(),
                value: Some(vec![0x30, 0x00]),
            }),
            ProtocolOp::ExtendedResponse(ExtendedResponse {
                result: LdapResult::success(),
                name: None,
                value: Some(b"dn:cn=x".to_vec()),
            }),
            ProtocolOp::ExtendedResponse(ExtendedResponse {
                result: referral_result(),
                name: Some("1.2.3".into()),
                value: None,
            }),
            ProtocolOp::IntermediateResponse {
                name: None,
                value: None,
            },
            ProtocolOp::IntermediateResponse {
                name: Some("1.3.6.1.4.1.4203.1.9.1.4".into()),
                value: Some(vec![0xa2, 0x00]),
            },
        ];
        for (i, op) in ops.into_iter().enumerate() {
            rt(msg(i as i32 + 1, op));
        }
    }

    #[test]
    fn round_trip_with_controls_and_big_ids() {
        rt(LdapMessage {
            id: MAX_INT,
            op: ProtocolOp::DelRequest("cn=x".into()),
            controls: vec![
                Control {
                    oid: crate::oid::MANAGE_DSA_IT.into(),
                    critical: true,
                    value: None,
                },
                Control {
                    oid: crate::oid::PAGED_RESULTS.into(),
                    critical: false,
                    value: Some(
                        crate::PagedResults {
                            size: 10,
                            cookie: vec![1, 2],
                        }
                        .encode(),
                    ),
                },
            ],
        });
        rt(msg(0, ProtocolOp::UnbindRequest));
        rt(msg(128, ProtocolOp::UnbindRequest));
        // A large entry forces multi-byte lengths at every level.
        let big = vec![b'v'; 70_000];
        rt(msg(
            7,
            ProtocolOp::SearchResultEntry(SearchResultEntry {
                dn: "cn=big".into(),
                attrs: vec![pa("description", &[&big, &big[..200]])],
            }),
        ));
    }

    #[test]
    fn simple_bind_known_bytes() {
        // ldapsearch -x (anonymous simple bind, message 1).
        let bytes = [
            0x30, 0x0c, 0x02, 0x01, 0x01, 0x60, 0x07, 0x02, 0x01, 0x03, 0x04, 0x00, 0x80, 0x00,
        ];
        let m = LdapMessage::decode(&bytes, &limits()).unwrap();
        assert_eq!(
            m,
            msg(
                1,
                ProtocolOp::BindRequest(BindRequest {
                    version: 3,
                    name: String::new(),
                    auth: BindAuth::Simple(vec![]),
                })
            )
        );
        assert_eq!(m.to_bytes(), bytes);
    }

    #[test]
    fn search_known_bytes() {
        // ldapsearch -x -b dc=example,dc=com -s base '(objectClass=*)' cn, message 2.
        let mut bytes = vec![0x30, 0x00, 0x02, 0x01, 0x02, 0x63, 0x00];
        let base = b"dc=example,dc=com";
        let mut body = vec![0x04, base.len() as u8];
        body.extend_from_slice(base);
        body.extend_from_slice(&[0x0a, 0x01, 0x00, 0x0a, 0x01, 0x00]);
        body.extend_from_slice(&[0x02, 0x01, 0x00, 0x02, 0x01, 0x00, 0x01, 0x01, 0x00]);
        body.extend_from_slice(&[0x87, 0x0b]);
        body.extend_from_slice(b"objectClass");
        body.extend_from_slice(&[0x30, 0x04, 0x04, 0x02, b'c', b'n']);
        bytes[6] = body.len() as u8;
        bytes.extend_from_slice(&body);
        bytes[1] = (bytes.len() - 2) as u8;
        let m = LdapMessage::decode(&bytes, &limits()).unwrap();
        let ProtocolOp::SearchRequest(s) = &m.op else {
            panic!("{m:?}")
        };
        assert_eq!(s.base, "dc=example,dc=com");
        assert_eq!(s.scope, Scope::Base);
        assert_eq!(s.filter, Filter::Present("objectClass".into()));
        assert_eq!(s.attrs, vec!["cn".to_string()]);
        assert_eq!(m.to_bytes(), bytes);
    }

    #[test]
    fn known_response_bytes() {
        // Successful BindResponse for message 1.
        let m = msg(
            1,
            ProtocolOp::BindResponse(BindResponse {
                result: LdapResult::success(),
                server_sasl_creds: None,
            }),
        );
        assert_eq!(
            m.to_bytes(),
            [0x30, 0x0c, 0x02, 0x01, 0x01, 0x61, 0x07, 0x0a, 0x01, 0x00, 0x04, 0x00, 0x04, 0x00]
        );
        // UnbindRequest, message 3.
        assert_eq!(
            msg(3, ProtocolOp::UnbindRequest).to_bytes(),
            [0x30, 0x05, 0x02, 0x01, 0x03, 0x42, 0x00]
        );
    }

    #[test]
    fn framing() {
        let full = [
            0x30, 0x0c, 0x02, 0x01, 0x01, 0x60, 0x07, 0x02, 0x01, 0x03, 0x04, 0x00, 0x80, 0x00,
        ];
        for i in 0..full.len() {
            assert_eq!(frame_length(&full[..i], 1000).unwrap(), None, "prefix {i}");
        }
        assert_eq!(frame_length(&full, 1000).unwrap(), Some(14));
        let mut two = full.to_vec();
        two.extend_from_slice(&full);
        assert_eq!(frame_length(&two, 1000).unwrap(), Some(14));
        assert_eq!(
            frame_length(&[0x30, 0x80], 1000),
            Err(FrameError::IndefiniteLength)
        );
        assert_eq!(
            frame_length(&[0x30, 0x85, 0, 0, 0, 0, 1], 1000),
            Err(FrameError::BadLength)
        );
        assert_eq!(
            frame_length(&[0x31, 0x00], 1000),
            Err(FrameError::BadTag(0x31))
        );
        // Oversize is refused from the header alone.
        assert_eq!(
            frame_length(&[0x30, 0x84, 0x7f, 0xff, 0xff, 0xff], 1 << 20),
            Err(FrameError::TooLarge {
                len: 6 + 0x7fff_ffff,
                max: 1 << 20
            })
        );
        assert_eq!(
            frame_length(&[0x30, 0x0c], 13),
            Err(FrameError::TooLarge { len: 14, max: 13 })
        );
        // Non-minimal long form is legal BER.
        let long = [0x30, 0x81, 0x03, 0x02, 0x01, 0x01];
        assert_eq!(frame_length(&long, 100).unwrap(), Some(6));
        assert_eq!(frame_length(&[0x30, 0x82, 0x01], 1000).unwrap(), None);
        assert_eq!(frame_length(&[], 1000).unwrap(), None);
    }

    fn wrap(id_and_op: &[u8]) -> Vec<u8> {
        let mut v = vec![0x30];
        ber::write_len(&mut v, id_and_op.len());
        v.extend_from_slice(id_and_op);
        v
    }

    #[test]
    fn rejections() {
        let l = limits();
        // Indefinite length inside.
        assert!(
            LdapMessage::decode(&[0x30, 0x80, 0x02, 0x01, 0x01, 0x42, 0x00, 0, 0], &l).is_err()
        );
        // Negative message ID.
        let e = LdapMessage::decode(&wrap(&[0x02, 0x01, 0xff, 0x42, 0x00]), &l).unwrap_err();
        assert_eq!(e.msg_id, None);
        // Message ID above maxInt.
        assert!(
            LdapMessage::decode(&wrap(&[0x02, 0x05, 0x00, 0x80, 0, 0, 0, 0x42, 0x00]), &l).is_err()
        );
        // Version 0 and 200.
        for v in [&[0x02, 0x01, 0x00][..], &[0x02, 0x02, 0x00, 0xc8][..]] {
            let mut op = v.to_vec();
            op.extend_from_slice(&[0x04, 0x00, 0x80, 0x00]);
            let mut b = vec![0x02, 0x01, 0x05, 0x60, op.len() as u8];
            b.extend_from_slice(&op);
            let e = LdapMessage::decode(&wrap(&b), &l).unwrap_err();
            assert_eq!(e.msg_id, Some(5));
            assert_eq!(e.op_tag, Some(0x60));
            assert!(e.reason.contains("version"), "{e}");
        }
        // 5-byte length.
        assert!(LdapMessage::decode(
            &[0x30, 0x85, 0, 0, 0, 0, 5, 0x02, 0x01, 0x01, 0x42, 0x00],
            &l
        )
        .is_err());
        // Truncated frame.
        assert!(LdapMessage::decode(&[0x30, 0x0c, 0x02, 0x01, 0x01], &l).is_err());
        // Trailing bytes after the message.
        assert!(
            LdapMessage::decode(&[0x30, 0x05, 0x02, 0x01, 0x01, 0x42, 0x00, 0x00], &l).is_err()
        );
        // Unknown application tag: error with msg_id.
        let e = LdapMessage::decode(&wrap(&[0x02, 0x01, 0x09, 0x7f, 0x00]), &l).unwrap_err();
        assert_eq!(e.msg_id, Some(9));
        let e = LdapMessage::decode(&wrap(&[0x02, 0x01, 0x09, 0x74, 0x00]), &l).unwrap_err();
        assert_eq!((e.msg_id, e.op_tag), (Some(9), Some(0x74)));
        // Unbind with contents.
        assert!(LdapMessage::decode(&wrap(&[0x02, 0x01, 0x01, 0x42, 0x01, 0x00]), &l).is_err());
        // Constructed DelRequest (0x6a instead of 0x4a).
        assert!(
            LdapMessage::decode(&wrap(&[0x02, 0x01, 0x01, 0x6a, 0x02, 0x04, 0x00]), &l).is_err()
        );
        // Missing op.
        let e = LdapMessage::decode(&wrap(&[0x02, 0x01, 0x04]), &l).unwrap_err();
        assert_eq!(e.msg_id, Some(4));
    }

    #[test]
    fn invalid_utf8_dn_has_msg_id() {
        let e = LdapMessage::decode(
            &wrap(&[0x02, 0x01, 0x07, 0x4a, 0x02, 0xc3, 0x28]),
            &limits(),
        )
        .unwrap_err();
        assert_eq!(e.msg_id, Some(7));
        assert_eq!(e.op_tag, Some(0x4a));
        assert!(e.reason.contains("UTF-8"), "{e}");
        let resp = ProtocolOp::response_for(
            e.op_tag.unwrap(),
            LdapResult::new(ResultCode::PROTOCOL_ERROR, e.reason.clone()),
        );
        assert!(matches!(resp, Some(ProtocolOp::DelResponse(_))));
    }

    fn search_with(mutate: impl Fn(&mut SearchRequest)) -> Vec<u8> {
        let mut s = SearchRequest {
            base: "dc=x".into(),
            scope: Scope::Sub,
            deref: DerefAliases::Never,
            size_limit: 0,
            time_limit: 0,
            types_only: false,
            filter: Filter::Present("cn".into()),
            attrs: vec![],
        };
        mutate(&mut s);
        msg(3, ProtocolOp::SearchRequest(s)).to_bytes()
    }

    #[test]
    fn search_field_checks() {
        let l = limits();
        // Scope 4 is not a known value. The scope byte follows "dc=x".
        let mut b = search_with(|_| {});
        let pos = b.windows(3).position(|w| w == [0x0a, 0x01, 0x02]).unwrap();
        b[pos + 2] = 4;
        let e = LdapMessage::decode(&b, &l).unwrap_err();
        assert!(e.reason.contains("scope"), "{e}");
        assert_eq!(e.op_tag, Some(0x63));
        // Negative size limit.
        let b = search_with(|s| s.size_limit = -1);
        assert!(LdapMessage::decode(&b, &l)
            .unwrap_err()
            .reason
            .contains("sizeLimit"));
        // Binary assertion value is fine.
        let b = search_with(|s| {
            s.filter = Filter::Equality(Ava {
                attr: "objectGUID".into(),
                value: vec![0xde, 0xad, 0x00, 0xbe, 0xef],
            })
        });
        assert!(LdapMessage::decode(&b, &l).is_ok());
        // Deep filter inside a message: error with msg_id, no stack overflow.
        let mut f = Filter::Present("a".into());
        for _ in 0..200 {
            f = Filter::Not(Box::new(f));
        }
        let b = search_with(|s| s.filter = f.clone());
        let e = LdapMessage::decode(&b, &l).unwrap_err();
        assert_eq!(e.msg_id, Some(3));
    }

    #[test]
    fn add_requires_values() {
        let m = msg(
            2,
            ProtocolOp::AddRequest(AddRequest {
                dn: "cn=x".into(),
                attrs: vec![pa("cn", &[])],
            }),
        );
        let e = LdapMessage::decode(&m.to_bytes(), &limits()).unwrap_err();
        assert_eq!((e.msg_id, e.op_tag), (Some(2), Some(0x68)));
    }

    #[test]
    fn trailing_extensions() {
        let l = limits();
        // A well-formed unknown trailing element in BindRequest's SASL
        // credentials, in ExtendedRequest and after the controls is ignored.
        let base = msg(
            4,
            ProtocolOp::ExtendedRequest(ExtendedRequest {
                name: "1.2.3".into(),
                value: None,
            }),
        )
        .to_bytes();
        // Append [5] primitive element inside the op.
        let mut inner = base[5..].to_vec(); // op TLV
        inner[1] += 3;
        inner.extend_from_slice(&[0x85, 0x01, 0x00]);
        let mut b = vec![0x02, 0x01, 0x04];
        b.extend_from_slice(&inner);
        assert!(LdapMessage::decode(&wrap(&b), &l).is_ok());
        // Garbage (not a TLV) is rejected.
        let mut inner = base[5..].to_vec();
        inner[1] += 1;
        inner.push(0x85);
        let mut b = vec![0x02, 0x01, 0x04];
        b.extend_from_slice(&inner);
        assert!(LdapMessage::decode(&wrap(&b), &l).is_err());
    }

    #[test]
    fn credentials_are_redacted() {
        let b = BindRequest {
            version: 3,
            name: "cn=x".into(),
            auth: BindAuth::Simple(b"hunter2".to_vec()),
        };
        let s = format!("{:?}", msg(1, ProtocolOp::BindRequest(b)));
        assert!(!s.contains("hunter2") && !s.contains("104, 117"), "{s}");
        assert!(s.contains("<redacted>"), "{s}");
        let b = BindAuth::Sasl {
            mechanism: "PLAIN".into(),
            credentials: Some(b"\0u\0hunter2".to_vec()),
        };
        let s = format!("{b:?}");
        assert!(!s.contains("hunter2") && s.contains("PLAIN"), "{s}");
        let e = ExtendedRequest {
            name: "1.3.6.1.4.1.4203.1.11.1".into(),
            value: Some(b"hunter2".to_vec()),
        };
        let s = format!("{e:?}");
        assert!(!s.contains("hunter2") && s.contains("7 bytes"), "{s}");
    }
}
