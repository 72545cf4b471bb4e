//! The proxy's message-ID rewriting on any bytes: never panics, and a
//! split message rebuilt with another ID splits into the same parts.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pando_proxy::frame::{split, with_id};

fuzz_target!(|data: &[u8]| {
    if let Some((id, tag, rest)) = split(data) {
        let mut out = Vec::new();
        with_id(id ^ 0x5a5a, rest, &mut out);
        assert_eq!(split(&out), Some((id ^ 0x5a5a, tag, rest)));
    }
});
