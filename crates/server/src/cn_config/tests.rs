use super::*;

fn change(op: ModOp, attr: &str, values: &[&str]) -> Change {
    Change {
        op,
        attr: pando_proto::PartialAttribute {
            name: attr.to_string(),
            values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        },
    }
}

fn attr_values(entries: &[(String, Entry)], dn: &str, attr: &str) -> Vec<String> {
    let (_, e) = entries.iter().find(|(d, _)| d == dn).unwrap();
    e.attrs
        .iter()
        .filter(|a| a.desc.eq_ignore_ascii_case(attr))
        .flat_map(|a| a.values.iter())
        .map(|v| String::from_utf8(v.clone()).unwrap())
        .collect()
}

#[test]
fn attribute_names_are_unique_and_numbers_too() {
    let mut names: Vec<String> = KEYS.iter().map(|k| k.attr().to_ascii_lowercase()).collect();
    let mut ns: Vec<u32> = KEYS.iter().map(|k| k.n).collect();
    names.sort();
    ns.sort();
    let (n1, m1) = (names.len(), ns.len());
    names.dedup();
    ns.dedup();
    assert_eq!(names.len(), n1);
    assert_eq!(ns.len(), m1);
    assert!(ns.iter().all(|n| *n < AT_NEXT_START_N));
    assert_eq!(
        key_named("store.durability").unwrap().attr(),
        "pandoStoreDurability"
    );
    assert_eq!(
        key_named("limits.anonymous.max_ops").unwrap().attr(),
        "olcConnMaxPending"
    );
}

#[test]
fn every_key_of_the_file_is_an_attribute() {
    // A configuration with every optional key set has no leaf without a key.
    let text = r#"
root_dn = "cn=root,dc=example,dc=com"
root_password_hash = "{SSHA}x"
user = "pando"
group = "pando"
schema_files = ["/x.schema"]
[[access]]
by = [{ who = "*", rights = "read" }]
[limits]
by = [{ who = "users", size_limit = 5 }]
[store]
keep_tombstones_days = 3
[auth]
break_glass = "ldapi-owner"
external_map = [{ pattern = "x", dn = "cn=y" }]
[tls]
cert_file = "/c"
key_file = "/k"
ca_file = "/ca"
[logs]
access = "/a"
audit = "/b"
[metrics]
listen = "9389"
"#;
    let cfg = Config::from_toml(text, std::path::Path::new("t.toml")).unwrap();
    for leaf in crate::live::leaves(&cfg).keys() {
        let covered = KEYS
            .iter()
            .any(|k| leaf == k.key || (k.form == Indexes && leaf.starts_with("indexes.")));
        assert!(covered, "{leaf} has no attribute under cn=config");
    }
    // And the entries read back as the same configuration.
    let entries = entries(&cfg, &cfg);
    let back = apply(&cfg, CONFIG_NORM, &[]).unwrap();
    assert_eq!(back, cfg);
    assert_eq!(
        attr_values(&entries, DATABASE_DN, "olcAccess"),
        vec!["{0}to * by * read".to_string()]
    );
    assert_eq!(
        attr_values(&entries, CONFIG_DN, "pandoMetricsListen"),
        vec!["9389"]
    );
    assert_eq!(
        attr_values(&entries, DATABASE_DN, "pandoLimitsBy"),
        vec!["{0}{ size_limit = 5, who = \"users\" }".to_string()]
    );
}

#[test]
fn ordered_values_insert_move_and_delete_like_olc_access() {
    let cfg = Config::default();
    let shown = entries(&cfg, &cfg);
    // The built-in rules are shown when none are configured.
    let builtin = attr_values(&shown, DATABASE_DN, "olcAccess");
    assert!(!builtin.is_empty() && builtin[0].starts_with("{0}to "));
    let cfg = apply(
        &cfg,
        DATABASE_NORM,
        &[change(
            ModOp::Replace,
            "olcAccess",
            &["to * by admins all", "to * by * read"],
        )],
    )
    .unwrap();
    assert_eq!(cfg.access.len(), 2);
    // Insert at {1}.
    let cfg = apply(
        &cfg,
        DATABASE_NORM,
        &[change(
            ModOp::Add,
            "olcAccess",
            &["{1}to attrs=userPassword by self write"],
        )],
    )
    .unwrap();
    let texts: Vec<String> = cfg.access.iter().map(rule_text::format).collect();
    assert_eq!(
        texts,
        [
            "to * by admins all",
            "to attrs=userPassword by self write",
            "to * by * read"
        ]
    );
    // Move {2} to the front: delete it, add it at {0}, in one modify.
    let cfg = apply(
        &cfg,
        DATABASE_NORM,
        &[
            change(ModOp::Delete, "olcAccess", &["{2}"]),
            change(ModOp::Add, "olcAccess", &["{0}to * by * read"]),
        ],
    )
    .unwrap();
    let texts: Vec<String> = cfg.access.iter().map(rule_text::format).collect();
    assert_eq!(
        texts,
        [
            "to * by * read",
            "to * by admins all",
            "to attrs=userPassword by self write"
        ]
    );
    // Delete by text.
    let cfg = apply(
        &cfg,
        DATABASE_NORM,
        &[change(ModOp::Delete, "olcAccess", &["to * by admins all"])],
    )
    .unwrap();
    assert_eq!(cfg.access.len(), 2);
}

#[test]
fn bad_modifications_name_the_attribute() {
    let cfg = Config::default();
    let cases: Vec<(&str, Change, ResultCode, &str)> = vec![
        (
            CONFIG_NORM,
            change(ModOp::Replace, "olcFoo", &["1"]),
            ResultCode::UNDEFINED_ATTRIBUTE_TYPE,
            "olcFoo",
        ),
        (
            CONFIG_NORM,
            change(ModOp::Replace, "olcSizeLimit", &["ten"]),
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            "olcSizeLimit: 'ten' is not an integer",
        ),
        (
            CONFIG_NORM,
            change(ModOp::Replace, "olcSizeLimit", &["1", "2"]),
            ResultCode::CONSTRAINT_VIOLATION,
            "takes one value",
        ),
        (
            CONFIG_NORM,
            change(ModOp::Add, "olcSizeLimit", &["1"]),
            ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
            "olcSizeLimit",
        ),
        (
            CONFIG_NORM,
            change(ModOp::Replace, "olcAccess", &["to * by * read"]),
            ResultCode::OBJECT_CLASS_VIOLATION,
            "belongs to olcDatabase={1}mdb,cn=config",
        ),
        (
            DATABASE_NORM,
            change(ModOp::Replace, "olcAccess", &["to * by nobody read"]),
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            "olcAccess: value {0}: 'nobody' is not a subject",
        ),
        (
            DATABASE_NORM,
            change(ModOp::Replace, "olcDbDirectory", &["/tmp"]),
            ResultCode::CONSTRAINT_VIOLATION,
            "cannot be changed",
        ),
        (
            DATABASE_NORM,
            change(ModOp::Delete, "olcSuffix", &["dc=nowhere"]),
            ResultCode::NO_SUCH_ATTRIBUTE,
            "no value 'dc=nowhere'",
        ),
        (
            DATABASE_NORM,
            change(ModOp::Replace, "olcDbIndex", &["uid"]),
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            "olcDbIndex: 'uid' is not an index",
        ),
        (
            DATABASE_NORM,
            change(ModOp::Replace, "pandoStoreWarmStart", &["yes"]),
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            "TRUE or FALSE",
        ),
        (
            DATABASE_NORM,
            change(ModOp::Replace, "pandoLimitsBy", &["who = 1"]),
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            "TOML inline table",
        ),
        (
            "cn=other,cn=config",
            change(ModOp::Replace, "olcSizeLimit", &["1"]),
            ResultCode::UNWILLING_TO_PERFORM,
            "only cn=config",
        ),
    ];
    for (norm, ch, code, says) in cases {
        let e = apply(&cfg, norm, &[ch]).unwrap_err();
        assert_eq!(e.code, code, "{says}: {}", e.message);
        assert!(e.message.contains(says), "{says}: {}", e.message);
    }
}

#[test]
fn a_change_elsewhere_leaves_the_built_in_rules_built_in() {
    let cfg = Config::default();
    let changed = apply(
        &cfg,
        DATABASE_NORM,
        &[change(ModOp::Add, "olcDbIndex", &["employeeNumber eq"])],
    )
    .unwrap();
    assert!(changed.access.is_empty());
    assert_eq!(changed.indexes["employeeNumber"], vec!["eq"]);
}

#[test]
fn indexes_read_as_olc_db_index() {
    let cfg = Config::default();
    let cfg = apply(
        &cfg,
        DATABASE_NORM,
        &[change(
            ModOp::Replace,
            "olcDbIndex",
            &["uid,mail eq,sub", "objectClass eq", "uid pres"],
        )],
    )
    .unwrap();
    assert_eq!(cfg.indexes.len(), 3);
    assert_eq!(cfg.indexes["uid"], vec!["eq", "sub", "pres"]);
    assert_eq!(cfg.indexes["mail"], vec!["eq", "sub"]);
    let cfg = apply(
        &cfg,
        DATABASE_NORM,
        &[change(ModOp::Delete, "olcDbIndex", &[])],
    )
    .unwrap();
    assert!(cfg.indexes.is_empty());
}

#[test]
fn the_schema_file_is_made_from_the_keys() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../model/schema/config.schema");
    let want = schema_text();
    if std::env::var_os("PANDO_WRITE_CONFIG_SCHEMA").is_some() {
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "{path} is not what the table of keys makes: run this test with PANDO_WRITE_CONFIG_SCHEMA=1"
    );
}

fn overlay_dn(rdn: &str) -> (Dn, String) {
    let dn = Dn::parse(&format!("olcOverlay={rdn},{DATABASE_DN}")).unwrap();
    let norm = format!("olcoverlay={},{DATABASE_NORM}", rdn.to_ascii_lowercase());
    (dn, norm)
}

fn attrs(list: &[(&str, &[&str])]) -> Vec<pando_proto::PartialAttribute> {
    list.iter()
        .map(|(a, vs)| pando_proto::PartialAttribute {
            name: a.to_string(),
            values: vs.iter().map(|v| v.as_bytes().to_vec()).collect(),
        })
        .collect()
}

#[test]
fn overlays_are_added_changed_ordered_and_removed_as_entries() {
    let base = Config::default();
    let (dn, norm) = overlay_dn("refint");
    let cfg = overlay_tree::add(
        &base,
        &dn,
        &norm,
        &attrs(&[
            ("objectClass", &["olcOverlayConfig", "olcRefintConfig"]),
            ("olcRefintAttribute", &["member", "manager"]),
        ]),
    )
    .unwrap();
    let (dn, norm) = overlay_dn("{0}unique");
    let cfg = overlay_tree::add(
        &cfg,
        &dn,
        &norm,
        &attrs(&[
            ("olcUniqueAttribute", &["mail"]),
            ("olcUniqueStrict", &["TRUE"]),
        ]),
    )
    .unwrap();
    // {0} put it first.
    let kinds: Vec<&str> = cfg.overlay.iter().map(|o| o.type_name()).collect();
    assert_eq!(kinds, ["unique", "refint"]);
    let entries = entries(&cfg, &cfg);
    let refint = format!("olcOverlay={{1}}refint,{DATABASE_DN}");
    assert_eq!(
        attr_values(&entries, &refint, "olcRefintAttribute"),
        ["member", "manager"]
    );
    assert_eq!(
        attr_values(
            &entries,
            &format!("olcOverlay={{0}}unique,{DATABASE_DN}"),
            "olcUniqueStrict"
        ),
        ["TRUE"]
    );
    // Modified by its numbered or its plain name.
    let cfg = overlay_tree::modify(
        &cfg,
        &overlay_dn("{1}refint").1,
        &[change(ModOp::Add, "olcRefintNothing", &["cn=nobody"])],
    )
    .unwrap();
    let cfg = overlay_tree::modify(
        &cfg,
        &overlay_dn("refint").1,
        &[change(ModOp::Delete, "olcRefintAttribute", &["manager"])],
    )
    .unwrap();
    match &cfg.overlay[1] {
        pando_config::OverlayConfig::Refint(r) => {
            assert_eq!(r.attributes, ["member"]);
            assert_eq!(r.nothing.as_deref(), Some("cn=nobody"));
        }
        other => panic!("{other:?}"),
    }
    // The wrong position names nothing.
    let e = overlay_tree::delete(&cfg, &overlay_dn("{0}refint").1).unwrap_err();
    assert_eq!(e.code, ResultCode::NO_SUCH_OBJECT);
    let cfg = overlay_tree::delete(&cfg, &overlay_dn("{0}unique").1).unwrap();
    assert_eq!(cfg.overlay.len(), 1);
    // Other changes keep the overlays.
    let back = apply(&cfg, CONFIG_NORM, &[]).unwrap();
    assert_eq!(back.overlay, cfg.overlay);
}

#[test]
fn bad_overlay_entries_name_the_problem() {
    let base = Config::default();
    let (dn, norm) = overlay_dn("syncprov");
    let e = overlay_tree::add(&base, &dn, &norm, &[]).unwrap_err();
    assert_eq!(e.code, ResultCode::UNWILLING_TO_PERFORM);
    assert!(e.message.contains("refint"), "{}", e.message);
    let (dn, norm) = overlay_dn("unique");
    let e = overlay_tree::add(
        &base,
        &dn,
        &norm,
        &attrs(&[
            ("olcUniqueAttribute", &["mail"]),
            ("olcUniqueURI", &["ldap:///"]),
        ]),
    )
    .unwrap_err();
    assert_eq!(e.code, ResultCode::UNDEFINED_ATTRIBUTE_TYPE);
    assert!(e.message.contains("olcUniqueBase"), "{}", e.message);
    let e = overlay_tree::add(
        &base,
        &dn,
        &norm,
        &attrs(&[
            ("olcUniqueAttribute", &["mail"]),
            ("olcUniqueStrict", &["maybe"]),
        ]),
    )
    .unwrap_err();
    assert_eq!(
        e.code,
        ResultCode::INVALID_ATTRIBUTE_SYNTAX,
        "{}",
        e.message
    );
    // Missing required settings are a syntax problem of the entry.
    let e = overlay_tree::add(&base, &dn, &norm, &[]).unwrap_err();
    assert!(e.message.contains("attributes"), "{}", e.message);
}

#[test]
fn consumer_passwords_read_hidden_and_stay_when_given_back() {
    let text = r#"
suffixes = ["dc=example,dc=com"]
[[replication.consumer]]
rid = 3
provider = "ldap://127.0.0.1:1389"
search_base = "dc=example,dc=com"
bind_dn = "cn=admin,dc=example,dc=com"
credentials = "s3cret"
"#;
    let stored = Config::from_toml(text, std::path::Path::new("t.toml")).unwrap();
    let entries = entries(&stored, &stored);
    let shown = attr_values(&entries, DATABASE_DN, "pandoReplicationConsumer");
    assert_eq!(shown.len(), 1);
    assert!(!shown[0].contains("s3cret") && shown[0].contains(r#"credentials = "****""#));
    // A change elsewhere, and the values written back as read: the
    // stored password stays.
    let size = change(ModOp::Replace, "olcSizeLimit", &["7"]);
    let after = apply(&stored, CONFIG_NORM, &[size]).unwrap();
    assert_eq!(after.replication.consumer, stored.replication.consumer);
    let back = change(ModOp::Replace, "pandoReplicationConsumer", &[&shown[0]]);
    let after = apply(&stored, DATABASE_NORM, &[back]).unwrap();
    assert_eq!(after.replication.consumer, stored.replication.consumer);
    // Another provider with the placeholder: it stays, and validation
    // refuses it.
    let moved = shown[0].replace("127.0.0.1:1389", "127.0.0.1:9");
    let moved = change(ModOp::Replace, "pandoReplicationConsumer", &[&moved]);
    let after = apply(&stored, DATABASE_NORM, &[moved]).unwrap();
    let c = &after.replication.consumer[0];
    assert_eq!(c.credentials.as_ref().unwrap().0, "****");
    assert_eq!(c.check().unwrap_err().0, "credentials");
}
