//! Overlays through the write pipeline, on a real store (the whole
//! server is assembled here, so these tests live in the server crate).

use std::sync::Arc;

use pando_model::{Dn, Entry, Schema};
use pando_proto::{
    AddRequest, ModOp, ModifyDnRequest, ModifyRequest, PartialAttribute, ResultCode,
};

use crate::error::OpResult;
use crate::ops::controls::Requested;
use crate::ops::write::{self, WriteCtx};
use crate::overlays::related;
use crate::settings::Validate;
use crate::state::Server;
use crate::test_server::{server, user};

const BASE: &str = "dc=example,dc=com";

/// A server with `overlays` (TOML), ou=People and ou=Groups, users a, b, c.
struct Fixture {
    _dir: tempfile::TempDir,
    server: Arc<Server>,
    rt: tokio::runtime::Runtime,
}

impl Fixture {
    fn new(overlays: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path(), overlays);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let f = Fixture {
            _dir: dir,
            server,
            rt,
        };
        for ou in ["People", "Groups"] {
            f.add(
                &format!("ou={ou},{BASE}"),
                &[("objectClass", &["organizationalUnit"]), ("ou", &[ou])],
            )
            .unwrap();
        }
        for u in ["a", "b", "c"] {
            f.add(
                &format!("uid={u},ou=People,{BASE}"),
                &[
                    ("objectClass", &["inetOrgPerson"]),
                    ("uid", &[u]),
                    ("cn", &[u]),
                    ("sn", &[u]),
                    ("mail", &[&format!("{u}@example.com")]),
                ],
            )
            .unwrap();
        }
        f
    }

    fn ctx(&self) -> Arc<WriteCtx> {
        let admin = user(&self.server, &format!("cn=admin,{BASE}"), true);
        WriteCtx::new(&self.server, &admin, Requested::default())
    }

    fn add(&self, dn: &str, attrs: &[(&str, &[&str])]) -> OpResult<()> {
        let req = AddRequest {
            dn: dn.into(),
            attrs: attrs
                .iter()
                .map(|(a, vs)| PartialAttribute {
                    name: a.to_string(),
                    values: vs.iter().map(|v| v.as_bytes().to_vec()).collect(),
                })
                .collect(),
        };
        self.rt.block_on(write::add(self.ctx(), req)).map(|_| ())
    }

    fn modify(&self, dn: &str, op: ModOp, attr: &str, values: &[&str]) -> OpResult<()> {
        let req = ModifyRequest {
            dn: dn.into(),
            changes: vec![pando_proto::Change {
                op,
                attr: PartialAttribute {
                    name: attr.into(),
                    values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
                },
            }],
        };
        self.rt.block_on(write::modify(self.ctx(), req)).map(|_| ())
    }

    fn delete(&self, dn: &str) -> OpResult<()> {
        self.rt
            .block_on(write::delete(self.ctx(), dn.to_string()))
            .map(|_| ())
    }

    fn rename(&self, dn: &str, rdn: &str, superior: Option<&str>) -> OpResult<()> {
        let req = ModifyDnRequest {
            dn: dn.into(),
            new_rdn: rdn.into(),
            delete_old_rdn: true,
            new_superior: superior.map(String::from),
        };
        self.rt
            .block_on(write::modify_dn(self.ctx(), req))
            .map(|_| ())
    }

    fn entry(&self, dn: &str) -> Option<Entry> {
        let rtxn = self.server.rt.store.read().unwrap();
        let view = rtxn.view();
        let rdns = view.normalize_rdns(&Dn::parse(dn).unwrap()).unwrap();
        match view.lookup_norm(&rdns).unwrap() {
            pando_store::Lookup::Found(id) => view.entry(id).unwrap(),
            pando_store::Lookup::Missing { .. } => None,
        }
    }

    /// The values of `attr` of `dn`, lower-cased and sorted.
    fn values(&self, dn: &str, attr: &str) -> Vec<String> {
        let e = self.entry(dn).unwrap_or_else(|| panic!("{dn} is missing"));
        let mut v: Vec<String> = e
            .values(attr)
            .iter()
            .map(|v| String::from_utf8_lossy(v).to_lowercase())
            .collect();
        v.sort();
        v
    }
}

fn people(u: &str) -> String {
    format!("uid={u},ou=people,{BASE}")
}

fn group(g: &str) -> String {
    format!("cn={g},ou=groups,{BASE}")
}

fn add_group(f: &Fixture, g: &str, members: &[&str]) {
    let members: Vec<String> = members.iter().map(|m| people(m)).collect();
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    f.add(
        &group(g),
        &[
            ("objectClass", &["groupOfNames"]),
            ("cn", &[g]),
            ("member", &refs),
        ],
    )
    .unwrap();
}

const REFINT: &str = "[[overlay]]\ntype = \"refint\"\n";
const MEMBEROF: &str = "[[overlay]]\ntype = \"memberof\"\n";

#[test]
fn refint_removes_and_renames_references_in_the_same_operation() {
    let f = Fixture::new(REFINT);
    add_group(&f, "g", &["a", "b"]);
    f.delete(&people("a")).unwrap();
    assert_eq!(f.values(&group("g"), "member"), vec![people("b")]);
    f.rename(&people("b"), "uid=bee", None).unwrap();
    assert_eq!(f.values(&group("g"), "member"), vec![people("bee")]);
    // The group's change is stamped with the operation.
    assert!(f.entry(&group("g")).unwrap().get("entryCSN").is_some());
}

#[test]
fn refint_refuses_to_empty_a_required_attribute_unless_given_a_nothing_value() {
    let f = Fixture::new(REFINT);
    add_group(&f, "g", &["a"]);
    let e = f.delete(&people("a")).expect_err("the group's last member");
    assert_eq!(e.code, ResultCode::OBJECT_CLASS_VIOLATION, "{}", e.message);
    assert!(e.message.contains("olcRefintNothing"), "{}", e.message);
    assert!(f.entry(&people("a")).is_some(), "nothing changed");
    assert_eq!(f.values(&group("g"), "member"), vec![people("a")]);

    let f = Fixture::new(&format!("{REFINT}nothing = \"cn=nobody\"\n"));
    add_group(&f, "g", &["a"]);
    f.delete(&people("a")).unwrap();
    assert_eq!(f.values(&group("g"), "member"), vec!["cn=nobody"]);
}

#[test]
fn refint_follows_entries_below_a_renamed_subtree() {
    let f = Fixture::new(REFINT);
    add_group(&f, "g", &["a", "c"]);
    f.rename(&format!("ou=People,{BASE}"), "ou=Staff", None)
        .unwrap();
    assert_eq!(
        f.values(&group("g"), "member"),
        vec![
            format!("uid=a,ou=staff,{BASE}"),
            format!("uid=c,ou=staff,{BASE}")
        ]
    );
}

#[test]
fn unique_refuses_a_second_entry_with_a_value_within_its_base() {
    let f = Fixture::new(&format!(
        "[[overlay]]\ntype = \"unique\"\nattributes = [\"mail\"]\nbase = \"ou=People,{BASE}\"\n"
    ));
    let dup = f
        .add(
            &people("d"),
            &[
                ("objectClass", &["inetOrgPerson"]),
                ("uid", &["d"]),
                ("cn", &["d"]),
                ("sn", &["d"]),
                ("mail", &["A@example.com"]),
            ],
        )
        .expect_err("a's mail (matched case-insensitively)");
    assert_eq!(
        dup.code,
        ResultCode::CONSTRAINT_VIOLATION,
        "{}",
        dup.message
    );
    f.modify(&people("b"), ModOp::Replace, "mail", &["a@example.com"])
        .expect_err("by modify too");
    // Keeping one's own value, and other values, is fine.
    f.modify(&people("a"), ModOp::Replace, "sn", &["A"])
        .unwrap();
    f.modify(&people("b"), ModOp::Add, "mail", &["b2@example.com"])
        .unwrap();
    // Outside the base the value may repeat.
    f.add(
        &format!("cn=x,ou=Groups,{BASE}"),
        &[
            ("objectClass", &["inetOrgPerson"]),
            ("cn", &["x"]),
            ("sn", &["x"]),
            ("mail", &["a@example.com"]),
        ],
    )
    .unwrap();
    // Moving that entry into the base is a new use of the value.
    let moved = f
        .rename(
            &format!("cn=x,ou=Groups,{BASE}"),
            "cn=x",
            Some(&format!("ou=People,{BASE}")),
        )
        .expect_err("moved into the base");
    assert_eq!(moved.code, ResultCode::CONSTRAINT_VIOLATION);
}

#[test]
fn unique_needs_an_equality_index() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::standard();
    let toml = format!(
        "data_dir = {:?}\n[[overlay]]\ntype = \"unique\"\nattributes = [\"telephoneNumber\"]\n",
        dir.path().display().to_string()
    );
    let e = pando_config::Config::from_toml(&toml, std::path::Path::new("t.toml"))
        .unwrap()
        .validate(&schema)
        .expect_err("telephoneNumber is not indexed");
    assert_eq!(e.key, "overlay[0].attributes");
    assert!(e.problem.contains("equality index"), "{}", e.problem);
}

#[test]
fn memberof_follows_member_changes_and_group_renames_and_deletes() {
    let f = Fixture::new(MEMBEROF);
    add_group(&f, "g", &["a", "b"]);
    assert_eq!(f.values(&people("a"), "memberOf"), vec![group("g")]);
    assert_eq!(f.values(&people("b"), "memberOf"), vec![group("g")]);
    f.modify(&group("g"), ModOp::Delete, "member", &[&people("b")])
        .unwrap();
    assert!(f.values(&people("b"), "memberOf").is_empty());
    f.modify(&group("g"), ModOp::Add, "member", &[&people("c")])
        .unwrap();
    assert_eq!(f.values(&people("c"), "memberOf"), vec![group("g")]);
    f.rename(&group("g"), "cn=h", None).unwrap();
    assert_eq!(f.values(&people("a"), "memberOf"), vec![group("h")]);
    assert_eq!(f.values(&people("c"), "memberOf"), vec![group("h")]);
    f.delete(&group("h")).unwrap();
    assert!(f.values(&people("a"), "memberOf").is_empty());
    assert!(f.values(&people("c"), "memberOf").is_empty());
}

#[test]
fn memberof_follows_members_renamed_and_deleted() {
    let f = Fixture::new(MEMBEROF);
    add_group(&f, "g", &["a", "b", "c"]);
    add_group(&f, "k", &["a"]);
    f.rename(&people("a"), "uid=ay", None).unwrap();
    assert_eq!(
        f.values(&people("ay"), "memberOf"),
        vec![group("g"), group("k")]
    );
    assert_eq!(
        f.values(&group("g"), "member"),
        vec![people("ay"), people("b"), people("c")]
    );
    assert_eq!(f.values(&group("k"), "member"), vec![people("ay")]);
    f.delete(&people("b")).unwrap();
    assert_eq!(
        f.values(&group("g"), "member"),
        vec![people("ay"), people("c")]
    );
    // A whole subtree renamed: members below it keep their groups, groups
    // below it are renamed in their members.
    f.rename(&format!("ou=Groups,{BASE}"), "ou=Teams", None)
        .unwrap();
    let teams = |g: &str| format!("cn={g},ou=teams,{BASE}");
    assert_eq!(
        f.values(&people("ay"), "memberOf"),
        vec![teams("g"), teams("k")]
    );
    f.rename(&format!("ou=People,{BASE}"), "ou=Staff", None)
        .unwrap();
    assert_eq!(
        f.values(&teams("g"), "member"),
        vec![
            format!("uid=ay,ou=staff,{BASE}"),
            format!("uid=c,ou=staff,{BASE}")
        ]
    );
    assert_eq!(
        f.values(&format!("uid=ay,ou=Staff,{BASE}"), "memberOf"),
        vec![teams("g"), teams("k")]
    );
}

#[test]
fn memberof_with_refint_agrees_and_clients_cannot_set_memberof() {
    let f = Fixture::new(&format!("{REFINT}{MEMBEROF}"));
    add_group(&f, "g", &["a", "b"]);
    f.rename(&people("a"), "uid=ay", None).unwrap();
    assert_eq!(f.values(&people("ay"), "memberOf"), vec![group("g")]);
    assert_eq!(
        f.values(&group("g"), "member"),
        vec![people("ay"), people("b")]
    );
    f.delete(&people("b")).unwrap();
    assert_eq!(f.values(&group("g"), "member"), vec![people("ay")]);
    let e = f
        .modify(&people("c"), ModOp::Add, "memberOf", &[&group("g")])
        .expect_err("maintained by the server");
    assert_eq!(e.code, ResultCode::CONSTRAINT_VIOLATION);
}

#[test]
fn memberof_dangling_error_refuses_a_member_naming_no_entry() {
    let f = Fixture::new(&format!("{MEMBEROF}dangling = \"error\"\n"));
    let e = f
        .add(
            &group("g"),
            &[
                ("objectClass", &["groupOfNames"]),
                ("cn", &["g"]),
                ("member", &[&people("nobody")]),
            ],
        )
        .expect_err("no such member");
    assert_eq!(e.code, ResultCode::CONSTRAINT_VIOLATION, "{}", e.message);
    add_group(&f, "g", &["a"]);
}

#[test]
fn dn_values_compare_normalised_and_keep_a_uid_part() {
    let schema = Schema::standard();
    assert_eq!(
        related::value_norm(&schema, b"UID=A, dc=Example,DC=com").as_deref(),
        Some("uid=a,dc=example,dc=com")
    );
    assert_eq!(
        related::value_norm(&schema, b"uid=a,dc=example,dc=com#'0101'B").as_deref(),
        Some("uid=a,dc=example,dc=com")
    );
    let mut e = Entry::new(Dn::parse("cn=g").unwrap());
    e.add_values(
        "uniqueMember",
        vec![
            b"uid=a,dc=example,dc=com#'01'B".to_vec(),
            b"uid=b,dc=example,dc=com".to_vec(),
        ],
    );
    assert!(related::rename_dn(
        &schema,
        &mut e,
        "uniqueMember",
        "uid=a,dc=example,dc=com",
        "uid=z,dc=example,dc=com",
        "uid=z,dc=example,dc=com"
    ));
    assert_eq!(
        e.values("uniqueMember")[0],
        b"uid=z,dc=example,dc=com#'01'B".to_vec()
    );
    assert!(related::within("uid=a,dc=x", "dc=x"));
    assert!(!related::within("uid=a,xdc=x", "dc=x"));
    assert!(related::within("dc=x", ""));
}

#[test]
fn memberof_disagreements_are_found_and_rebuilt_through_the_pipeline() {
    let f = Fixture::new(MEMBEROF);
    // Written around the pipeline (as an import would): no memberOf.
    crate::test_server::add_around_the_pipeline(
        &f.server,
        &group("old"),
        &[
            ("objectClass", "groupOfNames"),
            ("cn", "old"),
            ("member", &people("a")),
        ],
    );
    let m = crate::overlays::memberof::configured(&f.server).unwrap();
    let found = {
        let rtxn = f.server.rt.store.read().unwrap();
        m.disagreements(&f.server.schema, &rtxn.view()).unwrap()
    };
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].missing, vec![format!("cn=old,ou=Groups,{BASE}")]);
    let admin = user(&f.server, &format!("cn=admin,{BASE}"), true);
    let changed =
        f.rt.block_on(crate::overlays::memberof::rebuild(&f.server, &admin))
            .unwrap();
    assert_eq!(changed, 1);
    assert_eq!(f.values(&people("a"), "memberOf"), vec![group("old")]);
    let rtxn = f.server.rt.store.read().unwrap();
    assert!(m
        .disagreements(&f.server.schema, &rtxn.view())
        .unwrap()
        .is_empty());
}
