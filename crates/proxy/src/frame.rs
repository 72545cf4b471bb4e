//! A framed LDAPMessage's message ID read and replaced without decoding
//! the rest: what the proxy does to every message it relays.
//!
//! ```text
//! LDAPMessage ::= SEQUENCE {            30 LEN
//!      messageID       MessageID,        02 L id (1..4 octets, 0..maxInt)
//!      protocolOp      CHOICE { ... },   the op's tag first
//!      controls   [0]  Controls OPTIONAL }
//! ```

/// The message ID, the protocolOp's tag, and every byte after the ID
/// (protocolOp and controls, copied as they are). None when the frame is
/// not an LDAPMessage with a valid ID (the caller treats it as garbage).
pub fn split(frame: &[u8]) -> Option<(i32, u8, &[u8])> {
    if *frame.first()? != 0x30 {
        return None;
    }
    let first = *frame.get(1)?;
    let header = if first < 0x80 {
        2
    } else {
        2 + usize::from(first & 0x7f)
    };
    let body = frame.get(header..)?;
    if *body.first()? != 0x02 {
        return None;
    }
    let n = usize::from(*body.get(1)?);
    if n == 0 || n > 4 {
        return None;
    }
    let octets = body.get(2..2 + n)?;
    if octets[0] & 0x80 != 0 {
        return None; // negative: not a MessageID
    }
    let id = octets.iter().fold(0i64, |a, &b| (a << 8) | i64::from(b));
    let id = i32::try_from(id).ok()?;
    let rest = body.get(2 + n..)?;
    Some((id, *rest.first()?, rest))
}

/// The LDAPMessage made of `id` and `rest` (from [`split`]).
pub fn with_id(id: i32, rest: &[u8], out: &mut Vec<u8>) {
    let id = id.max(0) as u32;
    let mut bytes = id.to_be_bytes().to_vec();
    while bytes.len() > 1 && bytes[0] == 0 && bytes[1] & 0x80 == 0 {
        bytes.remove(0);
    }
    let len = 2 + bytes.len() + rest.len();
    out.push(0x30);
    push_length(len, out);
    out.push(0x02);
    out.push(bytes.len() as u8);
    out.extend_from_slice(&bytes);
    out.extend_from_slice(rest);
}

fn push_length(len: usize, out: &mut Vec<u8>) {
    if len < 0x80 {
        out.push(len as u8);
        return;
    }
    let bytes = (len as u64).to_be_bytes();
    let skip = bytes.iter().take_while(|&&b| b == 0).count();
    out.push(0x80 | (8 - skip) as u8);
    out.extend_from_slice(&bytes[skip..]);
}

/// Requests that end with one response, and the responses that end a
/// request (a search's entries, references and intermediate responses do
/// not).
pub fn is_final_response(tag: u8) -> bool {
    !matches!(tag, 0x64 | 0x73 | 0x79)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::{DecodeLimits, LdapMessage, LdapResult, ProtocolOp};

    #[test]
    fn an_id_is_replaced_and_the_rest_kept() {
        for (old, new) in [(1, 2), (127, 128), (5, 70_000), (300, 1), (1, i32::MAX)] {
            let msg = LdapMessage {
                id: old,
                op: ProtocolOp::DelResponse(LdapResult::success()),
                controls: Vec::new(),
            };
            let frame = msg.to_bytes();
            let (id, tag, rest) = split(&frame).unwrap();
            assert_eq!((id, tag), (old, 0x6b));
            let mut out = Vec::new();
            with_id(new, rest, &mut out);
            let back = LdapMessage::decode(&out, &DecodeLimits::default()).unwrap();
            assert_eq!(back.id, new);
            assert_eq!(back.op, msg.op);
        }
        // A long message (length in two octets) keeps its body.
        let big = LdapMessage {
            id: 9,
            op: ProtocolOp::DelResponse(LdapResult::new(
                pando_proto::ResultCode::OTHER,
                "x".repeat(1000),
            )),
            controls: Vec::new(),
        };
        let frame = big.to_bytes();
        let (_, _, rest) = split(&frame).unwrap();
        let mut out = Vec::new();
        with_id(1_000_000, rest, &mut out);
        let back = LdapMessage::decode(&out, &DecodeLimits::default()).unwrap();
        assert_eq!((back.id, back.op), (1_000_000, big.op));
    }

    #[test]
    fn any_bytes_split_or_not_and_round_trip() {
        // A fixed pseudo-random sequence (xorshift), framed like a message
        // now and then.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            if x.is_multiple_of(3) && len > 4 {
                bytes[0] = 0x30;
                bytes[1] = (len - 2) as u8;
                bytes[2] = 0x02;
                bytes[3] = 1;
            }
            if let Some((id, tag, rest)) = split(&bytes) {
                let mut out = Vec::new();
                with_id(id.wrapping_add(1).max(0), rest, &mut out);
                assert_eq!(split(&out), Some((id.wrapping_add(1).max(0), tag, rest)));
            }
        }
    }

    #[test]
    fn garbage_is_not_split() {
        for bad in [
            &[][..],
            &[0x31, 0x03, 0x02, 0x01, 0x01],
            &[0x30, 0x03, 0x04, 0x01, 0x01],
            &[0x30, 0x03, 0x02, 0x01, 0x81],
            &[0x30, 0x03, 0x02, 0x05, 0x01],
            &[0x30, 0x03, 0x02, 0x01, 0x01],
        ] {
            assert!(split(bad).is_none(), "{bad:?}");
        }
    }
}
