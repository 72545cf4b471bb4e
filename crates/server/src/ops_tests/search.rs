//! Unit tests of `ops::search` that need a whole server (its assembly is this
//! crate's).

use crate::ops::search::*;
use crate::state::Server;
use crate::test_server::{add, server, user};
use pando_access::acl::Access;
use pando_access::Identity;
use pando_model::Dn;
use pando_proto::{DerefAliases, Filter, Scope};
use pando_proto::{LdapMessage, ProtocolOp, ResultCode, SearchRequest};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Entries a search returns: DN and (attribute, values as text).
type Found = Vec<(String, Vec<(String, Vec<String>)>)>;

fn search_as(
    server: &Arc<Server>,
    who: &Identity,
    base: &str,
    scope: Scope,
    filter: &str,
    attrs: &[&str],
) -> Found {
    let (tx, mut rx) = mpsc::channel(1024);
    let job = SearchJob {
        server: server.clone(),
        who: who.clone(),
        msg_id: 1,
        conn: 0,
        req: SearchRequest {
            base: base.into(),
            scope,
            deref: DerefAliases::Never,
            size_limit: 0,
            time_limit: 0,
            types_only: false,
            filter: Filter::parse(filter).unwrap(),
            attrs: attrs.iter().map(|a| a.to_string()).collect(),
        },
        controls: Default::default(),
        abandoned: Arc::new(AtomicBool::new(false)),
        out: tx,
    };
    let Ran::Done(Some(outcome)) = run(&job, None) else {
        panic!("the search did not finish in one run");
    };
    assert_eq!(
        outcome.result.code,
        ResultCode::SUCCESS,
        "{:?}",
        outcome.result
    );
    let mut bytes = Vec::new();
    while let Ok(chunk) = rx.try_recv() {
        bytes.extend(chunk);
    }
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = pando_proto::frame_length(&bytes[at..], usize::MAX)
            .unwrap()
            .unwrap();
        let msg = LdapMessage::decode(&bytes[at..at + len], &Default::default()).unwrap();
        at += len;
        let ProtocolOp::SearchResultEntry(e) = msg.op else {
            panic!("not an entry: {:?}", msg.op);
        };
        let attrs = e
            .attrs
            .into_iter()
            .map(|a| {
                let v = a.values.iter().map(|v| String::from_utf8_lossy(v).into());
                (a.name, v.collect())
            })
            .collect();
        found.push((e.dn, attrs));
    }
    found
}

/// The values of `name` in the one entry found (None: absent).
fn value_of(found: &Found, name: &str) -> Option<String> {
    assert_eq!(found.len(), 1, "{found:?}");
    found[0]
        .1
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.join(","))
}

/// ou is indexed so that an ou= filter is exact (see `raw`).
const HIDING_RULES: &str = r#"
[indexes]
ou = ["eq"]
[[access]]
dn = "cn=secret,ou=people,dc=example,dc=com"
by = [{ who = "admins", rights = "all" }]
[[access]]
dn = "ou=vault,dc=example,dc=com"
scope = "children"
by = [{ who = "admins", rights = "all" }]
[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"#;

fn hiding_tree(server: &Arc<Server>) {
    for ou in ["People", "Vault"] {
        add(
            server,
            &format!("ou={ou},dc=example,dc=com"),
            &[("objectClass", "organizationalUnit"), ("ou", ou)],
        );
    }
    for (cn, parent) in [
        ("alice", "People"),
        ("bob", "People"),
        ("secret", "People"),
        ("gold", "Vault"),
    ] {
        add(
            server,
            &format!("cn={cn},ou={parent},dc=example,dc=com"),
            &[("objectClass", "person"), ("cn", cn), ("sn", cn)],
        );
    }
}

#[test]
fn subordinate_counts_leave_out_children_the_requester_cannot_see() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), HIDING_RULES);
    hiding_tree(&server);
    let counts = &["numSubordinates", "hasSubordinates"];
    let alice = user(&server, "cn=alice,ou=People,dc=example,dc=com", false);
    let admin = user(&server, "cn=admin,dc=example,dc=com", true);
    let people = "ou=People,dc=example,dc=com";
    let vault = "ou=Vault,dc=example,dc=com";
    let base = |who: &Identity, dn: &str| {
        let f = search_as(&server, who, dn, Scope::Base, "(objectClass=*)", counts);
        (
            value_of(&f, "numSubordinates"),
            value_of(&f, "hasSubordinates"),
        )
    };
    let some = |n: &str, has: &str| (Some(n.to_string()), Some(has.to_string()));
    // cn=secret is hidden from alice, and all of ou=Vault's children.
    assert_eq!(base(&alice, people), some("2", "TRUE"));
    assert_eq!(base(&alice, vault), some("0", "FALSE"));
    assert_eq!(base(&admin, people), some("3", "TRUE"));
    assert_eq!(base(&admin, vault), some("1", "TRUE"));
    // The same in a filter: ou=Vault has no subordinates for alice.
    let with_children = |who: &Identity| {
        let f = search_as(
            &server,
            who,
            "dc=example,dc=com",
            Scope::One,
            "(hasSubordinates=TRUE)",
            &["1.1"],
        );
        let mut dns: Vec<String> = f.into_iter().map(|(dn, _)| dn).collect();
        dns.sort();
        dns
    };
    assert_eq!(with_children(&alice), [people]);
    assert_eq!(with_children(&admin), [people, vault]);
    // Through the path that sends entries undecoded (an exact filter,
    // no rule with a filter) as well.
    for (dn, ou, want) in [
        (people, "People", some("2", "TRUE")),
        (vault, "Vault", some("0", "FALSE")),
    ] {
        let f = search_as(
            &server,
            &alice,
            "dc=example,dc=com",
            Scope::Sub,
            &format!("(ou={ou})"),
            &["ou", "numSubordinates", "hasSubordinates"],
        );
        assert_eq!(f[0].0, dn);
        let got = (
            value_of(&f, "numSubordinates"),
            value_of(&f, "hasSubordinates"),
        );
        assert_eq!(got, want, "{dn}");
    }
}

#[test]
fn restricted_subordinate_counts_stop_at_the_cap_and_say_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), HIDING_RULES);
    hiding_tree(&server);
    let alice = user(&server, "cn=alice,ou=People,dc=example,dc=com", false);
    let mut access = Access::new(&server.acl, &alice);
    assert!(!access.reads_every_entry());
    let rtxn = server.rt.store.read().unwrap();
    let view = rtxn.view();
    let id = |dn: &str| crate::ops::resolve(&view, &Dn::parse(dn).unwrap()).unwrap();
    let people = id("ou=People,dc=example,dc=com");
    let vault = id("ou=Vault,dc=example,dc=com");
    let schema = &*server.schema;
    let mut seen = |id, first_only, max| {
        emit::visible_children(schema, &view, &mut access, id, first_only, max).unwrap()
    };
    // People: alice, bob (visible), secret (hidden).
    assert_eq!(seen(people, false, 3), Some(2));
    assert_eq!(seen(people, false, 2), None, "more children than checked");
    assert_eq!(seen(people, true, 1), Some(1), "stops at the first");
    assert_eq!(seen(people, true, 0), None);
    assert_eq!(seen(vault, true, 1), Some(0));
    assert_eq!(seen(vault, false, 0), None);
}
