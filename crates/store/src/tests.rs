//! Store tests: every write path ends with `verify()`.

use std::sync::Arc;

use pando_model::{Attribute, Dn, Schema};
use pando_proto::Filter;

use super::*;

fn open(dir: &Path) -> Store {
    // The model check's indexes (one of each kind), durable.
    let opts = StoreOptions {
        max_batch: 16,
        durability: Durability::Durable,
        ..crate::model_check::options()
    };
    Store::open(dir, Arc::new(Schema::standard()), &opts).unwrap()
}

fn attrs(pairs: &[(&str, &str)]) -> Vec<Attribute> {
    let mut out: Vec<Attribute> = Vec::new();
    for (d, v) in pairs {
        match out.iter_mut().find(|a| a.desc == *d) {
            Some(a) => a.values.push(v.as_bytes().to_vec()),
            None => out.push(Attribute {
                desc: d.to_string(),
                values: vec![v.as_bytes().to_vec()],
            }),
        }
    }
    out
}

fn place(store: &Store, dn: &str) -> Placement {
    let dn = Dn::parse(dn).unwrap();
    let r = store.read().unwrap();
    let v = r.view();
    let rdns = v.normalize_rdns(&dn).unwrap();
    match v.lookup_norm(&rdns[1..]).unwrap() {
        Lookup::Found(p) => Placement {
            parent: p,
            rdn: dn.rdn().unwrap().to_string(),
            norm_rdn: rdns[0].clone(),
        },
        Lookup::Missing { .. } => Placement {
            parent: 0,
            rdn: dn.to_string(),
            norm_rdn: rdns.join(","),
        },
    }
}

fn add(store: &Store, dn: &str, a: Vec<Attribute>) -> EntryId {
    let p = place(store, dn);
    store.write_blocking(move |w| w.add(&p, &a)).unwrap()
}

/// Add `cn=<cn>` below entry `parent`.
fn add_under(store: &Store, parent: EntryId, cn: &str, a: Vec<Attribute>) {
    let p = Placement {
        parent,
        rdn: format!("cn={cn}"),
        norm_rdn: format!("cn={cn}"),
    };
    store.write_blocking(move |w| w.add(&p, &a)).unwrap();
}

fn find(store: &Store, dn: &str) -> Option<EntryId> {
    let r = store.read().unwrap();
    match r.view().lookup(&Dn::parse(dn).unwrap()).unwrap().unwrap() {
        Lookup::Found(id) => Some(id),
        Lookup::Missing { .. } => None,
    }
}

/// Delete entry `id` (its current attributes read first).
fn delete(store: &Store, id: EntryId) -> Result<(), StoreError> {
    let old = store.read().unwrap().view().attrs(id).unwrap().unwrap();
    store.write_blocking(move |w| w.delete(id, &old))
}

/// Add ou=Moved under the suffix and move `people` below it as ou=Staff;
/// the ID of ou=Moved.
fn move_people(store: &Store, people: EntryId) -> EntryId {
    let moved = add(
        store,
        "ou=Moved,dc=example,dc=com",
        attrs(&[("objectClass", "organizationalUnit"), ("ou", "Moved")]),
    );
    let to = Placement {
        parent: moved,
        rdn: "ou=Staff".into(),
        norm_rdn: "ou=staff".into(),
    };
    store
        .write_blocking(move |w| w.rename(people, &to))
        .unwrap();
    moved
}

fn assert_consistent(store: &Store) {
    let r = store.read().unwrap();
    let problems = r.view().verify().unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

fn person(cn: &str, uid_number: &str) -> Vec<Attribute> {
    attrs(&[
        ("objectClass", "top"),
        ("objectClass", "person"),
        ("cn", cn),
        ("sn", "x"),
        ("uidNumber", uid_number),
    ])
}

fn tree(store: &Store) {
    add(
        store,
        "dc=example,dc=com",
        attrs(&[("objectClass", "domain"), ("dc", "example")]),
    );
    add(
        store,
        "ou=People,dc=example,dc=com",
        attrs(&[("objectClass", "organizationalUnit"), ("ou", "People")]),
    );
    for i in 0..20 {
        add(
            store,
            &format!("cn=user{i},ou=People,dc=example,dc=com"),
            person(&format!("user{i}"), &i.to_string()),
        );
    }
}

fn ids(c: Candidates) -> Vec<u64> {
    match c {
        Candidates::Ids(s) => s.iter().collect(),
        Candidates::All => panic!("expected indexed candidates"),
    }
}

#[test]
fn add_lookup_and_dns() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let id =
        find(&store, "CN=User7, ou=people,DC=Example,dc=com").expect("case and spaces ignored");
    let r = store.read().unwrap();
    let v = r.view();
    assert_eq!(
        v.dn_string(id).unwrap(),
        "cn=user7,ou=People,dc=example,dc=com"
    );
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    assert_eq!(v.children(people).unwrap().len(), 20);
    assert_eq!(v.subtree(people, u64::MAX).unwrap().unwrap().len(), 21);
    assert!(v.subtree(people, 5).unwrap().is_none(), "limit is honoured");
    assert!(v.is_within(id, people).unwrap());
    match v
        .lookup(&Dn::parse("cn=nobody,ou=People,dc=example,dc=com").unwrap())
        .unwrap()
        .unwrap()
    {
        Lookup::Missing { matched } => assert_eq!(matched, Some(people)),
        other => panic!("{other:?}"),
    }
    drop(r);
    assert_consistent(&store);
}

#[test]
fn index_candidates_follow_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let id = find(&store, "cn=user3,ou=People,dc=example,dc=com").unwrap();
    {
        let r = store.read().unwrap();
        let v = r.view();
        assert_eq!(
            ids(v.candidates(&Filter::parse("(cn=USER3)").unwrap()).unwrap()),
            vec![id]
        );
        assert_eq!(
            ids(v
                .candidates(&Filter::parse("(cn=*ser1*)").unwrap())
                .unwrap())
            .len(),
            11
        );
        assert_eq!(
            ids(v
                .candidates(&Filter::parse("(uidNumber>=15)").unwrap())
                .unwrap())
            .len(),
            5
        );
        assert_eq!(
            ids(v
                .candidates(&Filter::parse("(uidNumber<=2)").unwrap())
                .unwrap())
            .len(),
            3
        );
        // (objectClass=person) is indexed under the class and its superclasses.
        assert_eq!(
            ids(v
                .candidates(&Filter::parse("(objectClass=top)").unwrap())
                .unwrap())
            .len(),
            22
        );
        assert_eq!(
            ids(v
                .candidates(&Filter::parse("(objectClass=person)").unwrap())
                .unwrap())
            .len(),
            20
        );
        assert_eq!(
            v.candidates(&Filter::parse("(!(cn=x))").unwrap()).unwrap(),
            Candidates::All
        );
        assert_eq!(
            ids(v
                .candidates(&Filter::parse("(&(cn=user3)(sn=x))").unwrap())
                .unwrap()),
            vec![id]
        );
        assert_eq!(
            v.candidates(&Filter::parse("(|(cn=user3)(sn=x))").unwrap())
                .unwrap(),
            Candidates::All
        );
    }
    let old = store.read().unwrap().view().attrs(id).unwrap().unwrap();
    let new = person("renamed", "99");
    store
        .write_blocking(move |w| w.replace(id, &old, &new))
        .unwrap();
    let r = store.read().unwrap();
    let v = r.view();
    assert!(ids(v.candidates(&Filter::parse("(cn=user3)").unwrap()).unwrap()).is_empty());
    assert_eq!(
        ids(v
            .candidates(&Filter::parse("(cn=renamed)").unwrap())
            .unwrap()),
        vec![id]
    );
    drop(r);
    assert_consistent(&store);
}

#[test]
fn subtree_move_rewrites_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    move_people(&store, people);
    assert!(find(&store, "cn=user5,ou=People,dc=example,dc=com").is_none());
    let id =
        find(&store, "cn=user5,ou=Staff,ou=Moved,dc=example,dc=com").expect("descendants follow");
    let r = store.read().unwrap();
    assert_eq!(
        r.view().dn_string(id).unwrap(),
        "cn=user5,ou=Staff,ou=Moved,dc=example,dc=com"
    );
    drop(r);
    assert_consistent(&store);
}

/// DNs remembered across read transactions (dn_cache) follow renames and
/// deletes, and a reader on an older snapshot keeps seeing its own DNs.
#[test]
fn cached_dns_follow_renames_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let user = find(&store, "cn=user5,ou=People,dc=example,dc=com").unwrap();
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let people_rdns: Vec<String> = ["ou=people", "dc=example", "dc=com"]
        .map(String::from)
        .into();
    let pair = |r: &crate::ReadTxn<'_>| r.view().dn_pair(user).unwrap().0;
    let user_rdns = |ou: &[&str]| -> Vec<String> {
        std::iter::once("cn=user5")
            .chain(ou.iter().copied())
            .map(String::from)
            .collect()
    };
    let old_dn = user_rdns(&["ou=people", "dc=example", "dc=com"]);
    let new_dn = user_rdns(&["ou=staff", "ou=moved", "dc=example", "dc=com"]);
    let nobody: Vec<String> = ["cn=nobody", "ou=people", "dc=example", "dc=com"]
        .map(String::from)
        .into();
    // Twice: the second answer comes from the cache (the user's DN through
    // its parent's cached ID).
    for _ in 0..2 {
        let r = store.read().unwrap();
        assert_eq!(pair(&r), "cn=user5,ou=People,dc=example,dc=com");
        assert_eq!(
            r.view().lookup_norm(&people_rdns).unwrap(),
            Lookup::Found(people)
        );
        assert!(r.view().is_within(user, people).unwrap());
        assert_eq!(r.view().lookup_norm(&old_dn).unwrap(), Lookup::Found(user));
        assert_eq!(
            r.view().lookup_norm(&nobody).unwrap(),
            Lookup::Missing {
                matched: Some(people)
            }
        );
    }
    let old = store.read().unwrap();
    let moved = move_people(&store, people);
    let r = store.read().unwrap();
    assert_eq!(pair(&r), "cn=user5,ou=Staff,ou=Moved,dc=example,dc=com");
    assert!(matches!(
        r.view().lookup_norm(&people_rdns).unwrap(),
        Lookup::Missing { .. }
    ));
    assert!(r.view().is_within(user, moved).unwrap());
    assert!(matches!(
        r.view().lookup_norm(&old_dn).unwrap(),
        Lookup::Missing { .. }
    ));
    assert_eq!(r.view().lookup_norm(&new_dn).unwrap(), Lookup::Found(user));
    // The older snapshot still has the entry where it was, and reading it
    // does not disturb what newer readers see.
    assert_eq!(pair(&old), "cn=user5,ou=People,dc=example,dc=com");
    assert_eq!(
        old.view().lookup_norm(&people_rdns).unwrap(),
        Lookup::Found(people)
    );
    assert!(!old.view().is_within(user, moved).unwrap());
    assert_eq!(
        old.view().lookup_norm(&old_dn).unwrap(),
        Lookup::Found(user)
    );
    assert!(matches!(
        old.view().lookup_norm(&new_dn).unwrap(),
        Lookup::Missing { .. }
    ));
    drop((old, r));
    let r = store.read().unwrap();
    assert_eq!(pair(&r), "cn=user5,ou=Staff,ou=Moved,dc=example,dc=com");
    drop(r);
    // An emptied parent deleted and added again is a new entry.
    let staff = find(&store, "ou=Staff,ou=Moved,dc=example,dc=com").unwrap();
    let staff_rdns: Vec<String> = ["ou=staff", "ou=moved", "dc=example", "dc=com"]
        .map(String::from)
        .into();
    let children = store.read().unwrap().view().children(staff).unwrap();
    for c in children {
        delete(&store, c).unwrap();
    }
    delete(&store, staff).unwrap();
    let again = add(
        &store,
        "ou=Staff,ou=Moved,dc=example,dc=com",
        attrs(&[("objectClass", "organizationalUnit"), ("ou", "Staff")]),
    );
    assert_ne!(again, staff);
    let r = store.read().unwrap();
    assert_eq!(
        r.view().lookup_norm(&staff_rdns).unwrap(),
        Lookup::Found(again)
    );
    drop(r);
    assert_consistent(&store);
}

/// A store holding dc=example,dc=com, ou=People below it and cn=a below
/// that: the directory, the store, ou=People's ID and cn=a's.
fn people_store() -> (tempfile::TempDir, Store, EntryId, EntryId) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    add(
        &store,
        "dc=example,dc=com",
        attrs(&[("objectClass", "domain")]),
    );
    let ou = add(
        &store,
        "ou=People,dc=example,dc=com",
        attrs(&[("objectClass", "organizationalUnit")]),
    );
    let a = add(&store, "cn=a,ou=People,dc=example,dc=com", person("a", "1"));
    (dir, store, ou, a)
}

#[test]
fn a_dn_resolved_from_the_suffix_teaches_the_dn_cache_its_parent() {
    let (_dir, store, ou, a) = people_store();
    let b = add(&store, "cn=b,ou=People,dc=example,dc=com", person("b", "2"));
    let rdns = |cn: &str| -> Vec<String> {
        vec![
            format!("cn={cn}"),
            "ou=people".into(),
            "dc=example".into(),
            "dc=com".into(),
        ]
    };
    // Binds only: nothing on this thread formatted a DN under ou=People or
    // searched from it. The first bind DN walks down from the suffix ...
    let r = store.read().unwrap();
    let v = r.view();
    let walks = || crate::view::WALKS.with(|n| n.get());
    let before = walks();
    assert_eq!(v.lookup_norm(&rdns("a")).unwrap(), Lookup::Found(a));
    assert_eq!(walks(), before + 1);
    // ... and the next ones below the same parent do not.
    assert_eq!(v.lookup_norm(&rdns("b")).unwrap(), Lookup::Found(b));
    assert_eq!(
        v.lookup_norm(&rdns("nobody")).unwrap(),
        Lookup::Missing { matched: Some(ou) }
    );
    assert_eq!(walks(), before + 1, "resolved below the remembered parent");
    drop(r);
    // A later snapshot uses it too.
    let r = store.read().unwrap();
    assert_eq!(r.view().lookup_norm(&rdns("a")).unwrap(), Lookup::Found(a));
    assert_eq!(walks(), before + 1);
}

#[test]
fn a_search_base_found_below_its_parent_is_remembered_itself() {
    let (_dir, store, ou, a) = people_store();
    let ou_rdns: Vec<String> = ["ou=people", "dc=example", "dc=com"]
        .map(String::from)
        .into();
    let below = || crate::view::BELOW_PARENT.with(|n| n.get());
    let r = store.read().unwrap();
    let v = r.view();
    // The first search from ou=People walks from the suffix (and remembers
    // the suffix, ou=People's parent); its first result's DN makes
    // ou=People a remembered parent.
    assert_eq!(v.lookup_norm(&ou_rdns).unwrap(), Lookup::Found(ou));
    v.dn_pair(a).unwrap();
    // The next finds ou=People below the suffix, once; after that the
    // cache names it without a lookup.
    let before = below();
    for _ in 0..3 {
        assert_eq!(v.lookup_norm(&ou_rdns).unwrap(), Lookup::Found(ou));
    }
    assert_eq!(below(), before + 1);
}

#[test]
fn a_stored_dn_is_formatted_below_its_remembered_parent() {
    let (_dir, store, ou, a) = people_store();
    let reads = || crate::view::PLACEMENTS_READ.with(|n| n.get());
    {
        let r = store.read().unwrap();
        let v = r.view();
        // The first learns ou=People (and the suffix) ...
        assert_eq!(v.dn_string(a).unwrap(), "cn=a,ou=People,dc=example,dc=com");
        // ... the next reads the entry's own record only.
        let before = reads();
        assert_eq!(
            v.dn(a).unwrap().to_string(),
            "cn=a,ou=People,dc=example,dc=com"
        );
        assert_eq!(reads(), before + 1);
    }
    // A rename above it is seen by the next reader.
    let suffix = find(&store, "dc=example,dc=com").unwrap();
    let staff = Placement {
        parent: suffix,
        rdn: "ou=Staff".into(),
        norm_rdn: "ou=staff".into(),
    };
    store.write_blocking(move |w| w.rename(ou, &staff)).unwrap();
    let r = store.read().unwrap();
    assert_eq!(
        r.view().dn_string(a).unwrap(),
        "cn=a,ou=Staff,dc=example,dc=com"
    );
    // A write view (no DN cache) walks, with the same answer.
    let dn = store.write_blocking(move |w| w.view().dn_string(a));
    assert_eq!(dn.unwrap(), "cn=a,ou=Staff,dc=example,dc=com");
}

/// Regression (found by the model check): a read transaction older than an
/// add resolved the added entry's DN through the DN cache, filled by a
/// newer transaction of the same generation (adds do not change it), to an
/// ID its own snapshot does not hold; below that entry, a missing DN named
/// it as the matched entry.
#[test]
fn an_older_reader_does_not_find_entries_added_since_through_the_dn_cache() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let suffix = add(
        &store,
        "dc=example,dc=com",
        attrs(&[("objectClass", "domain")]),
    );
    let old = store.read().unwrap();
    let ou = add(
        &store,
        "ou=Added,dc=example,dc=com",
        attrs(&[("objectClass", "organizationalUnit")]),
    );
    let user = add(&store, "cn=c,ou=Added,dc=example,dc=com", person("c", "1"));
    let ou_rdns: Vec<String> = ["ou=added", "dc=example", "dc=com"]
        .map(String::from)
        .into();
    let user_rdns: Vec<String> = ["cn=c", "ou=added", "dc=example", "dc=com"]
        .map(String::from)
        .into();
    // A newer reader on this thread learns the new entry's DN (as a parent)
    // and then resolves it, caching its ID.
    let r = store.read().unwrap();
    r.view().dn_pair(user).unwrap();
    assert_eq!(r.view().lookup_norm(&ou_rdns).unwrap(), Lookup::Found(ou));
    assert_eq!(
        r.view().lookup_norm(&user_rdns).unwrap(),
        Lookup::Found(user)
    );
    drop(r);
    let v = old.view();
    assert_eq!(v.attrs(ou).unwrap(), None, "not in the older snapshot");
    let checks = crate::view::HOLDS_CHECKED.with(|n| n.get());
    assert_eq!(
        v.lookup_norm(&ou_rdns).unwrap(),
        Lookup::Missing {
            matched: Some(suffix)
        }
    );
    assert!(
        crate::view::HOLDS_CHECKED.with(|n| n.get()) > checks,
        "the older snapshot checked"
    );
    assert_eq!(
        v.lookup_norm(&user_rdns).unwrap(),
        Lookup::Missing {
            matched: Some(suffix)
        }
    );
    drop(old);
    // And the newer snapshot still finds both, from the cache or not; the
    // cached base without reading whether it holds it (it holds all the
    // snapshot that resolved it held).
    let r = store.read().unwrap();
    let checks = crate::view::HOLDS_CHECKED.with(|n| n.get());
    assert_eq!(r.view().lookup_norm(&ou_rdns).unwrap(), Lookup::Found(ou));
    assert_eq!(crate::view::HOLDS_CHECKED.with(|n| n.get()), checks);
    assert_eq!(
        r.view().lookup_norm(&user_rdns).unwrap(),
        Lookup::Found(user)
    );
}

#[test]
fn delete_needs_a_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    assert!(delete(&store, people).is_err());
    let leaf = find(&store, "cn=user0,ou=People,dc=example,dc=com").unwrap();
    delete(&store, leaf).unwrap();
    assert!(find(&store, "cn=user0,ou=People,dc=example,dc=com").is_none());
    assert_consistent(&store);
}

/// Regression (found by the model check): `rename` trusted its caller. A
/// new DN held by another entry overwrote that entry's dn2id key, and a
/// move below the entry itself made a parent cycle cut off from the
/// suffix; both committed, and only `verify` noticed the first.
#[test]
fn rename_refuses_a_taken_dn_and_a_move_below_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let user1 = find(&store, "cn=user1,ou=People,dc=example,dc=com").unwrap();
    let user2 = find(&store, "cn=user2,ou=People,dc=example,dc=com").unwrap();
    let rename = |id: EntryId, to: Placement| store.write_blocking(move |w| w.rename(id, &to));
    // Onto a sibling's DN (in another case: the key is normalised).
    let taken = Placement {
        parent: people,
        rdn: "CN=User2".into(),
        norm_rdn: "cn=user2".into(),
    };
    assert!(matches!(rename(user1, taken), Err(StoreError::Corrupt(_))));
    // Below itself, and below its own child.
    let own = |parent| Placement {
        parent,
        rdn: "ou=Loop".into(),
        norm_rdn: "ou=loop".into(),
    };
    assert!(matches!(
        rename(people, own(people)),
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        rename(people, own(user2)),
        Err(StoreError::Corrupt(_))
    ));
    // Its own DN in another case is its own to take.
    let recased = Placement {
        parent: people,
        rdn: "CN=USER1".into(),
        norm_rdn: "cn=user1".into(),
    };
    rename(user1, recased).unwrap();
    let r = store.read().unwrap();
    assert_eq!(
        r.view().dn_string(user1).unwrap(),
        "CN=USER1,ou=People,dc=example,dc=com"
    );
    assert_eq!(
        r.view().dn_string(user2).unwrap(),
        "cn=user2,ou=People,dc=example,dc=com"
    );
    drop(r);
    assert_eq!(
        find(&store, "cn=user2,ou=People,dc=example,dc=com"),
        Some(user2)
    );
    assert_consistent(&store);
}

#[derive(Debug, PartialEq)]
enum TestErr {
    Store(StoreError),
    Refused,
}

impl From<StoreError> for TestErr {
    fn from(e: StoreError) -> Self {
        TestErr::Store(e)
    }
}

#[test]
fn a_failing_job_rolls_back_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let results = rt.block_on(async {
        let mut futs = Vec::new();
        for i in 0..10 {
            let a = person(&format!("batch{i}"), "1");
            let p = Placement {
                parent: people,
                rdn: format!("cn=batch{i}"),
                norm_rdn: format!("cn=batch{i}"),
            };
            futs.push(store.write(move |w| -> Result<EntryId, TestErr> {
                let id = w.add(&p, &a)?;
                // Odd jobs fail after writing: their writes must vanish.
                if i % 2 == 1 {
                    return Err(TestErr::Refused);
                }
                Ok(id)
            }));
        }
        let mut out = Vec::new();
        for f in futs {
            out.push(f.await);
        }
        out
    });
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.is_ok(), i % 2 == 0, "job {i}: {r:?}");
        let found = find(&store, &format!("cn=batch{i},ou=People,dc=example,dc=com"));
        assert_eq!(found.is_some(), i % 2 == 0, "job {i}");
    }
    assert_consistent(&store);
}

#[test]
fn verify_finds_damage() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let id = find(&store, "cn=user4,ou=People,dc=example,dc=com").unwrap();
    // A posting that names an entry whose values do not produce the key.
    store
        .write_blocking(move |w| -> Result<(), StoreError> {
            let db = w.view().index_db("cn", IndexKind::Eq).copied().unwrap();
            crate::postings::change(&mut w.txn, &db, b"somebody else", id, true)?;
            Ok(())
        })
        .unwrap();
    // A flipped byte inside a stored entry.
    store
        .write_blocking(move |w| -> Result<(), StoreError> {
            let mut bytes = w.view().entry_bytes(id)?.unwrap().to_vec();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x20;
            w.inner.id2entry.put(&mut w.txn, &id_bytes(id), &bytes)?;
            Ok(())
        })
        .unwrap();
    // A key another entry produces, gone from the index (a key that
    // names one entry: checked without a bitmap).
    let other = find(&store, "cn=user3,ou=People,dc=example,dc=com").unwrap();
    let gone = store
        .write_blocking(move |w| -> Result<Vec<u8>, StoreError> {
            let v = w.view();
            let attrs = v.entry(other)?.unwrap().attrs;
            let db = v.index_db("cn", IndexKind::Eq).copied().unwrap();
            let key = v.keys_of(&attrs, "cn", IndexKind::Eq).pop_first().unwrap();
            crate::postings::change(&mut w.txn, &db, &key, other, false)?;
            Ok(key)
        })
        .unwrap();
    let problems = store.read().unwrap().view().verify().unwrap();
    let text = problems.join("\n");
    assert!(text.contains("ix:cn:eq"), "{text}");
    assert!(
        text.contains(&format!("id2entry record {id}: checksum mismatch")),
        "{text}"
    );
    let missing = format!(
        "ix:cn:eq: key {:?} is missing (entries [{other}])",
        String::from_utf8_lossy(&gone)
    );
    assert!(text.contains(&missing), "{text}");
    assert!(
        text.contains("key \"somebody else\" lists 1 IDs, entries produce 0"),
        "{text}"
    );
}

#[test]
fn reopen_keeps_data_and_builds_new_indexes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        tree(&store);
        store.close();
    }
    let opts = StoreOptions {
        map_size: 64 << 20,
        indexes: vec![IndexSpec {
            attr: "sn".into(),
            kinds: vec![IndexKind::Eq],
        }],
        max_batch: 16,
        durability: Durability::Durable,
        compression: Some(3),
        check_all_pages: true,
    };
    let store = Store::open(dir.path(), Arc::new(Schema::standard()), &opts).unwrap();
    let r = store.read().unwrap();
    assert_eq!(r.view().entry_count().unwrap(), 22);
    assert_eq!(
        ids(r
            .view()
            .candidates(&Filter::parse("(sn=X)").unwrap())
            .unwrap())
        .len(),
        20
    );
    drop(r);
    assert_consistent(&store);
}

#[test]
fn rebuild_repairs_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    store
        .write_blocking(move |w| -> Result<(), StoreError> {
            let db = w.view().index_db("cn", IndexKind::Sub).copied().unwrap();
            db.clear(&mut w.txn)?;
            Ok(())
        })
        .unwrap();
    assert!(!store.read().unwrap().view().verify().unwrap().is_empty());
    assert_eq!(
        store
            .rebuild_indexes(&["CN".to_string()], &mut |_| {})
            .unwrap(),
        22
    );
    assert_consistent(&store);
}

#[test]
fn durability_modes_switch_at_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    for (round, mode) in [
        Durability::Batched {
            max_writes: 5,
            max_ms: 20,
        },
        Durability::None,
        Durability::Durable,
    ]
    .into_iter()
    .enumerate()
    {
        store.set_durability(mode);
        for i in 0..12 {
            let cn = format!("m{round}x{i}");
            add_under(&store, people, &cn, person(&cn, "1"));
        }
        assert_eq!(store.durability(), mode);
        // Only unsynced `none` commits can leave damage: only they are marked.
        assert_eq!(
            unsynced_marker::present(dir.path()),
            mode == Durability::None,
            "{mode:?}"
        );
    }
    // Batched mode synced at least every 5 writes; leaving it synced the rest.
    let figures = store.writer_stats();
    assert!(figures.syncs >= 2, "{figures:?}");
    assert!(figures.operations >= 36 + 22, "{figures:?}");
    assert_eq!(store.read().unwrap().view().entry_count().unwrap(), 22 + 36);
    assert_consistent(&store);
}

#[test]
fn an_index_dropped_and_added_back_is_rebuilt_not_stale() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        tree(&store);
        store.close();
    }
    // Without the cn indexes, write more entries.
    let without = StoreOptions {
        map_size: 64 << 20,
        indexes: vec![IndexSpec {
            attr: "objectClass".into(),
            kinds: vec![IndexKind::Eq],
        }],
        max_batch: 16,
        durability: Durability::Durable,
        compression: Some(3),
        check_all_pages: true,
    };
    {
        let store = Store::open(dir.path(), Arc::new(Schema::standard()), &without).unwrap();
        add(
            &store,
            "cn=later,ou=People,dc=example,dc=com",
            person("later", "7"),
        );
        store.close();
    }
    let store = open(dir.path());
    let r = store.read().unwrap();
    let hits = ids(r
        .view()
        .candidates(&Filter::parse("(cn=later)").unwrap())
        .unwrap());
    assert_eq!(
        hits.len(),
        1,
        "the re-added index must include entries written while it was off"
    );
    drop(r);
    assert_consistent(&store);
}

#[test]
fn older_format_is_read_and_marked_current_newer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    store
        .write_blocking(|w| -> Result<(), StoreError> {
            Ok(w.inner
                .meta
                .put(&mut w.txn, META_FORMAT, &OLDEST_FORMAT.to_be_bytes())?)
        })
        .unwrap();
    store.close();
    let store = open(dir.path());
    let r = store.read().unwrap();
    let format = r
        .view()
        .inner
        .meta
        .get(r.txn(), META_FORMAT)
        .unwrap()
        .unwrap()
        .to_vec();
    assert_eq!(format, FORMAT_VERSION.to_be_bytes());
    assert!(find(&store, "cn=user4,ou=People,dc=example,dc=com").is_some());
    drop(r);
    store
        .write_blocking(|w| -> Result<(), StoreError> {
            Ok(w.inner
                .meta
                .put(&mut w.txn, META_FORMAT, &(FORMAT_VERSION + 1).to_be_bytes())?)
        })
        .unwrap();
    store.close();
    let opts = StoreOptions::default();
    let err = Store::open(dir.path(), Arc::new(Schema::standard()), &opts)
        .err()
        .expect("a newer format is refused");
    assert!(matches!(err, StoreError::Format(_)), "{err}");
}

/// A format 2 store (one serialised list per key in `idx:` databases,
/// 8 bytes for a single ID) opened by this version: marked format 3, its
/// indexes rebuilt in chunks under `ix:` names, the `idx:` ones emptied,
/// and every lookup answered as before.
#[test]
fn format_2_indexes_are_rebuilt_in_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let probe = |store: &Store| {
        let r = store.read().unwrap();
        let v = r.view();
        let n = |f: &str| ids(v.candidates(&Filter::parse(f).unwrap()).unwrap()).len();
        (n("(cn=USER3)"), n("(cn=*ser1*)"), n("(uidNumber>=15)"))
    };
    let before = probe(&store);
    assert_eq!(before, (1, 11, 5));
    // Rewrite the store as format 2 had it.
    store
        .write_blocking(|w| -> Result<(), StoreError> {
            let mut old_names = Vec::new();
            let view_dbs: Vec<(String, Db)> = w
                .inner
                .catalog
                .load()
                .ready()
                .map(|(a, i)| (format!("{a}:{}", i.kind), i.db))
                .collect();
            for (name, db) in view_dbs {
                let mut lists = Vec::new();
                postings::each_key(&w.txn, &db, &mut |k, ids| lists.push((k.to_vec(), ids)))?;
                let old: Db = w
                    .inner
                    .env
                    .create_database(&mut w.txn, Some(&format!("idx:{name}")))?;
                for (k, ids) in lists {
                    let mut v = Vec::new();
                    if ids.len() == 1 {
                        v.extend_from_slice(&ids.min().unwrap().to_be_bytes());
                    } else {
                        ids.serialize_into(&mut v).unwrap();
                    }
                    old.put(&mut w.txn, &k, &v)?;
                }
                db.clear(&mut w.txn)?;
                old_names.push(format!("idx:{name}"));
            }
            w.inner
                .meta
                .put(&mut w.txn, META_INDEXES, old_names.join("\n").as_bytes())?;
            w.inner
                .meta
                .put(&mut w.txn, META_FORMAT, &2u32.to_be_bytes())?;
            Ok(())
        })
        .unwrap();
    store.close();
    let store = open(dir.path());
    assert_eq!(probe(&store), before);
    assert_consistent(&store);
    let r = store.read().unwrap();
    let meta = |k: &[u8]| {
        r.view()
            .inner
            .meta
            .get(r.txn(), k)
            .unwrap()
            .unwrap()
            .to_vec()
    };
    assert_eq!(meta(META_FORMAT), FORMAT_VERSION.to_be_bytes());
    let listed = String::from_utf8(meta(META_INDEXES)).unwrap();
    assert!(listed.lines().all(|n| n.starts_with("ix:")), "{listed}");
    let old: Db = r
        .view()
        .inner
        .env
        .open_database(r.txn(), Some("idx:cn:eq"))
        .unwrap()
        .unwrap();
    assert_eq!(
        old.len(r.txn()).unwrap(),
        0,
        "the format 2 index is emptied"
    );
}

/// A store of format 3 to 5 (placements in `id2parent`, a format 3
/// record holding the normalised RDN always) opened by this version:
/// marked current, nothing rebuilt, every DN and lookup as before; an
/// entry added or written from then on holds its placement in its record,
/// and its `id2parent` record goes.
#[test]
fn id2parent_placements_read_as_they_are_and_move_into_records_when_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let dns = |store: &Store| {
        let r = store.read().unwrap();
        let v = r.view();
        let mut out = Vec::new();
        for item in v.inner.id2entry.iter(r.txn()).unwrap() {
            let id = id_from(item.unwrap().0).unwrap();
            out.push(v.dn_pair(id).unwrap());
        }
        out
    };
    let before = dns(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let user3 = find(&store, "cn=user3,ou=People,dc=example,dc=com").unwrap();
    store
        .write_blocking(|w| -> Result<(), StoreError> {
            let mut old = Vec::new();
            for item in w.inner.id2entry.iter(&w.txn)? {
                let (k, v) = item?;
                let id = id_from(k)?;
                let p = read_place(id, entry_codec::placement_of(id, v)?.unwrap())?;
                let mut place = id_bytes(p.parent).to_vec();
                place.extend_from_slice(&(p.rdn.len() as u16).to_be_bytes());
                place.extend_from_slice(p.rdn.as_bytes());
                place.extend_from_slice(p.norm_rdn.as_bytes());
                old.push((k.to_vec(), place, entry_codec::tests::unplaced(v)?));
            }
            for (k, place, rec) in old {
                w.inner.id2parent.put(&mut w.txn, &k, &place)?;
                w.inner.id2entry.put(&mut w.txn, &k, &rec)?;
            }
            w.inner
                .meta
                .put(&mut w.txn, META_FORMAT, &3u32.to_be_bytes())?;
            Ok(())
        })
        .unwrap();
    store.close();
    let store = open(dir.path());
    assert_eq!(dns(&store), before);
    assert_eq!(find(&store, "ou=People,dc=example,dc=com"), Some(people));
    assert_consistent(&store);
    add(
        &store,
        "uid=new,ou=People,dc=example,dc=com",
        attrs(&[("objectClass", "account"), ("uid", "new")]),
    );
    let new = find(&store, "UID=New,ou=people,dc=example,dc=com").unwrap();
    // An old entry modified, another renamed: their placements move.
    let old = store.read().unwrap().view().attrs(user3).unwrap().unwrap();
    let mut changed = old.clone();
    changed.push(Attribute {
        desc: "description".into(),
        values: vec![b"moved".to_vec()],
    });
    store
        .write_blocking(move |w| w.replace(user3, &old, &changed))
        .unwrap();
    let user4 = find(&store, "cn=user4,ou=People,dc=example,dc=com").unwrap();
    let to = Placement {
        parent: people,
        rdn: "cn=User4b".into(),
        norm_rdn: "cn=user4b".into(),
    };
    store.write_blocking(move |w| w.rename(user4, &to)).unwrap();
    assert_consistent(&store);
    let r = store.read().unwrap();
    let v = r.view();
    assert_eq!(v.store_format().unwrap(), FORMAT_VERSION);
    for id in [new, user3, user4] {
        let rec = v.entry_bytes(id).unwrap().unwrap();
        assert!(
            entry_codec::placement_of(id, rec).unwrap().is_some(),
            "{id}"
        );
        assert!(v
            .inner
            .id2parent
            .get(r.txn(), &id_bytes(id))
            .unwrap()
            .is_none());
    }
    assert_eq!(
        v.dn_pair(user4).unwrap().0,
        "cn=User4b,ou=People,dc=example,dc=com"
    );
    assert_eq!(
        v.inner.id2parent.len(r.txn()).unwrap(),
        before.len() as u64 - 2,
        "the entries not written keep theirs"
    );
    drop(r);
    for id in [user3, user4] {
        delete(&store, id).unwrap();
    }
    assert_consistent(&store);
}

/// A format 4 store (index records ending in a 6-byte chunk number)
/// opened by this version: read-only, its indexes
/// are not used and searches still answer right; opened for writing, they
/// are rebuilt in the short layout, once, and answer as before.
#[test]
fn format_4_indexes_are_rebuilt_in_the_short_layout() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = StoreOptions {
        durability: Durability::Durable,
        ..crate::model_check::options()
    };
    opts.indexes.push(IndexSpec {
        attr: "entryUUID".into(),
        kinds: vec![IndexKind::Eq],
    });
    let schema = Arc::new(Schema::standard());
    let store = Store::open(dir.path(), schema.clone(), &opts).unwrap();
    tree(&store);
    let uuid = |i: u32| format!("{i:08x}-75f2-44a3-91aa-5b2ce7704b{:02x}", i * 7);
    for i in 0..30u32 {
        let mut a = person(&format!("u{i}"), &(100 + i).to_string());
        a.push(Attribute {
            desc: "entryUUID".into(),
            values: vec![uuid(i).into_bytes()],
        });
        add(&store, &format!("cn=u{i},ou=People,dc=example,dc=com"), a);
    }
    let wanted = uuid(17).to_ascii_uppercase();
    let filters = [
        "(cn=USER3)".to_string(),
        "(cn=*ser1*)".into(),
        "(uidNumber>=115)".into(),
        format!("(entryUUID={wanted})"),
    ];
    let probe = |store: &Store| -> Vec<Vec<u64>> {
        let r = store.read().unwrap();
        let v = r.view();
        filters
            .iter()
            .map(|f| ids(v.candidates(&Filter::parse(f).unwrap()).unwrap()))
            .collect()
    };
    let before = probe(&store);
    assert_eq!(
        before.iter().map(Vec::len).collect::<Vec<_>>(),
        [1, 11, 15, 1]
    );
    // Rewrite every index record with a 6-byte chunk number, as format 4
    // had it (its keys differed too: UUIDs and values as text).
    store
        .write_blocking(move |w| -> Result<(), StoreError> {
            let dbs: Vec<(String, Db)> = w
                .inner
                .catalog
                .load()
                .ready()
                .map(|(a, i)| (a.to_string(), i.db))
                .collect();
            for (attr, db) in dbs {
                let mut old = Vec::new();
                for item in db.iter(&w.txn)? {
                    let (k, v) = item?;
                    let (key, chunk) = postings::split_record_key(k)?;
                    if attr == "entryuuid" {
                        assert_eq!(key.len(), 4, "a UUID keyed by its first bytes");
                    }
                    let mut rec = Vec::new();
                    for b in key {
                        rec.push(b);
                        if b == 0 {
                            rec.push(0xFF);
                        }
                    }
                    rec.extend_from_slice(&[0, 0]);
                    rec.extend_from_slice(&chunk.to_be_bytes()[2..]);
                    old.push((rec, v.to_vec()));
                }
                db.clear(&mut w.txn)?;
                for (k, v) in old {
                    db.put(&mut w.txn, &k, &v)?;
                }
            }
            w.inner
                .meta
                .put(&mut w.txn, META_FORMAT, &4u32.to_be_bytes())?;
            Ok(())
        })
        .unwrap();
    store.close();
    // Read-only: no index of the old layout is used (searches scan).
    let ro = Store::open_read_only(dir.path(), schema.clone(), &opts).unwrap();
    {
        let r = ro.read().unwrap();
        let v = r.view();
        for f in &filters {
            let f = Filter::parse(f).unwrap();
            assert_eq!(v.candidates(&f).unwrap(), Candidates::All, "{f:?}");
        }
        assert_eq!(v.store_format().unwrap(), 4);
    }
    ro.close();
    let store = Store::open(dir.path(), schema, &opts).unwrap();
    assert_eq!(probe(&store), before);
    assert_consistent(&store);
    let r = store.read().unwrap();
    let v = r.view();
    assert_eq!(v.store_format().unwrap(), FORMAT_VERSION);
    let db = v.index_db("entryuuid", IndexKind::Eq).unwrap();
    let mut records = 0;
    for item in db.iter(r.txn()).unwrap() {
        let rec = item.unwrap().0;
        let (key, chunk) = postings::split_record_key(rec).unwrap();
        assert_eq!((key.len(), chunk), (index::EQ_KEY_LEN, 0));
        // The key, END and a one-byte chunk number.
        assert_eq!(rec.len(), postings::escaped_len(&key) + 1 + 1);
        records += 1;
    }
    assert_eq!(records, 30);
}

/// `dn2id` values written before store format 7 (8 bytes) name their
/// entries as the short ones do: DNs resolve, children are listed, verify
/// passes, and a renamed entry's record is written short.
#[test]
fn eight_byte_dn2id_values_read_as_short_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let lengths = |store: &Store| -> Vec<usize> {
        let r = store.read().unwrap();
        let v = r.view();
        let out = v
            .inner
            .dn2id
            .iter(r.txn())
            .unwrap()
            .map(|i| i.unwrap().1.len())
            .collect();
        out
    };
    assert!(lengths(&store).iter().all(|&l| l == 1), "IDs below 256");
    store
        .write_blocking(|w| -> Result<(), StoreError> {
            let db = w.inner.dn2id;
            let all: Vec<(Vec<u8>, u64)> = db
                .iter(&w.txn)?
                .map(|i| i.map(|(k, v)| (k.to_vec(), dn2id_id(v).unwrap())))
                .collect::<Result<_, _>>()?;
            for (k, id) in all {
                db.put(&mut w.txn, &k, &id_bytes(id))?;
            }
            Ok(())
        })
        .unwrap();
    assert!(lengths(&store).iter().all(|&l| l == 8));
    assert_consistent(&store);
    let u3 = find(&store, "cn=user3,ou=People,dc=example,dc=com").unwrap();
    {
        let r = store.read().unwrap();
        let v = r.view();
        assert_eq!(v.children(people).unwrap().len(), 20);
        assert!(v.children(people).unwrap().contains(&u3));
        assert_eq!(v.subtree(people, 100).unwrap().unwrap().len(), 21);
    }
    let to = Placement {
        parent: people,
        rdn: "cn=renamed".into(),
        norm_rdn: "cn=renamed".into(),
    };
    store.write_blocking(move |w| w.rename(u3, &to)).unwrap();
    assert_eq!(
        find(&store, "cn=renamed,ou=People,dc=example,dc=com"),
        Some(u3)
    );
    assert_eq!(lengths(&store).iter().filter(|&&l| l == 1).count(), 1);
    assert_consistent(&store);
}

/// A store of format 7 (`dn2id` keys with 8-byte parent IDs) is read as
/// it is read-only, and its keys are rewritten short, in the same order,
/// when it is opened for writing: DNs resolve, children are listed in
/// order, verify passes, and changes after the upgrade write short keys.
#[test]
fn a_format_7_store_gets_short_dn2id_keys_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let u3 = "cn=user3,ou=People,dc=example,dc=com";
    let listing = |store: &Store| {
        let r = store.read().unwrap();
        let v = r.view();
        let children = v.children(people).unwrap();
        let sub = v.subtree(people, 100).unwrap().unwrap().len();
        (children, sub, v.has_children(people).unwrap())
    };
    let before = listing(&store);
    assert_eq!((before.0.len(), before.1), (20, 21));
    let keys = |store: &Store| -> Vec<Vec<u8>> {
        let r = store.read().unwrap();
        let v = r.view();
        let out = v.inner.dn2id.iter(r.txn()).unwrap();
        out.map(|i| i.unwrap().0.to_vec()).collect()
    };
    let short = keys(&store);
    // As format 7 wrote them: each parent ID in 8 bytes.
    store
        .write_blocking(|w| -> Result<(), StoreError> {
            let db = w.inner.dn2id;
            let all: Vec<(Vec<u8>, Vec<u8>)> = db
                .iter(&w.txn)?
                .map(|i| i.map(|(k, v)| (k.to_vec(), v.to_vec())))
                .collect::<Result<_, _>>()?;
            db.clear(&mut w.txn)?;
            for (k, v) in all {
                let n = k[0] as usize;
                let mut parent = [0u8; 8];
                parent[8 - n..].copy_from_slice(&k[1..=n]);
                let mut wide = parent.to_vec();
                wide.extend_from_slice(&k[1 + n..]);
                db.put(&mut w.txn, &wide, &v)?;
            }
            w.inner
                .meta
                .put(&mut w.txn, META_FORMAT, &7u32.to_be_bytes())?;
            Ok(())
        })
        .unwrap();
    store.close();
    let schema = Arc::new(Schema::standard());
    let opts = StoreOptions {
        max_batch: 16,
        durability: Durability::Durable,
        ..crate::model_check::options()
    };
    let ro = Store::open_read_only(dir.path(), schema, &opts).unwrap();
    let wide = keys(&ro);
    assert!(wide.iter().all(|k| k.len() > 8 && k[0] == 0));
    assert!(find(&ro, u3).is_some());
    assert_eq!(listing(&ro), before);
    assert_consistent(&ro);
    ro.close();
    let store = open(dir.path());
    assert_eq!(
        keys(&store),
        short,
        "the same keys as format 8 writes, in order"
    );
    assert_eq!(listing(&store), before);
    assert_eq!(store.read().unwrap().view().store_format().unwrap(), 8);
    assert_consistent(&store);
    let id = find(&store, u3).unwrap();
    delete(&store, id).unwrap();
    add_under(&store, people, "new", person("new", "1"));
    assert!(find(&store, u3).is_none());
    assert!(find(&store, "cn=new,ou=People,dc=example,dc=com").is_some());
    assert!(keys(&store).iter().all(|k| k[0] != 0));
    assert_consistent(&store);
    store.close();
    // A second opening finds nothing to rewrite.
    let store = open(dir.path());
    assert_eq!(listing(&store).0.len(), 20);
    assert_consistent(&store);
}

/// A load into an empty store writes dn2id again in key order at the end:
/// every DN resolves, duplicates were still refused during the load, and
/// its pages are full (inserted in input order they came out half full).
#[test]
fn bulk_load_into_an_empty_store_repacks_dn2id() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut load = store
        .bulk_load(&bulk::BulkOptions {
            memory: 1 << 20,
            spill_dir: dir.path().join("runs"),
            commit_every: 500,
        })
        .unwrap();
    let (mut rec, mut keys) = (Vec::new(), Vec::new());
    let mut add = |load: &mut bulk::BulkLoad<'_>, parent, rdn: String, a: Vec<Attribute>| {
        store.codec().encode_with(&a, None, &mut rec);
        store.index_keys_packed(&a, &mut keys);
        let place = Placement {
            parent,
            norm_rdn: rdn.to_ascii_lowercase(),
            rdn,
        };
        load.add(&place, &rec, &keys).unwrap()
    };
    let root = add(
        &mut load,
        0,
        "dc=example,dc=com".into(),
        attrs(&[("objectClass", "domain"), ("dc", "example")]),
    )
    .unwrap();
    let n = 20_000;
    for i in 0..n {
        let a = person(&format!("user.{i}"), &i.to_string());
        assert!(add(&mut load, root, format!("cn=user.{i}"), a).is_ok());
    }
    let again = add(&mut load, root, "CN=user.7".into(), person("user.7", "7"));
    assert!(again.is_err(), "a duplicate DN is refused during the load");
    let fig = load.finish(&mut |_, _| {}).unwrap();
    assert!(fig.spilled_runs >= 1, "{fig:?}");
    assert_eq!(fig.entries, n + 1);
    assert_consistent(&store);
    for i in [0, 1, 10, 9_999, n - 1] {
        let dn = format!("cn=USER.{i},dc=example,dc=com");
        assert!(find(&store, &dn).is_some(), "{dn}");
    }
    assert!(find(&store, "cn=user.20000,dc=example,dc=com").is_none());
    let r = store.read().unwrap();
    let stat = r.view().inner.dn2id.stat(r.txn()).unwrap();
    assert_eq!(stat.entries as u64, n + 1);
    // A record: node header 8, key 8 + ~12, value 3, pointer 2 ≈ 33 bytes.
    let full = (n as usize * 33).div_ceil(stat.page_size as usize - 16);
    assert!(
        stat.leaf_pages <= full * 11 / 10,
        "{} leaf pages, full would be about {full}",
        stat.leaf_pages
    );
}

#[test]
fn bulk_load_appends_entries_and_builds_indexes_by_merge() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let before = store.read().unwrap().view().entry_count().unwrap();
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let mut load = store
        .bulk_load(&bulk::BulkOptions {
            memory: 1 << 20,
            spill_dir: dir.path().join("runs"),
            commit_every: 100,
        })
        .unwrap();
    let samples: Vec<Vec<u8>> = (0..200)
        .map(|i| entry_codec::body_of(&person(&format!("bulk{i}"), &i.to_string())))
        .collect();
    let dict = load
        .install_dict(entry_codec::train(&samples, 2048).unwrap())
        .unwrap();
    let (mut rec, mut keys) = (Vec::new(), Vec::new());
    for i in 0..3000 {
        let a = person(&format!("bulk{i}"), &i.to_string());
        store.codec().encode_with(&a, Some(&dict), &mut rec);
        store.index_keys_packed(&a, &mut keys);
        let place = Placement {
            parent: people,
            rdn: format!("cn=bulk{i}"),
            norm_rdn: format!("cn=bulk{i}"),
        };
        assert!(load.add(&place, &rec, &keys).unwrap().is_ok());
    }
    // The same DN again is refused, naming the entry that holds it.
    let dup = Placement {
        parent: people,
        rdn: "cn=bulk7".into(),
        norm_rdn: "cn=bulk7".into(),
    };
    assert!(load.add(&dup, &rec, &keys).unwrap().is_err());
    let fig = load.finish(&mut |_, _| {}).unwrap();
    assert_eq!(fig.entries, 3000);
    assert!(fig.spilled_runs >= 1, "{fig:?}");
    let r = store.read().unwrap();
    let v = r.view();
    assert_eq!(v.entry_count().unwrap(), before + 3000);
    assert_eq!(v.verify().unwrap(), Vec::<String>::new());
    let id = find(&store, "cn=bulk2999,ou=People,dc=example,dc=com").unwrap();
    let e = v.entry(id).unwrap().unwrap();
    assert_eq!(e.get("cn").unwrap().values, vec![b"bulk2999".to_vec()]);
    // Existing postings (objectClass person from `tree`) were merged, not replaced.
    let f = Filter::parse("(objectClass=person)").unwrap();
    match v.candidates(&f).unwrap() {
        Candidates::Ids(ids) => assert!(ids.len() >= 3000 + 10, "{}", ids.len()),
        other => panic!("{other:?}"),
    }
}

/// Regression: the raw search path held the thread's decompression buffer
/// while its callback ran access checks, and a check that decoded another
/// compressed entry on the same thread (a group read for a group subject)
/// borrowed the buffer again and panicked ("already borrowed").
#[test]
fn an_entry_decoded_while_a_raw_entry_is_borrowed_reads_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    // Long enough to be stored compressed (short bodies stay plain).
    let big = |cn: &str| {
        let mut a = person(cn, "1");
        a.push(Attribute {
            desc: "description".into(),
            values: vec![format!("{cn} ").repeat(100).into_bytes()],
        });
        a
    };
    let outer = add(&store, "cn=outer,ou=People,dc=example,dc=com", big("outer"));
    let inner = add(&store, "cn=inner,ou=People,dc=example,dc=com", big("inner"));
    let r = store.read().unwrap();
    let view = r.view();
    for id in [outer, inner] {
        let b = view.entry_bytes(id).unwrap().unwrap();
        assert_eq!(
            b[0],
            entry_codec::ENTRY_FORMAT_ZSTD_BARE | entry_codec::PLACED,
            "entry {id} compressed"
        );
    }
    let collect = |raw: entry_codec::RawAttrs<'_>| -> Vec<Attribute> {
        raw.map(|(d, vs)| Attribute {
            desc: d.to_string(),
            values: vs.map(<[u8]>::to_vec).collect(),
        })
        .collect()
    };
    let (outer_seen, inner_seen, inner_raw) = view
        .with_raw_attrs(outer, |raw| {
            // Decoded while `raw` borrows the outer body, nested twice.
            let inner_attrs = view.attrs(inner).unwrap().unwrap();
            let inner_entry = view.entry(inner).unwrap().unwrap();
            assert_eq!(inner_entry.attrs, inner_attrs);
            let inner_raw = view.with_raw_attrs(inner, collect).unwrap().unwrap();
            (collect(raw), inner_attrs, inner_raw)
        })
        .unwrap()
        .unwrap();
    assert_eq!(outer_seen, big("outer"));
    assert_eq!(inner_seen, big("inner"));
    assert_eq!(inner_raw, big("inner"));
    // And the thread's buffer still works afterwards.
    assert_eq!(view.attrs(outer).unwrap().unwrap(), big("outer"));
}

/// splitmix64: a seeded stream, so a failing sequence replays exactly.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The model check (`model_check`, also the `store_model` fuzz target) over
/// seeded pseudo-random inputs: adds, modifies, renames and deletes, alone,
/// in jobs of several and in batches, compared with a model after `verify`.
#[test]
fn store_agrees_with_its_model_on_seeded_inputs() {
    let mut state = 0x5eed_f00d_u64;
    for seq in 0..MODEL_SEQUENCES {
        let len = 64 + splitmix(&mut state) % 448;
        let input: Vec<u8> = (0..len).map(|_| splitmix(&mut state) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let outcome = std::panic::catch_unwind(|| crate::model_check::run(dir.path(), &input));
        if let Err(e) = outcome {
            eprintln!("sequence {seq} failed; input: {input:02x?}");
            std::panic::resume_unwind(e);
        }
    }
}

/// Inputs of the seeded model test; each runs on a fresh store.
const MODEL_SEQUENCES: u64 = 250;

/// A store whose trees have several levels, overflow records and a free
/// list: entries with large values, some deleted and rewritten.
fn busy_store(dir: &Path, rounds: usize) -> Vec<u8> {
    let store = open(dir);
    tree(&store);
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    for round in 0..rounds {
        for i in 0..60 {
            let big = "v".repeat(if i % 7 == 0 { 9000 } else { 300 });
            let mut a = person(&format!("b{round}x{i}"), &i.to_string());
            a.push(Attribute {
                desc: "description".into(),
                values: vec![big.into_bytes()],
            });
            add_under(&store, people, &format!("b{round}x{i}"), a);
        }
        if round > 0 {
            for i in (0..60).step_by(3) {
                let id = find(
                    &store,
                    &format!("cn=b{}x{i},ou=People,dc=example,dc=com", round - 1),
                )
                .unwrap();
                delete(&store, id).unwrap();
            }
        }
    }
    assert_consistent(&store);
    store.close();
    std::fs::read(dir.join(DATA_FILE)).unwrap()
}

#[test]
fn file_check_accepts_sound_stores() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = busy_store(dir.path(), 3);
    assert_eq!(preflight(dir.path(), false, true), Ok(true));
    assert!(file_check::check_paths(bytes.as_slice()).is_empty());
    let f = file_check::DataFile::open(bytes.as_slice()).unwrap();
    assert!(f.check_all().is_empty());
    let mut damage = Vec::new();
    let dbs = f.databases(&mut damage);
    let mut n = 0;
    f.records("id2entry", &dbs["id2entry"], &mut damage, &mut |_, _| {
        n += 1
    });
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(n, 22 + 3 * 60 - 2 * 20);
    // Reopened for writing, the store is what it was.
    let store = open(dir.path());
    assert_eq!(store.read().unwrap().view().entry_count().unwrap(), n);
}

/// Tiny deterministic generator for the damage below.
struct Xorshift(u64);
impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn damaged_files_are_reported_never_crash() {
    let dir = tempfile::tempdir().unwrap();
    let older = busy_store(&dir.path().join("a"), 2);
    let newer = {
        // The same store, more written: sector mixes of the two are what a
        // torn write-back leaves.
        let d = dir.path().join("b");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(dir.path().join("a").join(DATA_FILE), d.join(DATA_FILE)).unwrap();
        let store = open(&d);
        let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
        for i in 0..80 {
            add_under(
                &store,
                people,
                &format!("n{i}"),
                person(&format!("n{i}"), "7"),
            );
        }
        store.close();
        std::fs::read(d.join(DATA_FILE)).unwrap()
    };
    let ps = 4096;
    let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
    let (mut refused, mut accepted) = (0, 0);
    for case in 0..160 {
        let mut b = newer.clone();
        let kind = case % 4;
        match kind {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(b.len());
                    b[at] ^= 1 << rng.below(8);
                }
            }
            1 => {
                let page = rng.below(b.len() / ps);
                b[page * ps..(page + 1) * ps].fill(0);
            }
            2 => b.truncate(rng.below(b.len())),
            _ => {
                for (i, sector) in b.chunks_mut(512).enumerate() {
                    let from = &older.get(i * 512..(i * 512 + sector.len()).min(older.len()));
                    if let Some(old) = from {
                        if old.len() == sector.len() && rng.below(2) == 0 {
                            sector.copy_from_slice(old);
                        }
                    }
                }
            }
        }
        let d = dir.path().join(format!("case{case}"));
        match model_check::read_damaged(&d, &b) {
            Ok(_) => accepted += 1,
            Err(e) => {
                refused += 1;
                assert!(
                    matches!(
                        e,
                        StoreError::Damaged(_) | StoreError::Corrupt(_) | StoreError::Format(_)
                    ),
                    "case {case} (kind {kind}): {e}"
                );
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
    eprintln!("damaged files: {refused} refused, {accepted} accepted");
    // Zeroed pages and truncations are refused (most of them); what is
    // accepted was read whole by LMDB without a crash.
    assert!(refused >= 60, "refused {refused}, accepted {accepted}");
}

#[test]
fn an_overflow_run_longer_than_its_value_is_sound() {
    // A large value rewritten smaller in the transaction that wrote it keeps
    // its overflow pages (LMDB does not shrink the run): not damage.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    store
        .write_blocking(|w| -> Result<(), StoreError> {
            w.meta_put("big", &vec![7u8; 20_000])?;
            w.meta_put("big", &vec![8u8; 5_000])
        })
        .unwrap();
    store.close();
    assert_eq!(preflight(dir.path(), false, true), Ok(true));
    let store = open(dir.path());
    let v = store
        .read()
        .unwrap()
        .view()
        .meta_get("big")
        .unwrap()
        .unwrap();
    assert_eq!(v, vec![8u8; 5_000]);
}

/// Time the whole-file check on a real store: `PANDO_CHECK_DIR=<store dir>
/// cargo test --release -p pando-store time_whole_check -- --ignored --nocapture`.
#[test]
#[ignore]
fn time_whole_check() {
    let dir = std::env::var("PANDO_CHECK_DIR").expect("PANDO_CHECK_DIR");
    let f = std::fs::File::open(Path::new(&dir).join(DATA_FILE)).unwrap();
    let started = std::time::Instant::now();
    let d = file_check::DataFile::open(&f).unwrap();
    let damage = d.check_all();
    eprintln!(
        "{dir}: {} pages checked in {:.2} s, {} finding(s)",
        d.meta.last_page + 1,
        started.elapsed().as_secs_f64(),
        damage.len()
    );
}

#[test]
fn a_meta_page_in_the_wrong_slot_is_damage() {
    // LMDB's readers take a snapshot's trees from meta page txnid % 2: a
    // newest txnid in the other slot would have them read another
    // snapshot's trees (the store_file fuzz target found LMDB crashing so).
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = busy_store(dir.path(), 1);
    let f = file_check::DataFile::open(bytes.as_slice()).unwrap();
    let (slot, txnid) = (f.meta.slot, f.meta.txnid);
    assert_eq!(txnid % 2, slot as u64);
    let other = 1 - slot;
    let at = other * 4096 + 16 + 128;
    bytes[at..at + 8].copy_from_slice(&(txnid + 2).to_le_bytes());
    let damage = file_check::check_paths(bytes.as_slice());
    assert!(
        damage.iter().any(|d| d.contains("belongs in meta page")),
        "{damage:?}"
    );
}

/// A snapshot's content generation stays while nothing commits and moves
/// with every commit, whatever it changed (results computed from one
/// snapshot may be reused for another of the same generation).
#[test]
fn content_generation_moves_with_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let g = |s: &Store| {
        s.read()
            .unwrap()
            .generation()
            .expect("known while no commit runs")
    };
    let first = g(&store);
    assert_eq!(g(&store), first);
    store.write_blocking(|w| w.meta_put("test", b"x")).unwrap();
    let second = g(&store);
    assert_ne!(second, first);
    // A batch whose only job failed commits nothing, yet counts: safe.
    let failed: Result<(), StoreError> = store.write_blocking(|_| Err(StoreError::Closed));
    assert!(failed.is_err());
    assert!(g(&store) >= second);
    assert_eq!(g(&store) % 2, 0);
}

/// A reader's transaction serves the next reader while nothing is
/// committed (`txn_pool`); a commit ends every idle one, one held across a
/// commit is not kept, and a reader after a write always sees it.
#[test]
fn idle_read_transactions_serve_the_next_reader_until_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let idle = |s: &Store| s.inner.txns.len();
    drop(store.read().unwrap());
    assert_eq!(idle(&store), 1);
    drop(store.read().unwrap());
    assert_eq!(idle(&store), 1, "the idle one was taken and given back");
    let (a, b) = (store.read().unwrap(), store.read().unwrap());
    assert_eq!(idle(&store), 0);
    drop((a, b));
    assert_eq!(idle(&store), 2);
    store.write_blocking(|w| w.meta_put("test", b"1")).unwrap();
    assert_eq!(idle(&store), 0, "a commit ends the idle transactions");
    let held = store.read().unwrap();
    for i in 2..40u32 {
        let v = i.to_string();
        let w = v.clone();
        store
            .write_blocking(move |t| t.meta_put("test", w.as_bytes()))
            .unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.view().meta_get("test").unwrap().as_deref(),
            Some(v.as_bytes())
        );
    }
    assert_eq!(
        held.view().meta_get("test").unwrap().as_deref(),
        Some(&b"1"[..])
    );
    drop(held);
    assert_eq!(idle(&store), 1, "the one held across commits was not kept");
    store.close();
}

fn logged(csn: &str, seq: u32, kind: LoggedKind, dn: &str) -> LoggedChange {
    LoggedChange {
        csn: csn.into(),
        seq,
        kind,
        uuid: format!("uuid-{dn}"),
        dn: dn.into(),
        old_dn: (kind == LoggedKind::ModDn).then(|| format!("old-{dn}")),
        mods: match kind {
            LoggedKind::Delete => Vec::new(),
            _ => vec![
                LoggedMod {
                    op: ModOp::Add,
                    desc: "cn;lang-en".into(),
                    values: vec![b"x".to_vec(), vec![0, 255]],
                },
                LoggedMod {
                    op: ModOp::Delete,
                    desc: "sn".into(),
                    values: Vec::new(),
                },
            ],
        },
        by: format!("cn=writer of {dn}"),
    }
}

#[test]
fn the_change_log_is_in_csn_order_and_purged_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a, b, c) = (
        "20261125010203.000001Z#000000#000#000000",
        "20261125010203.000002Z#000000#000#000000",
        "20261126000000.000000Z#000000#000#000000",
    );
    let written = vec![
        logged(b, 0, LoggedKind::Modify, "cn=b"),
        logged(a, 0, LoggedKind::Add, "cn=a"),
        logged(c, 0, LoggedKind::ModDn, "cn=c"),
    ];
    // One operation's records share a CSN and keep their order.
    let tree: Vec<LoggedChange> = (0..4)
        .map(|seq| logged(c, seq + 1, LoggedKind::Delete, &format!("cn={seq}")))
        .collect();
    let (w2, t2) = (written.clone(), tree.clone());
    store
        .write_blocking(move |w| -> Result<(), StoreError> {
            for c in w2.iter().chain(t2.iter().rev()) {
                w.log_change(c)?;
            }
            Ok(())
        })
        .unwrap();
    // A rolled-back job logs nothing.
    let res: Result<(), StoreError> = store.write_blocking(|w| {
        w.log_change(&logged(
            "20261125000000.000000Z#000000#000#000000",
            0,
            LoggedKind::Delete,
            "cn=gone",
        ))?;
        Err(StoreError::Closed)
    });
    assert!(res.is_err());
    let all = |store: &Store, after: &str| -> Vec<LoggedChange> {
        let r = store.read().unwrap();
        let v = r.view();
        let out = v
            .changes_after(after)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        out
    };
    let got = all(&store, "");
    assert_eq!(
        got[..3],
        [written[1].clone(), written[0].clone(), written[2].clone()]
    );
    assert_eq!(got[3..], tree[..]);
    // After a CSN: none of that CSN's records.
    assert_eq!(all(&store, a)[0], written[0]);
    assert!(all(&store, c).is_empty());
    // At a CSN: that operation's records only, in order.
    let at = |csn: &str| store.read().unwrap().view().changes_at(csn).unwrap();
    assert_eq!(at(c)[..], [&written[2..], &tree[..]].concat()[..]);
    assert_eq!(at(a), [written[1].clone()]);
    assert!(at("20261125010203.000001Z").is_empty());
    let summary = store.read().unwrap().view().changelog_summary().unwrap();
    assert_eq!(summary.count, 7);
    assert_eq!(summary.oldest_csn.as_deref(), Some(a));
    assert_eq!(summary.floor, "", "a new store's log covers everything");
    // By age: what is older than the cutoff, at most `max` at a time.
    let n = store
        .write_blocking(|w| w.purge_changes("20261125020000", u64::MAX, 1))
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(store.read().unwrap().view().changelog_floor().unwrap(), a);
    let n = store
        .write_blocking(|w| w.purge_changes("20261125020000", u64::MAX, 10))
        .unwrap();
    assert_eq!(n, 1);
    // By count: the oldest go until `keep` remain.
    let n = store
        .write_blocking(|w| w.purge_changes("", 3, 10))
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(all(&store, "")[..], tree[1..]);
    assert_eq!(store.read().unwrap().view().changelog_floor().unwrap(), c);
    // The floor never goes down.
    store
        .write_blocking(|w| w.raise_changelog_floor(a))
        .unwrap();
    assert_eq!(store.read().unwrap().view().changelog_floor().unwrap(), c);
    assert_consistent(&store);
    // It survives a restart.
    store.close();
    let store = open(dir.path());
    assert_eq!(all(&store, "")[..], tree[1..]);
}

#[test]
fn context_csns_are_kept_per_server_and_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a1, a2, b1) = (
        "20261125010203.000001Z#000000#001#000000",
        "20261125010203.000002Z#000000#001#000000",
        "20261120000000.000000Z#000000#00c#000000",
    );
    store
        .write_blocking(move |w| -> Result<(), StoreError> {
            for csn in [a2, a1, b1] {
                assert!(w.advance_context_csn(csn)?);
            }
            assert!(!w.advance_context_csn("not a csn")?);
            Ok(())
        })
        .unwrap();
    let r = store.read().unwrap();
    assert_eq!(r.view().context_csns().unwrap(), [a2, b1]);
    assert_eq!(r.view().newest_csn().unwrap().as_deref(), Some(a2));
    drop(r);
    assert_eq!(csn_sid(b1), Some(12));
    // A store with the single value of earlier versions: it becomes its
    // server's value, and the log covers only what comes after it.
    let old = "20261111000000.000000Z#000000#000#000000";
    store
        .write_blocking(|w| w.meta_put("context_csn", old.as_bytes()))
        .unwrap();
    store.close();
    let store = open(dir.path());
    let r = store.read().unwrap();
    assert_eq!(r.view().context_csns().unwrap(), [old, a2, b1]);
    assert!(r.view().meta_get("context_csn").unwrap().is_none());
}

#[test]
fn after_commit_steps_run_in_commit_order_and_only_for_kept_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut pending = Vec::new();
        for i in 0..40u32 {
            let seen = seen.clone();
            // Every third job fails: its step must not run.
            pending.push(store.write(move |w| -> Result<(), StoreError> {
                let s = seen.clone();
                w.after_commit(move || s.lock().unwrap().push(i));
                if i % 3 == 0 {
                    return Err(StoreError::Closed);
                }
                Ok(())
            }));
        }
        for p in pending {
            let _ = p.await;
        }
    });
    let got = seen.lock().unwrap().clone();
    let want: Vec<u32> = (0..40).filter(|i| i % 3 != 0).collect();
    assert_eq!(got, want);
}

/// A store filled entry by entry (not by import) gets a dictionary once it
/// holds enough entries; entries written after use it, those before still
/// read, and it survives a reopen.
#[test]
fn a_store_filled_without_a_dictionary_gets_one_trained_on_its_entries() {
    let dir = tempfile::tempdir().unwrap();
    let open = |dir: &Path| {
        let opts = StoreOptions {
            durability: Durability::None,
            indexes: Vec::new(),
            ..crate::model_check::options()
        };
        Store::open(dir, Arc::new(Schema::standard()), &opts).unwrap()
    };
    let store = open(dir.path());
    assert!(
        store.codec().level().is_some(),
        "the test needs compression"
    );
    tree(&store);
    assert_eq!(
        store.train_dictionary_if_missing().unwrap(),
        None,
        "too few entries"
    );
    let people = find(&store, "ou=People,dc=example,dc=com").unwrap();
    let n = crate::dictionary::SAMPLES;
    for chunk in (0..n).collect::<Vec<_>>().chunks(2500) {
        let chunk = chunk.to_vec();
        store
            .write_blocking(move |w| -> Result<(), StoreError> {
                for i in chunk {
                    let p = Placement {
                        parent: people,
                        rdn: format!("cn=p{i}"),
                        norm_rdn: format!("cn=p{i}"),
                    };
                    w.add(
                        &p,
                        &person(&format!("p{i} with some shared text"), &i.to_string()),
                    )?;
                }
                Ok(())
            })
            .unwrap();
    }
    let id = store
        .train_dictionary_if_missing()
        .unwrap()
        .expect("trained");
    assert_eq!(store.codec().current_dict().map(|d| d.id), Some(id));
    assert_eq!(
        store.train_dictionary_if_missing().unwrap(),
        None,
        "only once"
    );
    add_under(&store, people, "after", person("after", "1"));
    let after = find(&store, "cn=after,ou=People,dc=example,dc=com").unwrap();
    let raw = |store: &Store, id: EntryId| {
        let r = store.read().unwrap();
        let v = r.view().entry_bytes(id).unwrap().unwrap().to_vec();
        v
    };
    // Format 4 (split: the dictionary was trained on split bodies),
    // placed, dictionary ID right after the CRC and placement.
    let format_and_dict = |rec: Vec<u8>| {
        let at = 5 + 1 + rec[5] as usize;
        (rec[0], rec[at] as u32)
    };
    let written = (
        entry_codec::ENTRY_FORMAT_ZSTD_SPLIT | entry_codec::PLACED,
        id,
    );
    assert_eq!(format_and_dict(raw(&store, after)), written);
    store.close();
    let store = open(dir.path());
    assert_eq!(store.codec().current_dict().map(|d| d.id), Some(id));
    // Reopened, the dictionary is still known to be for split bodies.
    add_under(&store, people, "reopened", person("reopened", "1"));
    let reopened = find(&store, "cn=reopened,ou=People,dc=example,dc=com").unwrap();
    assert_eq!(format_and_dict(raw(&store, reopened)), written);
    let r = store.read().unwrap();
    assert_eq!(r.view().entry_count().unwrap(), 22 + n as u64 + 2);
    drop(r);
    assert_consistent(&store);
}

/// `n` people below `parent` in one write, `sn` one of seven values.
fn people(store: &Store, parent: EntryId, from: usize, n: usize) {
    store
        .write_blocking(move |w| -> Result<(), StoreError> {
            for i in from..from + n {
                let p = Placement {
                    parent,
                    rdn: format!("cn=p{i}"),
                    norm_rdn: format!("cn=p{i}"),
                };
                let mut a = person(&format!("p{i}"), &i.to_string());
                a.retain(|a| a.desc != "sn");
                a.push(Attribute {
                    desc: "sn".into(),
                    values: vec![format!("s{}", i % 7).into_bytes()],
                });
                w.add(&p, &a)?;
            }
            Ok(())
        })
        .unwrap();
}

fn sn_change(add: bool) -> CatalogChange {
    let list = vec![
        ("sn".to_string(), IndexKind::Eq),
        ("SN".to_string(), IndexKind::Sub),
    ];
    if add {
        CatalogChange {
            add: list,
            ..CatalogChange::default()
        }
    } else {
        CatalogChange {
            drop: list,
            ..CatalogChange::default()
        }
    }
}

fn sn_is_used(store: &Store) -> bool {
    let r = store.read().unwrap();
    let c = r
        .view()
        .candidates(&Filter::parse("(sn=s3)").unwrap())
        .unwrap();
    matches!(c, Candidates::Ids(_))
}

/// The store in `dir` opened with `sn` eq and sub configured.
fn open_with_sn_indexed(dir: &Path) -> Store {
    let opts = StoreOptions {
        indexes: vec![IndexSpec {
            attr: "sn".into(),
            kinds: vec![IndexKind::Eq, IndexKind::Sub],
        }],
        ..crate::model_check::options()
    };
    Store::open(dir, Arc::new(Schema::standard()), &opts).unwrap()
}

/// Wait (at most 60 s) until no index is being built.
fn wait_built(store: &Store) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while store.indexes().iter().any(|i| i.building.is_some()) {
        assert!(std::time::Instant::now() < until, "the build did not end");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn an_index_added_while_serving_is_built_under_writes_and_then_used() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let ou = find(&store, "ou=People,dc=example,dc=com").unwrap();
    people(&store, ou, 0, 9000);
    assert!(!sn_is_used(&store), "sn is not indexed");
    store
        .write_blocking(|w| w.change_catalog(sn_change(true)))
        .unwrap();
    // Hold the writer: the builder gets at most one chunk in first.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let blocker = {
        let store = store.clone();
        std::thread::spawn(move || {
            store
                .write_blocking(move |_w| -> Result<(), StoreError> {
                    let _ = held.recv();
                    Ok(())
                })
                .unwrap()
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    let states = store.indexes();
    let sn: Vec<&IndexState> = states.iter().filter(|i| i.attr == "sn").collect();
    assert_eq!(sn.len(), 2);
    let progress = sn[0].building.clone().expect("building");
    assert_eq!(progress.entries_total, 9022);
    assert!(progress.entries_done < 9022);
    assert!(!sn_is_used(&store), "the planner ignores a building index");
    release.send(()).unwrap();
    blocker.join().unwrap();
    // Writes while it builds: renames of values, deletes, adds.
    for round in 0..20usize {
        let id = find(
            &store,
            &format!("cn=p{},ou=People,dc=example,dc=com", round * 400),
        )
        .unwrap();
        let old = store.read().unwrap().view().attrs(id).unwrap().unwrap();
        let mut new = old.clone();
        for a in new.iter_mut().filter(|a| a.desc == "sn") {
            a.values = vec![format!("changed{round}").into_bytes()];
        }
        store
            .write_blocking(move |w| w.replace(id, &old, &new))
            .unwrap();
        let gone = find(
            &store,
            &format!("cn=p{},ou=People,dc=example,dc=com", round * 400 + 1),
        )
        .unwrap();
        delete(&store, gone).unwrap();
        people(&store, ou, 10_000 + round * 10, 10);
    }
    wait_built(&store);
    assert!(sn_is_used(&store));
    assert_consistent(&store);
    let r = store.read().unwrap();
    let changed = ids(r
        .view()
        .candidates(&Filter::parse("(sn=changed7)").unwrap())
        .unwrap());
    assert_eq!(changed.len(), 1);
    let grams = ids(r
        .view()
        .candidates(&Filter::parse("(sn=*hanged1*)").unwrap())
        .unwrap());
    assert!(grams.len() >= 11, "changed1 and changed1x: {}", grams.len());
    drop(r);
    // A restart keeps it (listed complete), with no rebuild.
    store.close();
    let store = open_with_sn_indexed(dir.path());
    assert!(sn_is_used(&store));
    assert_consistent(&store);
}

#[test]
fn a_dropped_index_is_emptied_and_an_interrupted_build_is_redone_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    tree(&store);
    let ou = find(&store, "ou=People,dc=example,dc=com").unwrap();
    people(&store, ou, 0, 5000);
    store
        .write_blocking(|w| w.change_catalog(sn_change(true)))
        .unwrap();
    wait_built(&store);
    assert!(sn_is_used(&store));
    store
        .write_blocking(|w| w.change_catalog(sn_change(false)))
        .unwrap();
    assert!(!sn_is_used(&store));
    assert!(store.indexes().iter().all(|i| i.attr != "sn"));
    // The emptying job runs after the change; a write after it sees it done.
    store.write_blocking(|_| Ok::<(), StoreError>(())).unwrap();
    let stats = store.stats().unwrap();
    assert!(stats.databases.iter().all(|d| !d.name.starts_with("ix:sn")));
    let emptied = store
        .write_blocking(|w| -> Result<u64, StoreError> {
            let db = w
                .inner
                .env
                .open_database::<heed::types::Bytes, heed::types::Bytes>(&w.txn, Some("ix:sn:eq"))?
                .unwrap();
            Ok(db.len(&w.txn)?)
        })
        .unwrap();
    assert_eq!(emptied, 0);
    assert_consistent(&store);
    // Added again and closed at once, most likely mid-build (listed or
    // not, the next open with the index configured has it whole).
    store
        .write_blocking(|w| w.change_catalog(sn_change(true)))
        .unwrap();
    store.close();
    let store = open_with_sn_indexed(dir.path());
    assert!(sn_is_used(&store));
    assert!(store.indexes().iter().all(|i| i.building.is_none()));
    assert_consistent(&store);
    let r = store.read().unwrap();
    assert_eq!(
        ids(r
            .view()
            .candidates(&Filter::parse("(sn=s3)").unwrap())
            .unwrap())
        .len(),
        (0..5000).filter(|i| i % 7 == 3).count()
    );
}

#[test]
fn a_snapshot_uses_an_index_only_if_ready_on_both_sides_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let before = store.inner.catalog.load_full();
    // Unchanged: the same catalog.
    let same = catalog::for_snapshot(before.clone(), &before);
    assert!(Arc::ptr_eq(&same, &before));
    // cn eq marked not ready in the newer one: not ready in the result.
    let mut indexes = before.indexes.clone();
    for d in indexes.get_mut("cn").unwrap() {
        d.ready = false;
    }
    let after = Arc::new(before.with_indexes(indexes));
    let mixed = catalog::for_snapshot(before.clone(), &after);
    assert!(mixed.ready_db("cn", IndexKind::Eq).is_none());
    let mixed = catalog::for_snapshot(after, &before);
    assert!(mixed.ready_db("cn", IndexKind::Eq).is_none());
    assert!(mixed.ready_db("uidnumber", IndexKind::Eq).is_some());
}

#[test]
fn access_log_trim_keeps_the_newest_within_both_caps() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let value = vec![b'x'; 3000];
    store
        .write_blocking(move |w| {
            for i in 0..500 {
                w.put_access_record(&format!("k{i:05}"), &value)?;
            }
            Ok::<_, StoreError>(())
        })
        .unwrap();
    let size = |s: &Store| s.read().unwrap().view().access_log_size().unwrap();
    assert_eq!(size(&store).records, 500);
    // The record cap: the oldest go.
    let gone = store
        .write_blocking(|w| w.trim_access_records(300, u64::MAX))
        .unwrap();
    assert_eq!(gone, 200);
    let first = store
        .read()
        .unwrap()
        .view()
        .access_records_from("")
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .0;
    assert_eq!(first, "k00200");
    // The byte cap: pages counted, so 3000-byte values take a page each.
    let gone = store
        .write_blocking(|w| w.trim_access_records(u64::MAX, 256 * 1024))
        .unwrap();
    let now = size(&store);
    assert!(now.bytes <= 256 * 1024, "{now:?}");
    assert_eq!(gone + now.records, 300);
    assert!(now.records > 20, "{now:?}");
    // Under both caps: nothing goes.
    assert_eq!(
        store
            .write_blocking(|w| w.trim_access_records(1000, u64::MAX))
            .unwrap(),
        0
    );
    assert!(store.read().unwrap().view().verify().unwrap().is_empty());
}

#[test]
fn change_numbers_follow_commit_order_and_survive_purges() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a, b, c) = (
        "20261125010203.000001Z#000000#000#000000",
        "20261125010203.000002Z#000000#000#000000",
        "20261126000000.000000Z#000000#000#000000",
    );
    // b then c committed, then a received (older CSN, committed last),
    // then c written again (received twice: keeps its number).
    let written = [
        logged(b, 0, LoggedKind::Modify, "cn=b"),
        logged(c, 0, LoggedKind::Add, "cn=c"),
        logged(a, 0, LoggedKind::Delete, "cn=a"),
        logged(c, 0, LoggedKind::Add, "cn=c"),
    ];
    for w0 in written {
        store.write_blocking(move |w| w.log_change(&w0)).unwrap();
    }
    let numbered = |store: &Store, from: u64| -> Vec<(u64, String)> {
        let r = store.read().unwrap();
        let v = r.view();
        let out = v
            .changes_from_number(from)
            .unwrap()
            .map(|c| c.map(|(n, c)| (n, c.dn)).unwrap())
            .collect();
        out
    };
    let range = |store: &Store| store.read().unwrap().view().change_number_range().unwrap();
    assert_eq!(
        numbered(&store, 0),
        [(1, "cn=b".into()), (2, "cn=c".into()), (3, "cn=a".into())]
    );
    assert_eq!(numbered(&store, 3), [(3, "cn=a".to_string())]);
    assert_eq!(range(&store), Some((1, 3)));
    // A reader at 2 loses nothing it has not passed when the oldest CSN
    // (a, numbered 3) goes: 3 is skipped as purged, not renumbered.
    store
        .write_blocking(|w| w.purge_changes("20261125010203.000002Z", u64::MAX, 10))
        .unwrap();
    assert_eq!(numbered(&store, 2), [(2, "cn=c".to_string())]);
    assert_eq!(range(&store), Some((1, 2)));
    // b goes: the front moves to 2.
    store
        .write_blocking(|w| w.purge_changes("20261125020000", u64::MAX, 10))
        .unwrap();
    assert_eq!(range(&store), Some((2, 2)));
    // Everything goes: the next change is still 4, also after a restart.
    store
        .write_blocking(|w| w.purge_changes("", 0, 10))
        .unwrap();
    assert_eq!(range(&store), None);
    store.close();
    let store = open(dir.path());
    store
        .write_blocking(|w| w.log_change(&logged(c, 1, LoggedKind::Modify, "cn=d")))
        .unwrap();
    assert_eq!(numbered(&store, 0), [(4, "cn=d".to_string())]);
    assert_consistent(&store);
}

#[test]
fn change_numbers_turned_off_and_on_again_renumber_the_log_after_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let csn = |n: u32| format!("20261125010203.{n:06}Z#000000#000#000000");
    let log = |store: &Store, n: u32| {
        let c = logged(&csn(n), 0, LoggedKind::Modify, &format!("cn={n}"));
        store.write_blocking(move |w| w.log_change(&c)).unwrap();
    };
    let turn = |store: &Store, on: bool| {
        store.write_blocking(move |w| w.number_changes(on)).unwrap();
    };
    let numbered = |store: &Store| -> Vec<(u64, String)> {
        let r = store.read().unwrap();
        let v = r.view();
        let out = v
            .changes_from_number(0)
            .unwrap()
            .map(|c| c.map(|(n, c)| (n, c.dn)).unwrap())
            .collect();
        out
    };
    log(&store, 1);
    turn(&store, false);
    log(&store, 2);
    log(&store, 3);
    // Logged all the same, numbered none; off is kept across a restart.
    assert_eq!(numbered(&store), []);
    store.close();
    let store = open(dir.path());
    log(&store, 4);
    assert_eq!(numbered(&store), []);
    let r = store.read().unwrap();
    assert_eq!(r.view().changes_after("").unwrap().count(), 4);
    drop(r);
    // On again: the whole log, in CSN order, after the last number given.
    turn(&store, true);
    turn(&store, true);
    log(&store, 5);
    let want: Vec<(u64, String)> = (1..=5).map(|n| (n as u64 + 1, format!("cn={n}"))).collect();
    assert_eq!(numbered(&store), want);
    // Off, purged, on: still no number given twice.
    turn(&store, false);
    store
        .write_blocking(|w| w.purge_changes("20261125010203.000002Z", u64::MAX, 10))
        .unwrap();
    turn(&store, true);
    let want: Vec<(u64, String)> = (2..=5).map(|n| (n as u64 + 5, format!("cn={n}"))).collect();
    assert_eq!(numbered(&store), want);
    assert_consistent(&store);
}
