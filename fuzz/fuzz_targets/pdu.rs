//! Frames and decodes arbitrary bytes as a stream of LDAPMessages. Every
//! decoded message must re-encode to bytes that frame as one PDU and decode
//! back to an equal message, and re-encoding must be stable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pando_proto::{frame_length, DecodeLimits, Filter, LdapMessage, ProtocolOp};

const MAX_PDU: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits::default();
    let mut rest = data;
    while let Ok(Some(len)) = frame_length(rest, MAX_PDU) {
        let Some((frame, tail)) = (len <= rest.len()).then(|| rest.split_at(len)) else {
            panic!(
                "frame_length returned {len} for a {}-byte buffer",
                rest.len()
            );
        };
        rest = tail;
        let Ok(msg) = LdapMessage::decode(frame, &limits) else {
            continue;
        };
        let bytes = msg.to_bytes();
        assert_eq!(
            frame_length(&bytes, usize::MAX).ok(),
            Some(Some(bytes.len()))
        );
        let again = match LdapMessage::decode(&bytes, &limits) {
            Ok(m) => m,
            Err(e) => panic!("re-encoded message does not decode: {e}\n{msg:?}"),
        };
        assert_eq!(again, msg);
        assert_eq!(again.to_bytes(), bytes);
        if let ProtocolOp::SearchRequest(s) = &msg.op {
            // Display must not panic and stays within the decode limits.
            let _ = s.filter.to_string();
            assert!(s.filter.depth() <= limits.max_depth);
            assert!(s.filter.term_count() <= limits.max_filter_terms);
            // The printed form must be accepted by the string parser unless
            // the BER filter used something the string syntax cannot say
            // (attribute names outside RFC 4512's characters, empty pieces).
            let _ = Filter::parse(&s.filter.to_string());
        }
    }
});
