//! Decodes arbitrary bytes as a replica digest request (what a client
//! sends the server) and as the two kinds of answer (what a peer sends
//! `pando repl check`). None may panic; what decodes must encode to text
//! that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pando_server::ops::digest::{self, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Request::decode(data) {
        assert_eq!(Request::decode(&r.encode()).expect("re-decodes"), r);
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(nodes) = digest::decode_nodes(&text) {
        let again = digest::decode_nodes(&digest::encode_nodes(&nodes)).expect("re-decodes");
        assert_eq!(again, nodes);
    }
    if let Ok((listed, deleted)) = digest::decode_entries(&text) {
        let _ = digest::encode_entries(&listed, &deleted);
    }
});
