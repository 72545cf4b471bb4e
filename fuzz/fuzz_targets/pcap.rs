//! A packet capture from anyone: read without panicking, every stream put
//! back in order without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pando_proxy::pcap::{segments, Streams};

fuzz_target!(|data: &[u8]| {
    if let Ok((segs, _)) = segments(data) {
        let mut streams = Streams::default();
        for s in &segs {
            let _ = streams.add(s);
        }
    }
});
