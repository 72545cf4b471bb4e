use pando_model::{Attribute, Dn, Entry, Schema, Ternary};
use pando_proto::Filter;

use super::{merge, overridden_types, relax, Relaxed};

fn schema() -> Schema {
    Schema::standard()
}

fn entry(dn: &str, attrs: &[(&str, &[&str])]) -> Entry {
    Entry {
        dn: Dn::parse(dn).unwrap(),
        attrs: attrs
            .iter()
            .map(|(d, vs)| Attribute {
                desc: d.to_string(),
                values: vs.iter().map(|v| v.as_bytes().to_vec()).collect(),
            })
            .collect(),
    }
}

fn carol() -> Entry {
    entry(
        "uid=carol,ou=People,dc=example,dc=com",
        &[
            ("objectClass", &["top", "person", "inetOrgPerson"]),
            ("uid", &["carol"]),
            ("cn", &["Carol"]),
            ("sn", &["Smith"]),
            ("description", &["remote"]),
            ("mail", &["carol@example.com"]),
        ],
    )
}

fn part() -> Entry {
    entry(
        "uid=carol,ou=People,dc=example,dc=com",
        &[
            (
                "objectClass",
                &["top", "glue", "extensibleObject", "posixAccount"],
            ),
            ("uid", &["carol"]),
            ("description", &["local one", "local two"]),
            ("entryCSN", &["20261127000000.000000Z#000000#000#000000"]),
        ],
    )
}

fn relaxed(s: &Schema, f: &str, types: &[&str]) -> Relaxed {
    let types: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    relax(s, &Filter::parse(f).unwrap(), &types)
}

fn text(r: Relaxed) -> String {
    match r {
        Relaxed::All => "ALL".into(),
        Relaxed::None => "NONE".into(),
        Relaxed::Filter(f) => f.to_string(),
    }
}

#[test]
fn a_part_overrides_its_user_attributes_and_adds_classes() {
    let s = schema();
    let m = merge(&s, carol(), &part());
    assert_eq!(
        m.values("description"),
        &[b"local one".to_vec(), b"local two".to_vec()]
    );
    assert_eq!(m.values("mail"), &[b"carol@example.com".to_vec()]);
    assert_eq!(m.values("uid"), &[b"carol".to_vec()]);
    let classes: Vec<String> = m
        .values("objectClass")
        .iter()
        .map(|v| String::from_utf8_lossy(v).to_lowercase())
        .collect();
    assert!(classes.contains(&"posixaccount".into()), "{classes:?}");
    assert!(!classes.contains(&"glue".into()), "{classes:?}");
    assert!(!classes.contains(&"extensibleobject".into()), "{classes:?}");
    // The part's own bookkeeping (entryCSN) is not shown over the remote's.
    assert!(m.get("entryCSN").is_none());
}

#[test]
fn overridden_types_leave_out_the_rdn_and_operational_attributes() {
    let s = schema();
    let mut t = overridden_types(&s, &part());
    t.sort();
    assert_eq!(
        t,
        vec!["description".to_string(), "objectclass".to_string()]
    );
    // A glue part (RDN only) overrides nothing.
    let glue = entry(
        "ou=People,dc=example,dc=com",
        &[
            ("objectClass", &["top", "glue", "extensibleObject"]),
            ("ou", &["People"]),
        ],
    );
    assert!(overridden_types(&s, &glue).is_empty());
}

#[test]
fn relaxing_loosens_only_the_overridden_tests_by_polarity() {
    let s = schema();
    assert_eq!(
        text(relaxed(&s, "(uid=carol)", &["description"])),
        "(uid=carol)"
    );
    assert_eq!(
        text(relaxed(&s, "(description=x)", &["description"])),
        "ALL"
    );
    assert_eq!(
        text(relaxed(&s, "(!(description=x))", &["description"])),
        "ALL"
    );
    assert_eq!(
        text(relaxed(&s, "(&(uid=c*)(description=x))", &["description"])),
        "(uid=c*)"
    );
    assert_eq!(
        text(relaxed(&s, "(|(uid=c*)(description=x))", &["description"])),
        "ALL"
    );
    assert_eq!(
        text(relaxed(
            &s,
            "(&(uid=c*)(!(|(description=x)(sn=y))))",
            &["description"]
        )),
        "(&(uid=c*)(!(sn=y)))"
    );
    // Names are compared as the schema knows them (an alias, any case).
    assert_eq!(text(relaxed(&s, "(commonName=x)", &["cn"])), "ALL");
    // Extensible matches on any attribute may test an overridden one.
    assert_eq!(text(relaxed(&s, "(:caseIgnoreMatch:=x)", &["cn"])), "ALL");
    assert_eq!(
        text(relaxed(&s, "(!(:caseIgnoreMatch:=x))", &["cn"])),
        "ALL"
    );
    assert_eq!(
        text(relaxed(&s, "(:caseIgnoreMatch:=x)", &[])),
        "(:caseIgnoreMatch:=x)"
    );
}

/// The property searches rely on: whenever a merged entry matches the
/// filter, its remote entry matches the relaxed one.
#[test]
fn the_relaxed_filter_holds_for_every_remote_entry_whose_merge_matches() {
    let s = schema();
    let p = part();
    let types = overridden_types(&s, &p);
    let remote_variants = [
        carol(),
        entry(
            "uid=carol,ou=People,dc=example,dc=com",
            &[
                ("objectClass", &["top", "person"]),
                ("uid", &["carol"]),
                ("cn", &["C"]),
                ("sn", &["Jones"]),
            ],
        ),
    ];
    let filters = [
        "(description=local one)",
        "(&(description=local*)(sn=Smith))",
        "(|(description=remote)(mail=*))",
        "(!(description=remote))",
        "(&(objectClass=posixAccount)(!(sn=Jones)))",
        "(!(&(objectClass=person)(description=local two)))",
        "(|(!(cn=C))(description=nothing))",
    ];
    for r in &remote_variants {
        let merged = merge(&s, r.clone(), &p);
        for f in filters {
            let filter = Filter::parse(f).unwrap();
            let merged_matches = s.compile_filter(&filter).matches(&s, &merged) == Ternary::True;
            let remote_matches = match relax(&s, &filter, &types) {
                Relaxed::All => true,
                Relaxed::None => false,
                Relaxed::Filter(g) => s.compile_filter(&g).matches(&s, r) == Ternary::True,
            };
            assert!(
                !merged_matches || remote_matches,
                "{f}: the merged entry matches, the remote one is not asked for"
            );
        }
    }
}
