//! Parses arbitrary strings as RFC 4514 DNs. A parsed DN printed and parsed
//! again must be the same DN, and schema normalisation must not panic and
//! must be idempotent.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pando_model::{Dn, Schema};

fn schema() -> &'static Schema {
    static S: OnceLock<Schema> = OnceLock::new();
    S.get_or_init(Schema::standard)
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(dn) = Dn::parse(s) else {
        return;
    };
    let printed = dn.to_string();
    // Escaping can make the printed form longer than the parser's length
    // limit; only forms within it must parse back.
    if printed.len() > pando_model::dn::MAX_DN_LEN {
        return;
    }
    let again = Dn::parse(&printed).unwrap_or_else(|e| panic!("{s:?} printed as {printed:?}: {e}"));
    assert_eq!(again, dn, "{s:?} printed as {printed:?}");
    if let Ok(norm) = schema().normalize_dn(&dn) {
        let reparsed = Dn::parse(&norm).unwrap_or_else(|e| panic!("normalised {norm:?} does not parse: {e}"));
        let norm2 = schema().normalize_dn(&reparsed).expect("normalised DN normalises");
        assert_eq!(norm, norm2, "normalisation of {s:?} is not idempotent");
    }
});
