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
    crate::bootstrap::ensure_suffixes(
        &server.rt.store,
        &server.cfg.suffixes,
        "cn=admin",
        &server.rt.csn,
    )
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

/// Add an entry (schema-checked and stamped) whose parent exists.
pub fn add(server: &Server, dn: &str, attrs: &[(&str, &str)]) {
    let mut e = Entry::new(Dn::parse(dn).unwrap());
    for (a, v) in attrs {
        e.add_values(a, vec![v.as_bytes().to_vec()]);
    }
    let added =
        crate::bootstrap::add_if_missing(&server.rt.store, e, "cn=admin", &server.rt.csn, false)
            .unwrap();
    assert!(added, "{dn} exists");
}

/// An authenticated requester (`admin`: with the administrator role).
pub fn user(server: &Server, dn: &str, admin: bool) -> Identity {
    let norm = server.schema.normalize_dn(&Dn::parse(dn).unwrap()).unwrap();
    Identity::authenticated(dn.into(), norm, Arc::default()).with_roles(admin, false)
}
