use super::*;
use pando_model::Dn;

fn csn(n: u32, sid: u16) -> String {
    format!("20261127000000.{n:06}Z#000000#{sid:03x}#000000")
}

fn entry(dn: &str, attrs: &[(&str, &[&str])], at: &str) -> Entry {
    let mut e = Entry::new(Dn::parse(dn).unwrap());
    for (name, values) in attrs {
        e.add_values(name, values.iter().map(|v| v.as_bytes().to_vec()).collect());
    }
    e.add_values("entryCSN", vec![at.as_bytes().to_vec()]);
    e.add_values("entryUUID", vec![b"u-1".to_vec()]);
    e
}

/// A client's modify on a copy: `changes` replace types (empty: delete).
fn write(copy: &Entry, changes: &[(&str, &[&str])], at: &str) -> Entry {
    let mut after = copy.clone();
    for (name, values) in changes {
        after.remove(name);
        if !values.is_empty() {
            after.add_values(name, values.iter().map(|v| v.as_bytes().to_vec()).collect());
        }
    }
    after.remove("entryCSN");
    after.add_values("entryCSN", vec![at.as_bytes().to_vec()]);
    record_write(Some(copy), &mut after, at);
    after
}

fn vals(e: &Entry, name: &str) -> Vec<String> {
    let mut v: Vec<String> = e
        .values(name)
        .iter()
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    v.sort();
    v
}

/// The merged entry, with its attributes in a canonical order.
fn canon(mut e: Entry) -> Entry {
    for a in &mut e.attrs {
        a.desc = a.desc.to_ascii_lowercase();
        a.values.sort();
    }
    e.attrs.sort_by(|a, b| a.desc.cmp(&b.desc));
    e
}

fn base() -> Entry {
    let mut e = entry(
        "uid=ann,ou=People,dc=example,dc=com",
        &[
            ("objectClass", &["top", "inetOrgPerson"]),
            ("uid", &["ann"]),
            ("cn", &["Ann"]),
            ("sn", &["A"]),
            ("mail", &["ann@example.com"]),
        ],
        &csn(1, 1),
    );
    record_write(None, &mut e, &csn(1, 1));
    e
}

#[test]
fn concurrent_changes_of_different_attributes_are_both_kept() {
    let b = base();
    let on_a = write(&b, &[("mail", &["ann@a.example"])], &csn(10, 1));
    let on_b = write(&b, &[("telephoneNumber", &["+1 555"])], &csn(11, 2));
    for (here, got) in [(&on_a, &on_b), (&on_b, &on_a)] {
        let m = merge(here, got);
        assert_eq!(vals(&m.entry, "mail"), ["ann@a.example"]);
        assert_eq!(vals(&m.entry, "telephoneNumber"), ["+1 555"]);
        assert!(m.losses.is_empty(), "{:?}", m.losses);
        assert_eq!(vals(&m.entry, "entryCSN"), [csn(11, 2)]);
    }
}

#[test]
fn the_newer_change_of_one_attribute_wins_and_the_older_is_a_loss() {
    let b = base();
    let on_a = write(&b, &[("mail", &["ann@a.example"])], &csn(10, 1));
    let on_b = write(&b, &[("mail", &["ann@b.example"])], &csn(11, 2));
    let m = merge(&on_a, &on_b);
    assert_eq!(vals(&m.entry, "mail"), ["ann@b.example"]);
    assert_eq!(
        m.losses,
        [Loss {
            attr: "mail".into(),
            values: vec![b"ann@a.example".to_vec()],
            side: Side::Here,
            lost_csn: csn(10, 1),
            won_csn: csn(11, 2),
        }]
    );
    let m = merge(&on_b, &on_a);
    assert_eq!(vals(&m.entry, "mail"), ["ann@b.example"]);
    assert_eq!(m.losses.len(), 1);
    assert_eq!(m.losses[0].side, Side::Received);
}

#[test]
fn an_update_that_overwrote_what_is_held_is_no_conflict() {
    let b = base();
    let first = write(&b, &[("mail", &["one@example.com"])], &csn(10, 1));
    let second = write(&first, &[("mail", &["two@example.com"])], &csn(20, 2));
    let m = merge(&first, &second);
    assert_eq!(vals(&m.entry, "mail"), ["two@example.com"]);
    assert!(m.losses.is_empty());
    // The older copy arriving late changes nothing.
    let m = merge(&second, &first);
    assert_eq!(canon(m.entry), canon(second.clone()));
    assert!(m.losses.is_empty());
}

#[test]
fn a_deleted_attribute_is_a_change_like_any_other() {
    let b = base();
    let on_a = write(&b, &[("mail", &[])], &csn(10, 1));
    let on_b = write(&b, &[("sn", &["B"])], &csn(11, 2));
    let m = merge(&on_b, &on_a);
    assert!(vals(&m.entry, "mail").is_empty());
    assert_eq!(vals(&m.entry, "sn"), ["B"]);
    // A later add of the deleted type beats the delete.
    let later = write(&b, &[("mail", &["new@example.com"])], &csn(12, 2));
    let m = merge(&on_a, &later);
    assert_eq!(vals(&m.entry, "mail"), ["new@example.com"]);
    assert_eq!(m.losses.len(), 1, "the delete at 10 was lost");
    assert!(m.losses[0].values.is_empty());
}

#[test]
fn a_rename_and_a_modify_are_both_kept_two_renames_the_newest_wins() {
    let b = base();
    let mut renamed = b.clone();
    renamed.dn = Dn::parse("uid=ann,ou=Staff,dc=example,dc=com").unwrap();
    renamed.remove("entryCSN");
    renamed.add_values("entryCSN", vec![csn(10, 1).into_bytes()]);
    record_write(Some(&b), &mut renamed, &csn(10, 1));
    let modified = write(&b, &[("sn", &["Z"])], &csn(11, 2));
    for (here, got) in [(&renamed, &modified), (&modified, &renamed)] {
        let m = merge(here, got);
        assert_eq!(m.entry.dn.to_string(), "uid=ann,ou=Staff,dc=example,dc=com");
        assert_eq!(vals(&m.entry, "sn"), ["Z"]);
        assert!(m.losses.is_empty());
    }
    let mut other = b.clone();
    other.dn = Dn::parse("uid=ann,ou=Old,dc=example,dc=com").unwrap();
    record_write(Some(&b), &mut other, &csn(12, 3));
    let m = merge(&renamed, &other);
    assert_eq!(m.entry.dn.to_string(), "uid=ann,ou=Old,dc=example,dc=com");
    assert_eq!(m.losses[0].attr, "@dn");
    assert_eq!(
        m.losses[0].values,
        [b"uid=ann,ou=Staff,dc=example,dc=com".to_vec()]
    );
}

#[test]
fn a_new_rdn_value_is_kept_when_the_attributes_come_from_the_other_side() {
    let b = base();
    let mut renamed = b.clone();
    renamed.dn = Dn::parse("uid=anna,ou=People,dc=example,dc=com").unwrap();
    renamed.remove("uid");
    renamed.add_values("uid", vec![b"anna".to_vec()]);
    record_write(Some(&b), &mut renamed, &csn(10, 1));
    // A concurrent, newer replace of uid elsewhere.
    let other = write(&b, &[("uid", &["ann", "ann2"])], &csn(11, 2));
    let m = merge(&renamed, &other);
    assert_eq!(
        m.entry.dn.to_string(),
        "uid=anna,ou=People,dc=example,dc=com"
    );
    assert_eq!(vals(&m.entry, "uid"), ["ann", "ann2", "anna"]);
}

#[test]
fn copies_without_state_merge_as_whole_entries_by_entry_csn() {
    let old = entry(
        "cn=x,dc=example,dc=com",
        &[("cn", &["x"]), ("description", &["old"])],
        &csn(1, 1),
    );
    let new = entry(
        "cn=x,dc=example,dc=com",
        &[("cn", &["x"]), ("description", &["new"])],
        &csn(2, 5),
    );
    for (here, got) in [(&old, &new), (&new, &old)] {
        let m = merge(here, got);
        assert_eq!(vals(&m.entry, "description"), ["new"]);
        assert!(m.losses.is_empty(), "no prev known: not counted");
    }
}

#[test]
fn a_copy_without_history_replacing_a_change_made_here_is_counted() {
    // Changed here (server 1); OpenLDAP's newer copy (server 2) is whole
    // at its entryCSN and lacks the change: it wins, as OpenLDAP resolves,
    // and the value lost is on record.
    let here = write(&base(), &[("description", &["set here"])], &csn(2, 1));
    let theirs = entry(
        "uid=ann,ou=People,dc=example,dc=com",
        &[
            ("objectClass", &["top", "inetOrgPerson"]),
            ("uid", &["ann"]),
            ("cn", &["Ann"]),
            ("sn", &["A"]),
            ("mail", &["ann@example.com"]),
            ("telephoneNumber", &["2"]),
        ],
        &csn(3, 2),
    );
    for (h, g) in [(&here, &theirs), (&theirs, &here)] {
        let m = merge(h, g);
        assert!(vals(&m.entry, "description").is_empty());
        assert_eq!(vals(&m.entry, "telephoneNumber"), ["2"]);
        let lost: Vec<&str> = m.losses.iter().map(|l| l.attr.as_str()).collect();
        assert_eq!(lost, ["description"], "{h:?}");
    }
    // Attributes set when the entry was made (no history here) are not.
    let m = merge(&base(), &theirs);
    assert!(m.losses.is_empty());
}

#[test]
fn a_copy_without_state_meets_one_with_state_whole_by_entry_csn_name_included() {
    // OpenLDAP (server 2) renamed ann; its copy carries no state. Here
    // (server 1) sn changed after. The newer copy wins whole, as OpenLDAP
    // resolves on its side: the name too, and the rename is on record.
    let b = base();
    let mut theirs = entry(
        "uid=ann2,ou=People,dc=example,dc=com",
        &[
            ("objectClass", &["top", "inetOrgPerson"]),
            ("uid", &["ann2"]),
            ("cn", &["Ann"]),
            ("sn", &["A"]),
            ("mail", &["ann@example.com"]),
        ],
        &csn(10, 2),
    );
    let here = write(&b, &[("sn", &["Z"])], &csn(11, 1));
    for (h, g) in [(&here, &theirs), (&theirs, &here)] {
        let m = merge(h, g);
        assert_eq!(
            m.entry.dn.to_string(),
            "uid=ann,ou=People,dc=example,dc=com"
        );
        assert_eq!(vals(&m.entry, "uid"), ["ann"]);
        assert_eq!(vals(&m.entry, "sn"), ["Z"]);
        let name = m
            .losses
            .iter()
            .find(|l| l.attr == "@dn")
            .expect("the rename lost");
        assert_eq!(
            name.values,
            [b"uid=ann2,ou=People,dc=example,dc=com".to_vec()]
        );
    }
    // Newer there: its copy whole, this server's change lost on record.
    theirs.remove("entryCSN");
    theirs.add_values("entryCSN", vec![csn(12, 2).into_bytes()]);
    for (h, g) in [(&here, &theirs), (&theirs, &here)] {
        let m = merge(h, g);
        assert_eq!(
            m.entry.dn.to_string(),
            "uid=ann2,ou=People,dc=example,dc=com"
        );
        assert_eq!(vals(&m.entry, "sn"), ["A"]);
        assert!(m.losses.iter().any(|l| l.attr == "sn"), "{:?}", m.losses);
        assert!(m.entry.get(STATE_ATTR).is_none(), "taken whole, no state");
    }
}

/// Servers that receive the same copies in any order end equal: merging
/// is commutative and associative on a family of concurrent writes.
#[test]
fn the_merge_is_the_same_in_any_order() {
    let b = base();
    let copies = [
        write(&b, &[("mail", &["a@x"]), ("sn", &["A1"])], &csn(10, 1)),
        write(&b, &[("mail", &["b@x"]), ("cn", &["B"])], &csn(11, 2)),
        write(&b, &[("sn", &[]), ("description", &["c"])], &csn(12, 3)),
        write(
            &write(&b, &[("cn", &["C"])], &csn(9, 3)),
            &[("telephoneNumber", &["1"])],
            &csn(13, 3),
        ),
    ];
    let orders: [[usize; 4]; 4] = [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]];
    let mut results = Vec::new();
    for order in orders {
        let mut held = copies[order[0]].clone();
        for &i in &order[1..] {
            held = merge(&held, &copies[i]).entry;
        }
        results.push(canon(held));
    }
    for r in &results[1..] {
        assert_eq!(r, &results[0]);
    }
    let r = &results[0];
    assert_eq!(vals(r, "mail"), ["b@x"]);
    assert_eq!(vals(r, "cn"), ["B"]);
    assert!(vals(r, "sn").is_empty());
    assert_eq!(vals(r, "description"), ["c"]);
    assert_eq!(vals(r, "telephoneNumber"), ["1"]);
    // Merging again with any copy changes nothing.
    for c in &copies {
        assert_eq!(&canon(merge(r, c).entry), r);
    }
}

#[test]
fn the_state_round_trips_and_skips_types_set_at_the_base() {
    let b = base();
    let w = write(&b, &[("mail", &["m@x"])], &csn(10, 1));
    let s = State::of(&w);
    assert_eq!(s.stamp("mail").csn, csn(10, 1));
    assert_eq!(s.stamp("mail").prev, csn(1, 1));
    assert_eq!(s.stamp("sn").csn, csn(1, 1));
    let mut again = w.clone();
    s.store(&mut again);
    assert_eq!(State::of(&again), s);
    assert_eq!(w.values(STATE_ATTR).len(), 2);
}
