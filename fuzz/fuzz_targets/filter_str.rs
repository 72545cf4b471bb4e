//! Parses arbitrary strings as RFC 4515 filters. Parsed filters must
//! survive a BER round trip, and printing a parsed filter then parsing it
//! again must give the same filter back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pando_proto::{DecodeLimits, Filter};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(f) = Filter::parse(s) else {
        return;
    };
    assert!(f.depth() <= pando_proto::STRING_FILTER_MAX_DEPTH);

    let printed = f.to_string();
    match Filter::parse(&printed) {
        Ok(g) => assert_eq!(g, f, "{s:?} printed as {printed:?}"),
        Err(e) => panic!("{s:?} printed as {printed:?}, which does not parse: {e}"),
    }

    let mut ber = Vec::new();
    f.encode(&mut ber);
    let limits = DecodeLimits {
        max_depth: pando_proto::STRING_FILTER_MAX_DEPTH,
        max_filter_terms: usize::MAX,
        ..DecodeLimits::default()
    };
    let mut r = pando_proto::ber::Reader::new(&ber);
    let (tag, body) = r.read_tlv().expect("own encoding is a TLV");
    assert!(r.is_empty());
    let back = Filter::decode(tag, body, &limits).expect("own encoding decodes");
    assert_eq!(back, f);
});
