//! Decodes arbitrary bytes as the value of every control the server
//! parses. None may panic; values that decode and have an encoder must
//! encode to bytes that decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pando_proto::control_values as cv;
use pando_proto::{DecodeLimits, PagedResults};

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits::default();
    let _ = cv::decode_assertion(data, &limits);
    let _ = cv::decode_attribute_selection(data);
    let _ = cv::decode_subentries(data);
    if let Ok(keys) = cv::decode_sort_request(data, &limits) {
        assert!(keys.len() <= limits.max_sort_keys + 1);
    }
    let _ = cv::decode_matched_values(data, &limits);
    let _ = cv::decode_valsort(data);
    let _ = PagedResults::decode(data);
    if let Ok(v) = cv::VlvRequest::decode(data) {
        assert_eq!(cv::VlvRequest::decode(&v.encode()).expect("re-decodes"), v);
    }
    if let Ok(v) = cv::VlvResponse::decode(data) {
        assert_eq!(cv::VlvResponse::decode(&v.encode()).expect("re-decodes"), v);
    }
    if let Ok(p) = cv::PersistentSearch::decode(data) {
        assert_eq!(cv::PersistentSearch::decode(&p.encode()).expect("re-decodes"), p);
    }
});
