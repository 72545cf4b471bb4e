//! A server over a fresh store for unit tests (the operations', the
//! overlays', the connection's).

use std::path::Path;
use std::sync::Arc;

use pando_model::{Dn, Entry, Schema};

use crate::settings::Validate;
use crate::state::Server;
use pando_access::Identity;

/// The server for `dir` with the configuration `extra` (TOML after
/// `data_dir`), its suffix dc=example,dc=com created. Not from inside
/// an async runtime (the suffix is written with a blocking call): use
/// [`bare`] there.
pub fn server(dir: &Path, extra: &str) -> Arc<Server> {
    let server = bare(dir, extra);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(crate::bootstrap::ensure_suffixes(
        &server,
        &server.cfg.suffixes,
    ))
    .unwrap();
    server
}

/// The server for `dir` over an empty store.
pub fn bare(dir: &Path, extra: &str) -> Arc<Server> {
    bare_live(dir, extra).server()
}

/// [`bare`], as the handle configuration changes go through.
pub fn bare_live(dir: &Path, extra: &str) -> Arc<crate::live::Live> {
    let schema = Arc::new(Schema::standard());
    let toml = format!("data_dir = {:?}\n{extra}", dir.display().to_string());
    let cfg = pando_config::Config::from_toml(&toml, Path::new("t.toml"))
        .unwrap()
        .validate(&schema)
        .unwrap();
    let store = pando_store::Store::open(
        &crate::store_dir(dir),
        schema.clone(),
        &crate::store_options(&cfg),
    )
    .unwrap();
    let csn = pando_store::clock::clock_for_store(&store, 0);
    crate::build_server(cfg, schema, store, csn, None, None).unwrap()
}

/// Add an entry whose parent exists, through the write pipeline as the
/// server's own writer. Not from inside an async runtime.
pub fn add(server: &Arc<Server>, dn: &str, attrs: &[(&str, &str)]) {
    let mut e = Entry::new(Dn::parse(dn).unwrap());
    for (a, v) in attrs {
        e.add_values(a, vec![v.as_bytes().to_vec()]);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let added = rt.block_on(crate::bootstrap::add_own(server, e)).unwrap();
    assert!(added, "{dn} exists");
}

/// An authenticated requester (`admin`: with the administrator role).
pub fn user(server: &Server, dn: &str, admin: bool) -> Identity {
    let norm = server.schema.normalize_dn(&Dn::parse(dn).unwrap()).unwrap();
    Identity::authenticated(dn, norm, Arc::default()).with_roles(admin, false)
}

/// Add an entry whose parent exists straight into the store, around the
/// write pipeline (as `pando import` writes): stamped and schema-checked,
/// but no overlay's upkeep and no change log record.
pub fn add_around_the_pipeline(server: &Server, dn: &str, attrs: &[(&str, &str)]) {
    let mut entry = Entry::new(Dn::parse(dn).unwrap());
    for (a, v) in attrs {
        entry.add_values(a, vec![v.as_bytes().to_vec()]);
    }
    let structural = server.schema.check_entry(&mut entry).unwrap();
    entry.remove("structuralObjectClass");
    entry.add_values("structuralObjectClass", vec![structural.into_bytes()]);
    let csn = server.rt.csn.next();
    let now = pando_store::clock::generalized_time(pando_store::clock::now_micros());
    let stamps = crate::ops::write::Stamps {
        who: "cn=admin",
        csn: &csn,
        now: &now,
    };
    stamps.put(&mut entry, true, |_, _| false);
    server
        .rt
        .store
        .write_blocking(move |w| -> Result<(), pando_store::StoreError> {
            let view = w.view();
            let rdns = view.normalize_rdns(&entry.dn).unwrap();
            let pando_store::Lookup::Found(parent) = view.lookup_norm(&rdns[1..])? else {
                panic!("the parent of {} is missing", entry.dn);
            };
            let place = pando_store::Placement {
                parent,
                rdn: entry.dn.rdn().unwrap().to_string(),
                norm_rdn: rdns[0].clone(),
            };
            w.add(&place, &entry.attrs)?;
            w.advance_context_csn(&csn).map(|_| ())
        })
        .unwrap();
}
