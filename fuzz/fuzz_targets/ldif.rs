//! Reads arbitrary bytes as LDIF: the reader must return records or errors,
//! never panic or loop.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pando_ldif::{LdifReader, ReaderOptions};

fuzz_target!(|data: &[u8]| {
    let opts = ReaderOptions { max_record_bytes: 1 << 16, ..ReaderOptions::default() };
    for (n, rec) in LdifReader::new(data, opts).enumerate() {
        let _ = rec;
        assert!(n <= data.len() + 1, "more records than input bytes");
    }
});
