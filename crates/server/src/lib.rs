//! Pando's server: configuration, the LDAP operations, and the network
//! frontend. `run` starts everything and returns after a clean shutdown.

pub mod bootstrap;
pub mod bulk;
pub mod cn_config;
pub mod live;
pub mod net;
pub mod observe;
pub mod privileges;
pub mod repl;
pub mod settings;

/// The operations and their state (`pando-ops`).
pub use pando_ops as ops;
pub use pando_ops::{capacity, error, hashing, state, throttle};
/// The overlays (`pando-overlays`).
pub use pando_overlays as overlays;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pando_model::{Dn, Schema};
use pando_proto::DecodeLimits;
use pando_store::{Store, StoreOptions};
use tokio::sync::watch;

use crate::bootstrap::RootPassword;
use crate::net::frontend::Serving;
use crate::state::Server;
use pando_config::{Listener, Resolved};
use pando_store::clock::CsnClock;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Re-reads the configuration file (plus command-line overrides) on SIGHUP.
pub type Reloader = Arc<dyn Fn() -> Result<pando_config::Config, String> + Send + Sync>;

#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Load the demo tree (ou=People, ou=Groups) into the first suffix.
    pub demo: bool,
    pub reload: Option<Reloader>,
    /// The configuration file as read (with command-line options): kept
    /// in the store beside the configuration run with, so the next start
    /// and SIGHUP see which keys the operator edited.
    pub file: Option<pando_config::Config>,
}

/// Why `serve` will not start on the store, and what the operator can do.
/// Nothing was written: a store that is not recognised is never
/// initialised over.
fn refused_store(data_dir: &std::path::Path, e: &pando_store::StoreError) -> String {
    let dir = store_dir(data_dir);
    let d = data_dir.display();
    let advice = match e {
        pando_store::StoreError::Format(_) => format!(
            "Run a Pando that reads this format, or restore a backup (`pando restore --data-dir {d} BACKUP`)."
        ),
        pando_store::StoreError::Lmdb(_) | pando_store::StoreError::DiskFull => {
            "Nothing was changed. Check that the user running pando can read and write it, and the disk.".to_string()
        }
        _ => format!(
            "Nothing was changed. Check it with `pando verify --data-dir {d}`; restore a backup \
             (`pando restore --data-dir {d} BACKUP`), or write what can still be read to LDIF \
             with `pando salvage --data-dir {d} -o saved.ldif`."
        ),
    };
    format!("cannot serve the store in {}: {e}. {advice}", dir.display())
}

pub use pando_store::datadir::store_dir;
pub use pando_store::{backup, datadir};

pub fn store_options(cfg: &Resolved) -> StoreOptions {
    let st = &cfg.config.store;
    StoreOptions {
        map_size: if st.map_size_mb == 0 {
            pando_store::DEFAULT_MAP_SIZE
        } else {
            (st.map_size_mb as usize) << 20
        },
        indexes: cfg.indexes.clone(),
        max_batch: st.max_write_batch,
        // Validated with the rest of the configuration.
        durability: st.durability().unwrap_or(pando_store::Durability::Durable),
        compression: st
            .compression()
            .unwrap_or(Some(pando_store::DEFAULT_COMPRESSION_LEVEL)),
        check_all_pages: st.check_all_pages,
    }
}

/// The sockets served: bound from `listen` (in its order), or passed by systemd.
enum Bound {
    Configured(Vec<net::listener::Bound>),
    Systemd(Vec<net::listener::Bound>),
}

/// Open the store, bootstrap it, listen, and serve until SIGINT/SIGTERM.
pub async fn run(cfg: Resolved, schema: Arc<Schema>, opts: ServeOptions) -> Result<(), BoxError> {
    // Signal handlers before anything else: once a port is bound a client
    // (or a supervisor) may act, and SIGTERM/SIGHUP must never kill the
    // process with the default action.
    let signals = Signals::install()?;
    raise_fd_limit();
    let bound = bind_then_drop_privileges(&cfg)?;
    let data_dir = cfg.config.data_dir.clone();
    let _lock = datadir::lock(&data_dir)?;
    // The generated certificate (`--tls-self-signed`) is made on the first
    // start and reused after; configured files are only read.
    let tls_generated = match &cfg.tls {
        Some(t) if t.self_signed => net::tls::ensure_self_signed(&t.cert_file, &t.key_file)?,
        _ => false,
    };
    let tls = match &cfg.tls {
        Some(t) => Some(Arc::new(net::tls::TlsContext::load(t.clone())?)),
        None => None,
    };
    let store = open_store(&cfg, &schema, &data_dir).await?;
    bulk::check_complete(&store)?;
    if cfg.config.store.warm_start {
        datadir::warm_in_background(store_dir(&data_dir).join("data.mdb"));
    }
    // One clock for the whole run, bootstrap included, resumed after the
    // newest CSN the store records so CSNs never go back across restarts.
    let csn = pando_store::clock::clock_for_store(&store, cfg.config.replication.server_id);
    let root_pw = first_start(&cfg, &store).await?;
    // The configuration run with, and the file it came from, are stored
    // (see cn_config::stored): changes over LDAP build on them.
    // Storing it also turns change numbers on or off; without it that is
    // a write of its own.
    let mut saved = false;
    if let Some(file) = &opts.file {
        let stamps = cn_config::stored::start_stamps(&store, &cfg.config, &csn.next());
        match cn_config::stored::save(&store, &cfg.config, Some(file), Default::default(), stamps)
            .await
        {
            Ok(()) => saved = true,
            Err(e) => tracing::error!("{e}; changes under cn=config will not persist"),
        }
    }
    let numbers = numbers_changes(&cfg.config);
    if !saved {
        if let Err(e) = store.write(move |w| w.number_changes(numbers)).await {
            return Err(format!("cannot record whether changes are numbered: {e}").into());
        }
    }
    let durability = store_options(&cfg).durability;
    if tls.is_none()
        && matches!(&bound, Bound::Systemd(b) if b.iter().any(|b| matches!(b, net::listener::Bound::Ldaps(_))))
    {
        return Err("an LDAPS socket was passed by systemd but [tls] has no certificate".into());
    }
    let live = build_server(
        cfg,
        schema,
        store.clone(),
        csn,
        root_pw.as_ref().map(|p| p.hash().to_string()),
        tls,
    )?;
    let server = live.server();
    let (created, demo_added) = first_entries(&server, opts.demo).await?;
    // First-start work is done and durable: the configured mode from now on.
    store.set_durability(durability);
    after_start(&server, &store).await;

    let (stop_tx, stop_rx) = watch::channel(false);
    start_listeners(&live, &server, bound, stop_rx)?;
    // "Serving" once every listener accepts (and the password file, if
    // one was made, exists: first-start work is done above).
    print_banner(&server, &root_pw, &created, demo_added, tls_generated);
    // Kept to the end: the connection places and the change feed. The
    // rest of the first configuration is let go, so a changed one can close.
    let feed = server.rt.feed.clone();
    drop(server);

    signals.wait_for_stop(&live, opts.reload.as_ref()).await;
    shut_down(live, store, feed, stop_tx).await
}

/// Listeners first: binding ports below 1024 may need root, which is
/// given up right after, before any data file is opened or created. The
/// data directory (home of the ldapi socket) is made and handed to the
/// service account first.
fn bind_then_drop_privileges(cfg: &Resolved) -> Result<Bound, BoxError> {
    let target = match &cfg.config.user {
        Some(u) => Some(privileges::resolve(u, cfg.config.group.as_deref())?),
        None => None,
    };
    privileges::prepare_data_dir(&cfg.config.data_dir, target)?;
    let bound = match net::listener::from_systemd()? {
        Some(b) => {
            tracing::info!(
                sockets = b.len(),
                "using the sockets passed by systemd (socket activation); `listen` is not used"
            );
            Bound::Systemd(b)
        }
        None => Bound::Configured(net::listener::bind_all(&cfg.listeners)?),
    };
    match target {
        Some(target) => {
            privileges::drop_to(target)?;
            tracing::info!(uid = target.uid, gid = target.gid, "switched to the configured user and group");
        }
        // SAFETY: geteuid has no preconditions.
        None if unsafe { libc::geteuid() } == 0 => tracing::warn!(
            "running as root: set `user` in the configuration (see docs/operations.md) so the server drops its privileges"
        ),
        None => {}
    }
    Ok(bound)
}

/// The store, opened durable whatever the configured mode: first-start
/// work is written durably, so a cut during it leaves a store that is
/// whole; the configured mode applies after it.
async fn open_store(
    cfg: &Resolved,
    schema: &Arc<Schema>,
    data_dir: &std::path::Path,
) -> Result<Store, BoxError> {
    let data_dir = data_dir.to_path_buf();
    let store = {
        let dir = store_dir(&data_dir);
        let schema = schema.clone();
        // First-start work (store, password, suffixes, demo) is written
        // durably whatever the configured mode, so a cut during it leaves
        // a store that is whole; the configured mode applies after it.
        let so = StoreOptions {
            durability: pando_store::Durability::Durable,
            ..store_options(cfg)
        };
        tokio::task::spawn_blocking(move || Store::open(&dir, schema, &so))
            .await?
            .map_err(|e| refused_store(&data_dir, &e))?
    };
    Ok(store)
}

/// First-start work before the server is built: the root password (None
/// without a root DN).
async fn first_start(cfg: &Resolved, store: &Store) -> Result<Option<RootPassword>, BoxError> {
    if cfg.root_dn.is_none() {
        // No root DN, no root password: administration goes through ldapi
        // (SASL EXTERNAL) or identities given the admin role.
        return Ok(None);
    }
    let store = store.clone();
    let data_dir = cfg.config.data_dir.clone();
    let configured = cfg.config.root_password_hash.clone();
    tokio::task::spawn_blocking(move || -> Result<_, BoxError> {
        // A store that fails while first-start work reads or writes it is
        // named, with what to do, like one that fails to open.
        match bootstrap::root_password(&store, &data_dir, configured.as_deref()) {
            Ok(pw) => Ok(Some(pw)),
            Err(bootstrap::BootstrapError::Store(se)) => Err(refused_store(&data_dir, &se).into()),
            Err(other) => Err(other.into()),
        }
    })
    .await?
}

/// First-start work once the server is built, before it listens, through
/// the write pipeline: the entries of the suffixes this server holds, and
/// the demo tree with `--demo` when this start made the first suffix (so
/// entries an operator deleted do not come back on the next `--demo`
/// start). Returns the suffixes created and the demo entries added (None:
/// the store was not new).
async fn first_entries(
    server: &Arc<Server>,
    demo: bool,
) -> Result<(Vec<String>, Option<usize>), BoxError> {
    // A multi-provider started with --demo makes the suffix and the demo
    // tree the others copy (they start empty; one node seeds them).
    let own = if demo && server.cfg.config.replication.multi_provider {
        server.cfg.suffixes.clone()
    } else {
        own_suffixes(&server.cfg, &server.schema)
    };
    let created = bootstrap::ensure_suffixes(server, &own).await?;
    let first = server.cfg.suffixes.first().map(|s| s.to_string());
    let fresh = created.iter().any(|c| Some(c) == first.as_ref());
    let demo_added = match (demo, fresh) {
        (true, true) => Some(bootstrap::load_demo(server).await?),
        (true, false) => None,
        (false, _) => Some(0),
    };
    Ok((created, demo_added))
}

/// After the first configuration is running: the change log records
/// that expired while down, the replication consumers.
async fn after_start(server: &Arc<Server>, store: &Store) {
    // Change log records that expired while the server was down go now
    // (later ones go with the writes that follow them).
    let retention = server.cfg.config.replication.clone();
    match store
        .write(move |w| ops::write::log::purge_up_to(w, &retention, usize::MAX))
        .await
    {
        Ok(0) => {}
        Ok(n) => tracing::info!("purged {n} expired change log records"),
        Err(e) => tracing::warn!("cannot purge expired change log records: {e}"),
    }
    if server.cfg.config.store.keep_tombstones_days.is_some() {
        tracing::warn!("store.keep_tombstones_days is the earlier name of replication.changelog_days; rename it");
    }
    // Consumers run until the server closes (they follow the feed's
    // closing signal).
    repl::consumer::start_all(server);
}

/// Every listener accepting (sockets bound from `listen` are paired with
/// their listener, so they can be removed later; systemd's are not), and
/// the metrics listener.
fn start_listeners(
    live: &Arc<live::Live>,
    server: &Arc<Server>,
    bound: Bound,
    stop_rx: watch::Receiver<bool>,
) -> Result<(), BoxError> {
    let paired: Vec<(Option<Listener>, net::listener::Bound)> = match bound {
        Bound::Configured(b) => server
            .cfg
            .listeners
            .iter()
            .cloned()
            .map(Some)
            .zip(b)
            .collect(),
        Bound::Systemd(b) => b.into_iter().map(|b| (None, b)).collect(),
    };
    let frontend = live.frontend();
    let serving: Arc<dyn Serving> = live.clone();
    frontend.listeners.start(
        &serving,
        net::listener::AcceptCtx {
            conn_limit: frontend.connections.places().clone(),
            per_ip: frontend.per_ip.clone(),
            shutdown: stop_rx.clone(),
            shards: Arc::new(net::shards::Shards::start(server.cfg.config.threads)?),
        },
        paired,
    );
    if let Some(addr) = server.cfg.config.metrics.addr()? {
        frontend
            .listeners
            .set_metrics(&serving, Some((addr, observe::prometheus::bind(addr)?)));
    }
    Ok(())
}

/// Stop accepting, end persistent searches, let connections finish (10 s
/// at most), then close the logs and the store.
async fn shut_down(
    live: Arc<live::Live>,
    store: Store,
    feed: Arc<ops::feed::Feed>,
    stop_tx: watch::Sender<bool>,
) -> Result<(), BoxError> {
    tracing::info!("shutting down: no new connections; finishing operations in progress");
    let _ = stop_tx.send(true);
    // Persistent searches end now (with `unavailable`), not at the drain's end.
    feed.close();
    let connections = live.frontend().connections.clone();
    live.frontend().listeners.join_all().await;
    // Every live connection holds one permit until its task ends.
    let all = u32::try_from(connections.size()).unwrap_or(u32::MAX);
    let drain = connections.places().acquire_many(all);
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("some connections did not close within 10 s; closing anyway");
    }
    repl::Replicas::of(&live.server()).end_pushes().await;
    let w = store.writer_stats();
    tracing::info!(
        batches = w.batches,
        operations = w.operations,
        failed = w.failed_operations,
        largest_batch = w.largest_batch,
        mean_batch = format_args!("{:.1}", w.operations as f64 / w.batches.max(1) as f64),
        mean_commit_ms = format_args!(
            "{:.2}",
            w.commit_micros as f64 / 1000.0 / w.batches.max(1) as f64
        ),
        syncs = w.syncs,
        "writer totals"
    );
    live.server().logs.close();
    drop(live);
    tokio::task::spawn_blocking(move || store.close()).await?;
    tracing::info!("store closed cleanly");
    Ok(())
}

/// The running server for a validated configuration and an open store:
/// compiled access rules, authentication policy, limits, and the runtime
/// handles. Used by `run` and by in-process harnesses (the whole-server
/// fuzz target, unit tests).
pub fn build_server(
    cfg: Resolved,
    schema: Arc<Schema>,
    store: Store,
    csn: CsnClock,
    root_pw_hash: Option<String>,
    tls: Option<Arc<net::tls::TlsContext>>,
) -> Result<Arc<live::Live>, BoxError> {
    let passwords = Arc::new(hashing::PasswordWork::new(
        cfg.config.passwords.policy()?,
        cfg.config.passwords.max_concurrent_hashes,
    ));
    let logs = Arc::new(pando_observe::Logs::open(&cfg.config.logs)?);
    let frontend = net::frontend::Frontend::new(&cfg.config.limits, tls);
    let compiled = compile(cfg, schema, root_pw_hash, passwords, logs)?;
    Ok(live::Live::new(frontend, |weak| {
        let tree = Arc::new(cn_config::serve::Tree { live: weak.clone() });
        let runtime = new_runtime(&compiled, store, csn, tree);
        Server::assemble(compiled, runtime, weak)
    }))
}

/// What `cfg` compiles to. Fails (changing nothing) when a part of it
/// cannot be compiled.
pub fn compile(
    cfg: Resolved,
    schema: Arc<Schema>,
    root_pw_hash: Option<String>,
    passwords: Arc<hashing::PasswordWork>,
    logs: Arc<pando_observe::Logs>,
) -> Result<state::Compiled, BoxError> {
    let root_dn_norm = match &cfg.root_dn {
        Some(d) => schema
            .normalize_dn(d)
            .map_err(|e| format!("root_dn: {e}"))?,
        None => String::new(),
    };
    let auth = pando_access::auth::AuthPolicy::new(&cfg.config.auth, &schema)?;
    let acl = pando_access::acl::Acl::from_config(&cfg.config.access, &schema)
        .map_err(|(i, k, e)| format!("access[{i}].{k}: {e}"))?;
    let limits_by = cfg
        .config
        .limits
        .by
        .iter()
        .map(|b| pando_access::acl::Who::parse(&b.who.items(), &schema).map(|w| (w, b.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let suffixes = cfg
        .suffixes
        .iter()
        .map(|d| schema.normalize_dn(d).map(|n| (d.clone(), n)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("suffixes: {e}"))?;
    let limits = &cfg.config.limits;
    let decode_limits = DecodeLimits {
        max_depth: limits.max_filter_depth,
        max_filter_terms: limits.max_filter_terms,
        max_sort_keys: limits.max_sort_keys,
    };
    // A configured hash wins; otherwise the one the data directory keeps.
    let root_pw_hash = cfg.config.root_password_hash.clone().or(root_pw_hash);
    let overlays = Arc::new(overlays::Overlays::compile(
        &cfg.config.overlay,
        &schema,
        limits.max_pdu_bytes,
    )?);
    Ok(state::Compiled {
        remotes: overlays.remotes(),
        policy: overlays.policy(),
        layers: Arc::new(overlays.layers()),
        trees: std::iter::once(Arc::new(observe::monitor::Tree) as Arc<_>)
            .chain(overlays.trees())
            .collect(),
        desired: Arc::new(cfg.config.clone()),
        cfg,
        schema,
        root_dn_norm,
        root_pw_hash,
        suffixes,
        decode_limits,
        auth,
        acl,
        limits_by,
        passwords,
        logs,
    })
}

/// The suffixes whose entries this server makes: all but those a
/// consumer replicates whole (their entries come from the provider, with
/// its UUID and CSN).
pub fn own_suffixes(cfg: &pando_config::Resolved, schema: &Schema) -> Vec<Dn> {
    let replicated: Vec<String> = cfg
        .config
        .replication
        .consumer
        .iter()
        // Scopes one and children leave the base out: it stays local.
        .filter(|c| matches!(c.scope.as_str(), "sub" | "base"))
        .filter_map(|c| Dn::parse(&c.search_base).ok())
        .filter_map(|d| schema.normalize_dn(&d).ok())
        .collect();
    cfg.suffixes
        .iter()
        .filter(|s| {
            schema
                .normalize_dn(s)
                .map_or(true, |n| !replicated.contains(&n))
        })
        .cloned()
        .collect()
}

/// Threads large searches may hold under `limits` (0: four per core, at
/// least 8).
pub fn search_threads(limits: &pando_config::Limits) -> usize {
    match limits.max_search_threads {
        0 => (4 * std::thread::available_parallelism().map_or(1, |n| n.get()))
            .clamp(8, pando_config::MAX_SEARCH_THREADS),
        n => n,
    }
}

/// Whether logged changes get change numbers under `cfg`: only the retro
/// change log reads them (the index costs a write per change).
pub(crate) fn numbers_changes(cfg: &pando_config::Config) -> bool {
    cfg.overlay
        .iter()
        .any(|o| matches!(o, pando_config::overlay::OverlayConfig::Retrochangelog(_)))
}

/// The handles that outlive configuration changes, sized by the first
/// configuration.
fn new_runtime(
    c: &state::Compiled,
    store: Store,
    csn: CsnClock,
    config_tree: Arc<dyn pando_ops::seams::ConfigTree>,
) -> state::Runtime {
    let cfg = &c.cfg.config;
    let limits = &cfg.limits;
    state::Runtime {
        store,
        csn: Arc::new(csn),
        throttle: Arc::new(throttle::BindThrottle::new(limits)),
        search_threads: capacity::Capacity::new(search_threads(limits)),
        started: SystemTime::now(),
        metrics: Arc::new(pando_observe::metrics::Metrics::new()),
        subentries: Arc::new(ops::Subentries::default()),
        feed: Arc::new(ops::feed::Feed::new(limits.persistent_search_backlog)),
        persistent_searches: capacity::Capacity::new(limits.max_persistent_searches),
        persistent_holders: Default::default(),
        replicas: Arc::new(repl::Replicas::new(&c.schema, &cfg.replication)),
        config_tree,
    }
}

/// Each connection is a file descriptor: lift the soft limit to the hard one
/// so `limits.max_connections` rather than a default of 1024 decides.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a valid, initialised struct.
    unsafe {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max.min(1 << 20),
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 {
                tracing::debug!("could not raise the open-files limit");
            }
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, caught from the start of `run`.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, BoxError> {
        use tokio::signal::unix::{signal, SignalKind};
        let cannot = |e: std::io::Error| format!("cannot install signal handlers: {e}");
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(cannot)?,
            int: signal(SignalKind::interrupt()).map_err(cannot)?,
            hup: signal(SignalKind::hangup()).map_err(cannot)?,
        })
    }

    /// Serve until SIGTERM or SIGINT; on SIGHUP reload the configuration
    /// file and install what can change at runtime.
    async fn wait_for_stop(mut self, live: &live::Live, reload: Option<&Reloader>) {
        loop {
            tokio::select! {
                _ = self.term.recv() => return,
                _ = self.int.recv() => return,
                _ = self.hup.recv() => {
                    let _changing = live.changing().await;
                    apply_reload(live, reload).await;
                }
            }
        }
    }
}

async fn apply_reload(live: &live::Live, reload: Option<&Reloader>) {
    let server = live.server();
    // Certificate files are re-read whether or not there is a configuration
    // file (a renewed certificate under the same names, or the self-signed one).
    if let Some(tls) = live.frontend().tls() {
        tls.reload();
    }
    server.logs.reopen();
    let Some(reload) = reload else {
        tracing::info!("SIGHUP: no configuration file to reload");
        return;
    };
    let refused = |e: String| {
        tracing::error!("SIGHUP: configuration not reloaded, the running one stays: {e}");
    };
    let file = match reload() {
        Ok(f) => f,
        Err(e) => return refused(e),
    };
    // Keys edited in the file since it was last read are taken from it;
    // the others keep their values (changed over LDAP, perhaps).
    let merged = match cn_config::stored::last_file(&server.rt.store) {
        Some(last) => {
            cn_config::stored::merge(
                &cn_config::stored::Stored {
                    config: (*server.desired).clone(),
                    file: last,
                },
                &file,
            )
            .config
        }
        None => file.clone(),
    };
    // Schema files are read again; the schema changes when they did.
    let stamp = live::Stamp::New(server.rt.csn.next());
    let installed = match live.commit(merged, Some(&file), false, stamp).await {
        Ok(i) => i,
        Err(e) => return refused(e.to_string()),
    };
    if !installed.changed.is_empty() {
        tracing::info!(keys = %installed.changed.join(", "), "SIGHUP: configuration changed");
    }
    if !installed.at_next_start.is_empty() {
        tracing::warn!(
            keys = %installed.at_next_start.join(", "),
            "SIGHUP: these changes take effect at the next start"
        );
    }
}

fn print_banner(
    server: &Server,
    pw: &Option<RootPassword>,
    created: &[String],
    demo_added: Option<usize>,
    tls_generated: bool,
) {
    // Written in one piece: a reader waiting for "is serving:" (a test,
    // a supervisor) sees the whole banner at once.
    let mut banner = String::new();
    banner_status(&mut banner, server, pw, created, demo_added, tls_generated);
    banner_suggestions(&mut banner, &server.cfg);
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(banner.as_bytes());
    let _ = out.flush();
}

/// What is serving, where, and how the administrator signs in.
fn banner_status(
    banner: &mut String,
    server: &Server,
    pw: &Option<RootPassword>,
    created: &[String],
    demo_added: Option<usize>,
    tls_generated: bool,
) {
    macro_rules! w {
        () => { banner.push('\n') };
        ($($arg:tt)*) => {{
            use std::fmt::Write as _;
            let _ = writeln!(banner, $($arg)*);
        }};
    }
    let cfg = &server.cfg;
    w!("Pando {} is serving:", env!("CARGO_PKG_VERSION"));
    for l in &cfg.listeners {
        w!("  {}", l.url());
    }
    w!(
        "  suffixes: {}",
        cfg.suffixes
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    );
    w!("  data directory: {}", cfg.config.data_dir.display());
    for c in created {
        w!("  created suffix entry {c}");
    }
    match demo_added {
        Some(0) => {}
        Some(n) => w!("  loaded {n} demo entries"),
        None => w!("  --demo: the store already existed, so no demo entries were loaded"),
    }
    match &cfg.root_dn {
        Some(d) => w!("  administrator: {d}"),
        None => w!("  no root DN: administer over ldapi with SASL EXTERNAL (see [auth])"),
    }
    match pw {
        None => {}
        Some(RootPassword::Generated { file, .. }) => {
            w!(
                "  a random administrator password was generated and written to {}",
                file.display()
            );
            w!("  (only its hash is kept; read the file, store the password safely, then delete the file)");
        }
        Some(RootPassword::Stored(_)) => {
            let f = cfg.config.data_dir.join(bootstrap::ADMIN_PASSWORD_FILE);
            if f.exists() {
                w!("  administrator password: see {}", f.display());
            } else {
                w!("  administrator password: as generated on first start (hash kept in the store)");
            }
        }
        Some(RootPassword::Configured(_)) => {
            w!("  administrator password: root_password_hash from the configuration")
        }
    }
    if let Some(t) = &cfg.tls {
        print_tls_status(cfg, t, tls_generated);
    }
}

/// Commands to try, for the listeners configured.
fn banner_suggestions(banner: &mut String, cfg: &Resolved) {
    macro_rules! w {
        () => { banner.push('\n') };
        ($($arg:tt)*) => {{
            use std::fmt::Write as _;
            let _ = writeln!(banner, $($arg)*);
        }};
    }
    let suffix = cfg
        .suffixes
        .first()
        .map(|d| d.to_string())
        .unwrap_or_default();
    // How the suggestions below bind as the administrator (" -D … -y file"
    // while the generated password file is still there, else " -D … -W");
    // empty without a root DN.
    let admin_bind = match &cfg.root_dn {
        Some(root) => {
            let file = cfg.config.data_dir.join(bootstrap::ADMIN_PASSWORD_FILE);
            if file.exists() {
                format!(" -D '{root}' -y {}", file.display())
            } else {
                format!(" -D '{root}' -W")
            }
        }
        None => String::new(),
    };
    if let Some(Listener::Tcp(a)) = cfg.listeners.iter().find(|l| matches!(l, Listener::Tcp(_))) {
        w!();
        w!("Try:");
        // Anonymous clients read only the root DSE and the schema, so the
        // suggestions that read data bind first.
        w!("  ldapsearch -x -H ldap://{a} -s base -b '' namingContexts");
        if !admin_bind.is_empty() {
            w!("  ldapsearch -x -H ldap://{a}{admin_bind} -b '{suffix}'");
            w!("  ldapwhoami -x -H ldap://{a}{admin_bind}");
        }
    }
    if let Some(Listener::Ldapi(p)) = cfg
        .listeners
        .iter()
        .find(|l| matches!(l, Listener::Ldapi(_)))
    {
        let url = Listener::Ldapi(p.clone()).url();
        w!("  ldapwhoami -Y EXTERNAL -H {url}");
    }
    if let Some(t) = &cfg.tls {
        let trust = if t.self_signed {
            // A self-signed certificate is its own issuer, not a CA.
            "LDAPTLS_REQCERT=never".to_string()
        } else {
            "LDAPTLS_CACERT=<your CA file>".to_string()
        };
        if !cfg.listeners.iter().any(|l| matches!(l, Listener::Tcp(_))) {
            w!();
            w!("Try:");
        }
        for l in &cfg.listeners {
            match l {
                Listener::Tcp(a) if admin_bind.is_empty() => {
                    w!("  {trust} ldapsearch -x -ZZ -H ldap://{a} -s base -b '' namingContexts")
                }
                Listener::Tcp(a) => {
                    w!("  {trust} ldapsearch -x -ZZ -H ldap://{a}{admin_bind} -b '{suffix}'")
                }
                Listener::Ldaps(a) if admin_bind.is_empty() => {
                    w!("  {trust} ldapsearch -x -H ldaps://{a} -s base -b '' namingContexts")
                }
                Listener::Ldaps(a) => {
                    w!("  {trust} ldapsearch -x -H ldaps://{a}{admin_bind} -b '{suffix}'")
                }
                Listener::Ldapi(_) => {}
            }
        }
    }
}

/// The TLS lines of the banner: which certificate, whether it was just
/// generated, where StartTLS is offered and what is asked of clients.
fn print_tls_status(cfg: &pando_config::Resolved, t: &pando_config::TlsSettings, generated: bool) {
    if t.self_signed {
        let dir = t.cert_file.parent().unwrap_or(&t.cert_file);
        if generated {
            println!(
                "  TLS: generated a self-signed certificate for {} in {} (--tls-self-signed)",
                net::tls::SELF_SIGNED_NAMES.join(", "),
                dir.display()
            );
        } else {
            println!(
                "  TLS: the self-signed certificate in {} (generated at an earlier start; --tls-self-signed)",
                dir.display()
            );
        }
        println!(
            "       clients must trust {} or skip certificate checks",
            t.cert_file.display()
        );
    } else {
        println!(
            "  TLS: certificate {}, key {}",
            t.cert_file.display(),
            t.key_file.display()
        );
    }
    if cfg.listeners.iter().any(|l| matches!(l, Listener::Tcp(_))) {
        println!("  StartTLS is offered on the ldap:// listeners");
    }
    let min = match t.min_version {
        pando_config::TlsVersion::V1_2 => "1.2",
        pando_config::TlsVersion::V1_3 => "1.3",
    };
    let certs = match (t.client_certs, &t.ca_file) {
        (pando_config::ClientCerts::None, _) | (_, None) => "not asked for".to_string(),
        (pando_config::ClientCerts::Request, Some(ca)) => {
            format!("requested, checked against {}", ca.display())
        }
        (pando_config::ClientCerts::Require, Some(ca)) => {
            format!("required, checked against {}", ca.display())
        }
    };
    println!("  TLS {min} and later; client certificates {certs}");
}

#[cfg(test)]
mod ops_tests;
#[cfg(test)]
mod overlays_tests;
#[cfg(test)]
mod test_server;
