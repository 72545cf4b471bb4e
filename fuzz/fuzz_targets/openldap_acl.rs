//! OpenLDAP access rules (`pando migrate`): any text split into words and
//! translated must not panic, and a translated rule must be one Pando
//! compiles whenever its DNs and attributes are valid (the translator
//! never invents rights or subject forms Pando does not know).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pando_model::Schema;

fn schema() -> &'static Schema {
    static S: OnceLock<Schema> = OnceLock::new();
    S.get_or_init(Schema::standard)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(words) = pando_migrate::source::words(text) else {
        return;
    };
    let Ok(t) = pando_migrate::acl::translate(&words) else {
        return;
    };
    let rule = t.to_rule();
    if let Err((_, key, why)) = pando_access::acl::Acl::compile(&[rule.clone()], schema()) {
        // DNs, regular expressions, filters and attribute names come from
        // the input and may be invalid; rights and subject words may not.
        assert!(
            !(key == "by.rights" || (key == "by.who" && why.contains("is not a subject"))),
            "{text:?} translated to a rule Pando refuses at {key}: {why}\n{rule:?}"
        );
    }
});
