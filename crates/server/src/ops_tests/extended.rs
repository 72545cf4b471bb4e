//! Unit tests of `ops::extended` that need a whole server (its assembly is this
//! crate's).

use crate::ops::controls::Requested;
use crate::ops::extended::*;
use crate::ops::write::WriteCtx;
use crate::state::Server;
use crate::test_server::{add, server, user};
use pando_access::Identity;
use pando_model::Attribute;
use pando_proto::{oid, ExtendedRequest, PasswdModifyRequest, ResultCode};
use std::sync::Arc;

fn set_password(user_dn: &str, new: &str) -> ExtendedRequest {
    ExtendedRequest {
        name: oid::PASSWD_MODIFY.into(),
        value: Some(
            PasswdModifyRequest {
                user_identity: Some(user_dn.as_bytes().to_vec()),
                old_password: None,
                new_password: Some(new.as_bytes().to_vec()),
            }
            .encode(),
        ),
    }
}

fn stored(server: &Server, dn: &str) -> Vec<Attribute> {
    let rtxn = server.rt.store.read().unwrap();
    let view = rtxn.view();
    let id = crate::ops::resolve(&view, &crate::ops::parse_dn(dn).unwrap()).unwrap();
    view.attrs(id).unwrap().unwrap()
}

/// As a modify replacing userPassword would be, Password Modify is
/// refused where the entry's object classes do not allow the attribute
/// (slapd answers the same), and nothing is written.
#[test]
fn password_modify_is_schema_checked_like_a_modify() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "");
    let device = "cn=printer,dc=example,dc=com";
    let person = "cn=alice,dc=example,dc=com";
    add(
        &server,
        device,
        &[("objectClass", "device"), ("cn", "printer")],
    );
    add(
        &server,
        person,
        &[("objectClass", "person"), ("cn", "alice"), ("sn", "a")],
    );
    let admin = user(&server, "cn=admin,dc=example,dc=com", true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let before = stored(&server, device);
    let err = rt
        .block_on(extended(
            &server,
            &admin,
            Requested::default(),
            set_password(device, "s3cret"),
        ))
        .expect_err("device does not allow userPassword");
    assert_eq!(
        err.code,
        ResultCode::OBJECT_CLASS_VIOLATION,
        "{}",
        err.message
    );
    assert_eq!(stored(&server, device), before, "nothing written");
    // An entry that allows it takes the new password.
    let r = rt
        .block_on(extended(
            &server,
            &admin,
            Requested::default(),
            set_password(person, "s3cret"),
        ))
        .unwrap();
    assert_eq!(r.result.code, ResultCode::SUCCESS);
    let pw = crate::ops::password_values(&stored(&server, person));
    assert!(pw.len() == 1 && pando_password::verify_password(b"s3cret", &pw[0]));
}

/// The lag in changes is counted per server ID from the change log,
/// for authenticated identities that may read contextCSN and no one
/// else; the CSNs asked about must be CSNs.
#[test]
fn changes_behind_counts_operations_newer_than_each_csn() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(
        dir.path(),
        r#"
[[access]]
by = [{ who = "admins", rights = "all" }, { who = "dn:cn=replica,dc=example,dc=com", rights = "read" }]
"#,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ask = |who: &Identity, csns: &str| {
        let req = ExtendedRequest {
            name: crate::ops::special::CHANGES_BEHIND_EXOP.into(),
            value: Some(csns.as_bytes().to_vec()),
        };
        rt.block_on(extended(&server, who, Requested::default(), req))
    };
    let context = || {
        let rtxn = server.rt.store.read().unwrap();
        rtxn.view().context_csns().unwrap().join(";")
    };
    let admin = user(&server, "cn=admin,dc=example,dc=com", true);
    // Through the write pipeline, which logs.
    let write = |n: &str| add_device(&rt, &server, &admin, n);
    write("a");
    let seen = context();
    for n in ["b", "c", "d"] {
        write(n);
    }
    let replica = user(&server, "cn=replica,dc=example,dc=com", false);
    let answer = ask(&replica, &seen).unwrap();
    let text = String::from_utf8(answer.value.unwrap()).unwrap();
    assert_eq!(text, "sid=000 changes=3\n");
    assert_eq!(
        String::from_utf8(ask(&replica, &context()).unwrap().value.unwrap()).unwrap(),
        "sid=000 changes=0\n"
    );
    let other = user(&server, "cn=other,dc=example,dc=com", false);
    let err = ask(&other, &seen).expect_err("may not read contextCSN");
    assert_eq!(err.code, ResultCode::INSUFFICIENT_ACCESS_RIGHTS);
    let anonymous = Identity::anonymous(Default::default());
    let err = ask(&anonymous, &seen).expect_err("anonymous");
    assert_eq!(err.code, ResultCode::INSUFFICIENT_ACCESS_RIGHTS);
    let err = ask(&replica, "20261125").expect_err("not a CSN");
    assert_eq!(err.code, ResultCode::PROTOCOL_ERROR, "{}", err.message);
}

/// Add `cn=<n>,dc=example,dc=com` (a device) through the write pipeline.
fn add_device(rt: &tokio::runtime::Runtime, server: &Arc<Server>, admin: &Identity, n: &str) {
    let req = pando_proto::AddRequest {
        dn: format!("cn={n},dc=example,dc=com"),
        attrs: [("objectClass", "device"), ("cn", n)]
            .iter()
            .map(|(a, v)| pando_proto::PartialAttribute {
                name: a.to_string(),
                values: vec![v.as_bytes().to_vec()],
            })
            .collect(),
    };
    let ctx = WriteCtx::new(server, admin, Requested::default());
    rt.block_on(crate::ops::write::add(ctx, req)).unwrap();
}

/// A count looks at no more than `replication.max_changes_counted`
/// operations (from the oldest CSN asked about): past them the
/// counts are lower bounds, whoever asks.
#[test]
fn changes_behind_stops_at_max_changes_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "[replication]\nmax_changes_counted = 2\n");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let admin = user(&server, "cn=admin,dc=example,dc=com", true);
    let seen = {
        let rtxn = server.rt.store.read().unwrap();
        rtxn.view().context_csns().unwrap().join(";")
    };
    for n in ["a", "b", "c"] {
        add_device(&rt, &server, &admin, n);
    }
    let req = ExtendedRequest {
        name: crate::ops::special::CHANGES_BEHIND_EXOP.into(),
        value: Some(seen.as_bytes().to_vec()),
    };
    let r = rt
        .block_on(extended(&server, &admin, Requested::default(), req))
        .unwrap();
    let text = String::from_utf8(r.value.unwrap()).unwrap();
    assert_eq!(text, "sid=000 changes>=2\n");
}
