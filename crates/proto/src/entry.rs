//! Hot-path encoder for SearchResultEntry messages.
//!
//! A search may return millions of entries; building a `SearchResultEntry`
//! with owned `PartialAttribute` vectors for each would copy every value
//! twice. `EntryEncoder` writes the LDAPMessage straight into the output
//! buffer from borrowed bytes:
//!
//! ```text
//! LDAPMessage ::= SEQUENCE {                        <- msg mark
//!      messageID  MessageID,
//!      protocolOp SearchResultEntry,                <- op mark
//!      controls   [0] Controls OPTIONAL }
//! SearchResultEntry ::= [APPLICATION 4] SEQUENCE {
//!      objectName      LDAPDN,
//!      attributes      PartialAttributeList }      <- attrs mark
//! PartialAttribute ::= SEQUENCE {
//!      type       AttributeDescription,
//!      vals       SET OF value AttributeValue }
//! ```
//!
//! Lengths are fixed up as each constructed element closes (see
//! [`ber::end`]). The caller is trusted to pass a UTF-8 DN and attribute
//! names; the encoder does not re-check bytes that come from the store.

use crate::ber::{self, tag};
use crate::controls::{encode_controls, Control};
use crate::message::op_tag;

/// Appends one SearchResultEntry LDAPMessage to a buffer.
///
/// ```
/// let mut out = Vec::new();
/// let mut e = pando_proto::EntryEncoder::begin(&mut out, 2, b"cn=a,dc=x");
/// e.attr(b"cn", [&b"a"[..]]);
/// e.attr_names_only(b"sn");
/// e.finish();
/// assert_eq!(out[0], 0x30);
/// ```
pub struct EntryEncoder<'a> {
    out: &'a mut Vec<u8>,
    /// Marks of the open LDAPMessage (None for a bare entry),
    /// SearchResultEntry and PartialAttributeList elements, closed
    /// innermost first by `finish`.
    msg: Option<usize>,
    op: usize,
    attrs: usize,
}

impl<'a> EntryEncoder<'a> {
    /// Starts the message: header, message ID, objectName.
    pub fn begin(out: &'a mut Vec<u8>, msg_id: i32, dn: &[u8]) -> Self {
        let msg = ber::begin(out, tag::SEQUENCE);
        ber::write_int(out, tag::INTEGER, i64::from(msg_id));
        let op = ber::begin(out, op_tag::SEARCH_RESULT_ENTRY);
        ber::write_tlv(out, tag::OCTET_STRING, dn);
        let attrs = ber::begin(out, tag::SEQUENCE);
        EntryEncoder {
            out,
            msg: Some(msg),
            op,
            attrs,
        }
    }

    /// Starts a SearchResultEntry on its own, not inside an LDAPMessage:
    /// the value of the pre-read and post-read response controls (RFC 4527).
    pub fn begin_bare(out: &'a mut Vec<u8>, dn: &[u8]) -> Self {
        let op = ber::begin(out, op_tag::SEARCH_RESULT_ENTRY);
        ber::write_tlv(out, tag::OCTET_STRING, dn);
        let attrs = ber::begin(out, tag::SEQUENCE);
        EntryEncoder {
            out,
            msg: None,
            op,
            attrs,
        }
    }

    /// Appends one attribute with its values.
    pub fn attr<'v, I>(&mut self, name: &[u8], values: I) -> &mut Self
    where
        I: IntoIterator<Item = &'v [u8]>,
    {
        let m = ber::begin(self.out, tag::SEQUENCE);
        ber::write_tlv(self.out, tag::OCTET_STRING, name);
        let s = ber::begin(self.out, tag::SET);
        for v in values {
            ber::write_tlv(self.out, tag::OCTET_STRING, v);
        }
        ber::end(self.out, s);
        ber::end(self.out, m);
        self
    }

    /// Appends an attribute with an empty value set (typesOnly searches).
    pub fn attr_names_only(&mut self, name: &[u8]) -> &mut Self {
        self.attr(name, std::iter::empty())
    }

    /// Closes the message.
    pub fn finish(self) {
        self.finish_with_controls(&[]);
    }

    /// Closes the message, attaching response controls (e.g. the RFC 4533
    /// Sync State control; none can follow a bare entry).
    pub fn finish_with_controls(self, controls: &[Control]) {
        ber::end(self.out, self.attrs);
        ber::end(self.out, self.op);
        if let Some(msg) = self.msg {
            encode_controls(self.out, controls);
            ber::end(self.out, msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DecodeLimits, LdapMessage, PartialAttribute, ProtocolOp, SearchResultEntry};

    fn via_struct(
        id: i32,
        dn: &str,
        attrs: Vec<PartialAttribute>,
        controls: Vec<Control>,
    ) -> Vec<u8> {
        LdapMessage {
            id,
            op: ProtocolOp::SearchResultEntry(SearchResultEntry {
                dn: dn.into(),
                attrs,
            }),
            controls,
        }
        .to_bytes()
    }

    #[test]
    fn matches_generic_encoder() {
        let big = vec![b'x'; 5000];
        let mut out = vec![0xaa]; // existing buffer contents are preserved
        let mut e = EntryEncoder::begin(&mut out, 300, b"cn=a,dc=example,dc=com");
        e.attr(b"objectClass", [&b"top"[..], b"person"])
            .attr(b"description", [&big[..]])
            .attr_names_only(b"sn");
        e.finish();
        let expected = via_struct(
            300,
            "cn=a,dc=example,dc=com",
            vec![
                PartialAttribute {
                    name: "objectClass".into(),
                    values: vec![b"top".to_vec(), b"person".to_vec()],
                },
                PartialAttribute {
                    name: "description".into(),
                    values: vec![big.clone()],
                },
                PartialAttribute {
                    name: "sn".into(),
                    values: vec![],
                },
            ],
            vec![],
        );
        assert_eq!(out[0], 0xaa);
        assert_eq!(&out[1..], &expected[..]);
        assert!(LdapMessage::decode(&out[1..], &DecodeLimits::default()).is_ok());
    }

    #[test]
    fn bare_entry_is_the_protocol_op() {
        let mut whole = Vec::new();
        let mut e = EntryEncoder::begin(&mut whole, 1, b"cn=x");
        e.attr(b"cn", [&b"x"[..]]);
        e.finish();
        let mut bare = Vec::new();
        let mut e = EntryEncoder::begin_bare(&mut bare, b"cn=x");
        e.attr(b"cn", [&b"x"[..]]);
        e.finish();
        // LDAPMessage = 30 len 02 01 01 <op>
        assert_eq!(&whole[5..], &bare[..]);
    }

    #[test]
    fn empty_entry_and_controls() {
        let mut out = Vec::new();
        EntryEncoder::begin(&mut out, 1, b"").finish();
        assert_eq!(out, via_struct(1, "", vec![], vec![]));
        let c = vec![Control {
            oid: crate::oid::SYNC_STATE.into(),
            critical: false,
            value: Some(vec![0x30, 0x00]),
        }];
        let mut out = Vec::new();
        let mut e = EntryEncoder::begin(&mut out, 5, b"cn=x");
        e.attr(b"cn", [&b"x"[..]]);
        e.finish_with_controls(&c);
        let expected = via_struct(
            5,
            "cn=x",
            vec![PartialAttribute {
                name: "cn".into(),
                values: vec![b"x".to_vec()],
            }],
            c,
        );
        assert_eq!(out, expected);
    }
}
