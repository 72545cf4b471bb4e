//! `pando`: the one binary. Subcommands: serve, passwd (more to come:
//! import, export, backup, restore, verify, index, gen, bench, stat).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use pando_server::settings::Validate;

mod acl_check;
mod ldap_client;
mod migrate_cmd;
mod progress;
mod proxy_cmd;
mod repl_check;
mod repl_diff;
mod repl_repair;
mod repl_status;
mod stat;

use clap::{Parser, Subcommand};
use pando_config::Config;
use pando_model::Schema;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "pando", version, about = "Pando LDAPv3 directory server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the directory server (zero configuration: serves dc=example,dc=com
    /// on ldap://127.0.0.1:3389 with data in ./pando-data).
    Serve(ServeArgs),
    /// Hash a password for `root_password_hash` (reads it from standard
    /// input), with the `[passwords]` scheme of the configuration if given.
    Passwd(PasswdArgs),
    /// Check that the store's databases agree with each other (server stopped or running).
    Verify(VerifyArgs),
    /// Copy the store to a new directory with a manifest, while the server runs or not.
    Backup(BackupArgs),
    /// Replace the store of a stopped server with a backup (checked first).
    Restore(RestoreArgs),
    /// Generate LDIF from a MakeLDIF template (built-in: example, telco).
    Gen(GenArgs),
    /// Load LDIF into the store of a stopped server (one pass, bounded memory).
    Import(ImportArgs),
    /// Write the store (or a subtree) as LDIF, consistently, server running or not.
    Export(ExportArgs),
    /// Write every entry that can still be read from a damaged store to LDIF,
    /// with a report of what was lost (server stopped).
    Salvage(SalvageArgs),
    /// Index maintenance (server stopped).
    Index(IndexArgs),
    /// memberOf maintenance (server stopped).
    Memberof(MemberofArgs),
    /// Load generator: search/auth/bind/modify/add/delete rates against any LDAP server.
    Bench(Box<pando_bench::BenchArgs>),
    /// Print a running server's operation rates, latencies, I/O and CPU,
    /// one line per interval (from /metrics or cn=Monitor).
    Stat(stat::StatArgs),
    /// Replication: `pando repl status URL...` compares contextCSN across
    /// servers and says who is behind by how much; `pando repl check
    /// URL...` compares the entries themselves and repairs differences.
    Repl(ReplArgs),
    /// The configuration kept in the data directory (changed under
    /// cn=config) merged with the file.
    Config(ConfigArgs),
    /// Translate an OpenLDAP configuration (slapd.d or slapd.conf) into a
    /// Pando one, with a report of what could not be translated exactly;
    /// --verify-against compares access on slapd and Pando.
    Migrate(migrate_cmd::MigrateArgs),
    /// An LDAP proxy in front of several servers: reads balanced over the
    /// replicas in rotation, writes to the active provider (moved to the
    /// next when it fails), every message decodable to a log.
    Proxy(proxy_cmd::ProxyArgs),
    /// Write the manual pages (pando.1 and one per command) into a directory.
    Man {
        /// e.g. /usr/local/share/man/man1
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    Completions { shell: clap_complete::Shell },
}

#[derive(clap::Args)]
struct ConfigArgs {
    #[command(subcommand)]
    action: ConfigAction,
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Print the configuration the server would start with, as TOML (a
    /// configuration file to keep or to start another data directory; a
    /// consumer's inline password shows as "****": put it back).
    Export(StoreArgs),
}

#[derive(clap::Args)]
struct ReplArgs {
    #[command(subcommand)]
    action: ReplAction,
}

#[derive(Subcommand)]
enum ReplAction {
    /// A suffix's contextCSN on each server, per server ID, and the lag
    /// behind the newest (exit 0: all in step, 1: one behind, 2: one
    /// unreadable).
    Status(repl_status::ReplStatusArgs),
    /// Whether servers hold the same entries (not only the same
    /// contextCSN): hash trees over their entries compared top-down, every
    /// differing entry named; --repair writes the winning copies again
    /// (exit 0: the same everywhere, 1: some differ, 2: one unreadable).
    Check(repl_check::ReplCheckArgs),
}

#[derive(clap::Args)]
struct IndexArgs {
    #[command(subcommand)]
    action: IndexAction,
}

#[derive(Subcommand)]
enum IndexAction {
    /// Rebuild the indexes of these attributes (all configured ones when
    /// none are named) from the entries, e.g. after changing [indexes].
    Rebuild {
        #[command(flatten)]
        store: StoreArgs,
        attrs: Vec<String>,
    },
}

#[derive(clap::Args)]
struct MemberofArgs {
    #[command(subcommand)]
    action: MemberofAction,
}

#[derive(Subcommand)]
enum MemberofAction {
    /// Set memberOf of every entry to the groups that list it (after
    /// turning the memberof overlay on over existing data, or importing
    /// data without memberOf). Each change is logged and replicated.
    Rebuild(StoreArgs),
}

#[derive(clap::Args)]
struct ImportArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// LDIF file ("-" or absent: standard input).
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// Skip bad records (written to --rejects) instead of stopping at the first.
    #[arg(long)]
    continue_on_error: bool,
    /// Where rejected records go (default: <file>.rejects or ./import.rejects).
    #[arg(long)]
    rejects: Option<PathBuf>,
    /// Entries per write transaction.
    #[arg(long, default_value_t = 20_000)]
    batch: usize,
    /// Memory for index keys (e.g. 256M, 2G); beyond it keys are spilled to
    /// sorted runs in the data directory and merged once at the end.
    #[arg(long, default_value = "512M", value_parser = progress::parse_size)]
    memory: usize,
    /// Threads parsing and checking entries (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
    /// Let `attr:< file://…` lines read local files.
    #[arg(long)]
    allow_file_urls: bool,
}

#[derive(clap::Args)]
struct ExportArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Output file (default: standard output).
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// Only this subtree.
    #[arg(long, short = 'b')]
    base: Option<String>,
    /// Only entries matching this RFC 4515 filter.
    #[arg(long)]
    filter: Option<String>,
    /// Include operational attributes (entryUUID, entryCSN, timestamps…).
    #[arg(long)]
    operational: bool,
    /// Fold lines at this width (0 = no folding).
    #[arg(long, default_value_t = 76)]
    wrap: usize,
    /// Export the entries as they were at this point, from a backup chain
    /// (--backup): a CSN, or a UTC time (20261130120000Z or
    /// 2026-11-30T12:00:00Z; to the second, the whole second).
    #[arg(long, requires = "backup", value_name = "CSN|TIME")]
    as_of: Option<String>,
    /// With --as-of: the newest backup of the chain to read (a full backup
    /// or an incremental one); the live store is not read.
    #[arg(long, requires = "as_of", value_name = "DIR")]
    backup: Option<PathBuf>,
}

#[derive(clap::Args)]
struct SalvageArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// LDIF output: the entries that could be read, parents first, with
    /// every attribute as stored (import it with `pando import`).
    #[arg(long, short = 'o')]
    output: PathBuf,
    /// The report of what could not be read (default: OUTPUT.report).
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(clap::Args)]
struct GenArgs {
    /// Template file, or the name of a built-in one: `example` (inetOrgPerson
    /// users uid=user.N) or `telco` (subscribers, devices, groups).
    #[arg(long, short = 't', default_value = "example")]
    template: String,
    /// Override a template `define`, e.g. -D numusers=1000000 (repeatable).
    #[arg(short = 'D', value_name = "NAME=VALUE")]
    define: Vec<String>,
    /// Random seed: the same seed, template and defines give the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output file (default: standard output).
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// Fold lines longer than this (0 = never fold).
    #[arg(long, default_value_t = 0)]
    wrap: usize,
}

#[derive(clap::Args)]
struct VerifyArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Rebuild every index from the entries (server must be stopped), then verify.
    #[arg(long)]
    repair_indexes: bool,
}

#[derive(clap::Args)]
struct BackupArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// New directory to hold the backup.
    dest: PathBuf,
    /// Copy only what was committed since this backup (full or
    /// incremental), from the change log.
    #[arg(long, value_name = "PARENT")]
    incremental_from: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RestoreArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// A directory made by `pando backup`: a full backup, or the last
    /// incremental one of a chain (the backups it follows are found
    /// through their links).
    src: PathBuf,
    /// Restore up to and including this change (point-in-time restore).
    #[arg(long, value_name = "CSN", conflicts_with = "to_time")]
    to_csn: Option<String>,
    /// Restore up to and including this UTC time: 20261130120000Z or
    /// 2026-11-30T12:00:00Z (to the second: the whole second).
    #[arg(long, value_name = "TIME")]
    to_time: Option<String>,
    /// Only check the chain (every link and checksum) and list it; restore
    /// nothing.
    #[arg(long, conflicts_with_all = ["to_csn", "to_time"])]
    check: bool,
}

#[derive(clap::Args)]
struct StoreArgs {
    /// TOML configuration file.
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Data directory (overrides the configuration's data_dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
struct PasswdArgs {
    /// TOML configuration file whose `[passwords]` scheme to use (default: argon2id).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Listener URL, repeatable (overrides the configuration's listen list),
    /// e.g. ldap://127.0.0.1:3389 or ldapi:// (socket in the data directory).
    #[arg(long)]
    listen: Vec<String>,
    /// Load a small demo tree (ou=People, ou=Groups) into the first suffix.
    #[arg(long)]
    demo: bool,
    /// Log level: error, warn, info, debug, trace (overrides log_level).
    #[arg(long)]
    log_level: Option<String>,
    /// When [tls] names no certificate, use a self-signed one for
    /// localhost, 127.0.0.1 and ::1 kept in <data_dir>/tls/ (generated on
    /// the first start, reused after). Enables StartTLS and ldaps:// listeners.
    #[arg(long)]
    tls_self_signed: bool,
}

/// The configuration to work with: the one stored in the data directory
/// merged with the file (see `cn_config::stored`), or the file alone.
fn load_config(args: &StoreArgs) -> Result<Config, String> {
    let (file, stored) = file_config(args)?;
    Ok(pando_server::cn_config::stored::effective(stored.as_ref(), file).config)
}

/// The configuration file with `--data-dir`, and what that data directory
/// stores (read once). Without a file: the file the stored configuration
/// last came from (so no key counts as edited), or the defaults for a new
/// data directory.
fn file_config(
    args: &StoreArgs,
) -> Result<(Config, Option<pando_server::cn_config::stored::Stored>), String> {
    let given = match &args.config {
        Some(p) => Some(Config::load(p).map_err(|e| e.to_string())?),
        None => None,
    };
    let dir = match (&args.data_dir, &given) {
        (Some(d), _) => d.clone(),
        (None, Some(c)) => c.data_dir.clone(),
        (None, None) => Config::default().data_dir,
    };
    let stored = pando_server::cn_config::stored::read(&dir)?;
    let cfg = match given {
        Some(c) => c,
        None => stored
            .as_ref()
            .map_or_else(Config::default, |s| s.file.clone()),
    };
    Ok((with_data_dir(args, cfg), stored))
}

fn with_data_dir(args: &StoreArgs, mut cfg: Config) -> Config {
    if let Some(d) = &args.data_dir {
        // The default ldapi socket follows the data directory.
        cfg.data_dir = d.clone();
    }
    cfg
}

/// Log to stderr at `level` (PANDO_LOG, when set, wins). The returned
/// setter changes the level while serving (None when PANDO_LOG is set).
fn init_logging(level: &str) -> Option<pando_observe::LevelSetter> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let from_env = tracing_subscriber::EnvFilter::try_from_env("PANDO_LOG").ok();
    let fixed = from_env.is_some();
    let filter = from_env
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(format!("{level},heed=warn")));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    // A log line that cannot be written (stderr on a full disk, say) is
    // dropped: by default the subscriber reports that with eprintln!, which
    // panics the thread that logged — the store's writer, for instance.
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .log_internal_errors(false),
        )
        .init();
    if fixed {
        return None;
    }
    Some(Arc::new(move |level: &str| {
        handle
            .reload(tracing_subscriber::EnvFilter::new(format!(
                "{level},heed=warn"
            )))
            .map_err(|e| e.to_string())
    }))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Passwd(a) => passwd(a),
        Command::Verify(args) => verify(args),
        Command::Backup(args) => backup(args),
        Command::Restore(args) => restore(args),
        Command::Gen(args) => gen(args),
        Command::Import(args) => import(args),
        Command::Export(args) => export(args),
        Command::Salvage(args) => salvage(args),
        Command::Index(IndexArgs {
            action: IndexAction::Rebuild { store, attrs },
        }) => index_rebuild(store, attrs),
        Command::Memberof(MemberofArgs {
            action: MemberofAction::Rebuild(store),
        }) => memberof_rebuild(store),
        Command::Bench(args) => pando_bench::run(*args).map(|()| ExitCode::SUCCESS),
        Command::Stat(args) => stat::run(args),
        Command::Repl(ReplArgs {
            action: ReplAction::Status(args),
        }) => repl_status::run(args),
        Command::Repl(ReplArgs {
            action: ReplAction::Check(args),
        }) => repl_check::run(args),
        Command::Config(ConfigArgs {
            action: ConfigAction::Export(args),
        }) => config_export(args),
        Command::Migrate(args) => migrate_cmd::run(args),
        Command::Proxy(args) => proxy_cmd::run(args),
        Command::Man { out } => write_man_pages(&out),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "pando", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pando: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `pando.1` and `pando-<command>.1` for each command, from the CLI
/// definition itself (so the pages never disagree with `--help`).
fn write_man_pages(out: &std::path::Path) -> Result<ExitCode, String> {
    use clap::CommandFactory;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let cmd = Cli::command();
    let mut written = Vec::new();
    let mut page = |cmd: clap::Command, name: String| -> Result<(), String> {
        let path = out.join(format!("{name}.1"));
        let mut buf = Vec::new();
        // clap names are static strings; this runs once per page and exits.
        let title: &'static str = Box::leak(name.into_boxed_str());
        clap_mangen::Man::new(cmd.name(title))
            .render(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::write(&path, buf).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for sub in cmd.get_subcommands() {
        page(sub.clone(), format!("pando-{}", sub.get_name()))?;
    }
    page(cmd, "pando".into())?;
    println!("wrote {} manual pages in {}", written.len(), out.display());
    Ok(ExitCode::SUCCESS)
}

/// `cfg` with `serve`'s command-line options.
fn with_serve_options(args: &ServeArgs, mut cfg: Config) -> Config {
    if !args.listen.is_empty() {
        cfg.listen = args.listen.clone();
    }
    if let Some(l) = &args.log_level {
        cfg.log_level = l.clone();
    }
    cfg.tls.self_signed = args.tls_self_signed;
    cfg
}

fn serve(args: ServeArgs) -> Result<ExitCode, String> {
    let (file, stored) = file_config(&args.store)?;
    let file = with_serve_options(&args, file);
    let merged = pando_server::cn_config::stored::effective(stored.as_ref(), file.clone());
    let schema = Arc::new(pando_config::schema_files::build(&merged.config)?);
    let resolved = merged
        .config
        .clone()
        .validate(&schema)
        .map_err(|e| e.to_string())?;
    let demo = args.demo;
    // The file alone: the running server has the store (its records are
    // read through it, never by opening the store a second time).
    let reload: Option<pando_server::Reloader> = args.store.config.clone().map(|path| {
        let reload: pando_server::Reloader = Arc::new(move || {
            let file = Config::load(&path).map_err(|e| e.to_string())?;
            Ok(with_serve_options(&args, with_data_dir(&args.store, file)))
        });
        reload
    });
    if let Some(setter) = init_logging(&resolved.config.log_level) {
        pando_observe::on_log_level(setter);
    }
    if !merged.from_file.is_empty() {
        tracing::info!(
            keys = %merged.from_file.join(", "),
            "configuration: these keys changed in the file since the last start and are taken from it"
        );
    }
    if !merged.from_store.is_empty() {
        tracing::info!(
            keys = %merged.from_store.join(", "),
            "configuration: these keys keep the values changed over LDAP (cn=config)"
        );
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if resolved.config.threads > 0 {
        rt.worker_threads(resolved.config.threads);
    }
    // 8 MiB stacks: an unoptimised (debug) build overflows the 2 MiB
    // default on its first request; release builds need far less, and the
    // unused part costs address space only.
    let rt = rt
        .enable_all()
        .thread_name("pando-worker")
        .thread_stack_size(8 << 20)
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(pando_server::run(
        resolved,
        schema,
        pando_server::ServeOptions {
            demo,
            reload,
            file: Some(file),
        },
    ))
    .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}

fn config_export(args: StoreArgs) -> Result<ExitCode, String> {
    let cfg = load_config(&args)?;
    // No credential in an export (a consumer's password shows as the
    // placeholder, which a configuration file is refused with).
    let shown = pando_server::cn_config::shown(&cfg);
    print!("{}", pando_server::cn_config::stored::to_text(&shown)?);
    Ok(ExitCode::SUCCESS)
}

fn passwd(args: PasswdArgs) -> Result<ExitCode, String> {
    let policy = match &args.config {
        Some(p) => Config::load(p)
            .map_err(|e| e.to_string())?
            .passwords
            .policy()
            .map_err(|e| e.to_string())?,
        None => pando_password::HashPolicy::default(),
    };
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let clear = line.trim_end_matches(['\r', '\n']);
    if clear.is_empty() {
        return Err("no password on standard input".into());
    }
    println!("{}", policy.hash(clear.as_bytes()));
    Ok(ExitCode::SUCCESS)
}

fn resolve(args: &StoreArgs) -> Result<(pando_config::Resolved, Arc<Schema>), String> {
    let cfg = load_config(args)?;
    let schema = Arc::new(pando_config::schema_files::build(&cfg)?);
    let resolved = cfg.validate(&schema).map_err(|e| e.to_string())?;
    Ok((resolved, schema))
}

fn entry_count(store: &pando_store::Store) -> Result<u64, String> {
    let r = store.read().map_err(|e| e.to_string())?;
    r.view().entry_count().map_err(|e| e.to_string())
}

fn verify(args: VerifyArgs) -> Result<ExitCode, String> {
    let (resolved, schema) = resolve(&args.store)?;
    let data_dir = &resolved.config.data_dir;
    let dir = pando_server::store_dir(data_dir);
    let opts = pando_server::store_options(&resolved);
    let store = if args.repair_indexes {
        // Rebuilding writes: the server must not be running.
        let _lock = pando_server::datadir::lock(data_dir)?;
        let store = pando_store::Store::open(&dir, schema.clone(), &opts)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let started = std::time::Instant::now();
        let total = entry_count(&store)?;
        let mut reporter = progress::Reporter::new(None);
        let n = store
            .rebuild_indexes(&[], &mut |done| reporter.entries(done, total))
            .map_err(|e| e.to_string())?;
        reporter.finish();
        println!(
            "rebuilt every index from {n} entries in {:.2} s",
            started.elapsed().as_secs_f64()
        );
        store
    } else {
        // Every page is checked before LMDB reads them all.
        if let Err(e) = pando_store::preflight(&dir, false, true) {
            println!("{}: {e}", dir.display());
            return Ok(ExitCode::from(1));
        }
        pando_store::Store::open_read_only(&dir, schema.clone(), &opts)
            .map_err(|e| format!("{}: {e}", dir.display()))?
    };
    let rtxn = store.read().map_err(|e| e.to_string())?;
    let view = rtxn.view();
    note_older_format(&dir, &view)?;
    let count = view.entry_count().map_err(|e| e.to_string())?;
    let mut problems = view.verify().map_err(|e| e.to_string())?;
    problems.extend(memberof_problems(&resolved, &schema, &view)?);
    drop(rtxn);
    store.close();
    if problems.is_empty() {
        println!("{}: {count} entries, consistent", dir.display());
        Ok(ExitCode::SUCCESS)
    } else {
        for p in &problems {
            println!("{p}");
        }
        println!(
            "{}: {count} entries, {} problem(s)",
            dir.display(),
            problems.len()
        );
        Ok(ExitCode::from(1))
    }
}

/// The memberof overlay of the configuration, if it has one.
fn configured_memberof(
    resolved: &pando_config::Resolved,
    schema: &Schema,
) -> Option<pando_server::overlays::memberof::MemberOf> {
    resolved.config.overlay.iter().find_map(|o| match o {
        pando_server::overlays::OverlayConfig::Memberof(c) => {
            Some(pando_server::overlays::memberof::MemberOf::new(c, schema))
        }
        _ => None,
    })
}

/// A store of an older format is read as it is, but its index databases
/// are only rebuilt in this version's layout when a server (or
/// `--repair-indexes`) opens it for writing: say so, since they are not
/// checked until then.
fn note_older_format(dir: &std::path::Path, view: &pando_store::View<'_>) -> Result<(), String> {
    let f = view.store_format().map_err(|e| e.to_string())?;
    if f < pando_store::INDEX_FORMAT {
        println!(
            "{}: store format {f}; its indexes are rebuilt in format {} at the next start (or with --repair-indexes), and are not checked here",
            dir.display(),
            pando_store::FORMAT_VERSION
        );
    }
    Ok(())
}

/// With the memberof overlay configured: entries whose memberOf is not
/// exactly the groups that list them.
fn memberof_problems(
    resolved: &pando_config::Resolved,
    schema: &Schema,
    view: &pando_store::View<'_>,
) -> Result<Vec<String>, String> {
    let Some(m) = configured_memberof(resolved, schema) else {
        return Ok(Vec::new());
    };
    let found = m.disagreements(schema, view).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for d in found {
        for g in &d.extra {
            out.push(format!(
                "{}: memberOf lists {g}, which does not list it as a member (pando memberof rebuild sets it right)",
                d.dn
            ));
        }
        for g in &d.missing {
            out.push(format!(
                "{}: {g} lists it as a member, but its memberOf lacks it (pando memberof rebuild sets it right)",
                d.dn
            ));
        }
    }
    Ok(out)
}

fn backup(args: BackupArgs) -> Result<ExitCode, String> {
    let (resolved, schema) = resolve(&args.store)?;
    let dir = pando_server::store_dir(&resolved.config.data_dir);
    let opts = pando_server::store_options(&resolved);
    let Some(parent) = &args.incremental_from else {
        let r = pando_server::backup::backup(&dir, &args.dest, schema, &opts)?;
        let m = &r.manifest;
        println!(
            "backup of {} entries ({} MiB) written to {} in {:.2} s (copy {:.2} s); sha256 {}",
            m.entries,
            m.bytes >> 20,
            r.dest.display(),
            r.total_secs,
            r.copy_secs,
            m.sha256
        );
        return Ok(ExitCode::SUCCESS);
    };
    let r = pando_server::backup::incremental(&dir, &args.dest, parent, schema, &opts)?;
    let m = &r.manifest;
    println!(
        "incremental backup of {} changes since {} ({} KiB) written to {} in {:.2} s; {} entries; sha256 {}",
        m.changes,
        parent.display(),
        m.bytes.div_ceil(1024),
        r.dest.display(),
        r.total_secs,
        m.entries,
        m.sha256
    );
    Ok(ExitCode::SUCCESS)
}

/// Where a restore stops, from `--to-csn` / `--to-time`.
fn restore_until(
    csn: Option<&str>,
    time: Option<&str>,
) -> Result<pando_server::backup::Until, String> {
    use pando_server::backup::Until;
    match (csn, time) {
        (Some(c), _) => Until::csn(c),
        (None, Some(t)) => Until::time(t),
        (None, None) => Ok(Until::End),
    }
}

fn restore(args: RestoreArgs) -> Result<ExitCode, String> {
    if args.check {
        let links = pando_server::backup::chain::chain(&args.src)?;
        for l in &links {
            let m = &l.manifest;
            println!(
                "{:<11} {}  made {}  {} entries  {} changes  newest {}",
                format!("{:?}", m.kind).to_lowercase(),
                l.dir.display(),
                m.created,
                m.entries,
                m.changes,
                m.context_csn.as_deref().unwrap_or("-")
            );
        }
        println!("the chain of {} backup(s) checks", links.len());
        return Ok(ExitCode::SUCCESS);
    }
    let until = restore_until(args.to_csn.as_deref(), args.to_time.as_deref())?;
    let (resolved, schema) = resolve(&args.store)?;
    let data_dir = resolved.config.data_dir.clone();
    // The service account's only, as `serve` makes it.
    pando_server::datadir::private_dir(&data_dir)?;
    let _lock = pando_server::datadir::lock(&data_dir)
        .map_err(|e| format!("{e}; stop the server before restoring"))?;
    let opts = pando_server::store_options(&resolved);
    let r = pando_server::backup::restore(&args.src, &data_dir, schema, &opts, &until)?;
    let full = &r.links[0].manifest;
    println!(
        "restored {} entries into {}: full backup {} (of {}, suffixes {}){}, newest change {}",
        r.entries,
        pando_server::store_dir(&data_dir).display(),
        r.links[0].dir.display(),
        full.created,
        full.suffixes.join("; "),
        match r.applied_links {
            1 => String::new(),
            n => format!(
                " and {} incremental(s), {} changes replayed",
                n - 1,
                r.changes
            ),
        },
        r.newest_csn.as_deref().unwrap_or("none")
    );
    Ok(ExitCode::SUCCESS)
}

fn gen(args: GenArgs) -> Result<ExitCode, String> {
    use std::io::Write;
    let (text, origin) = match pando_gen::builtin(&args.template) {
        Some(t) => (t.to_string(), format!("<built-in {}>", args.template)),
        None => (
            std::fs::read_to_string(&args.template)
                .map_err(|e| format!("{}: {e}", args.template))?,
            args.template.clone(),
        ),
    };
    let template = pando_gen::Template::parse(&text, &origin).map_err(|e| e.to_string())?;
    let mut defines = Vec::new();
    for d in &args.define {
        let (k, v) = d
            .split_once('=')
            .ok_or_else(|| format!("-D {d}: expected NAME=VALUE"))?;
        defines.push((k.trim().to_string(), v.to_string()));
    }
    let opts = pando_gen::Options {
        seed: args.seed,
        defines,
        wrap: (args.wrap > 0).then_some(args.wrap),
    };
    let started = std::time::Instant::now();
    let stats = match &args.output {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            let s = pando_gen::generate(&template, &opts, &mut w).map_err(|e| e.to_string())?;
            w.flush().map_err(|e| format!("{}: {e}", p.display()))?;
            s
        }
        None => {
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
            let s = pando_gen::generate(&template, &opts, &mut w).map_err(|e| e.to_string())?;
            w.flush().map_err(|e| e.to_string())?;
            s
        }
    };
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "pando gen: {} entries, {} MiB in {secs:.2} s ({:.0} entries/s)",
        stats.entries,
        stats.bytes >> 20,
        stats.entries as f64 / secs.max(1e-9)
    );
    Ok(ExitCode::SUCCESS)
}

fn import(args: ImportArgs) -> Result<ExitCode, String> {
    use std::io::Write;
    let (resolved, schema) = resolve(&args.store)?;
    let data_dir = resolved.config.data_dir.clone();
    // The service account's only, as `serve` makes it.
    pando_server::datadir::private_dir(&data_dir)?;
    let (_lock, store) = open_stopped(&resolved, &schema, "stop the server before importing")?;
    let (input, origin, size): (Box<dyn std::io::Read + Send>, String, Option<u64>) =
        match &args.file {
            Some(p) if p.as_os_str() != "-" => {
                let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
                let size = f.metadata().ok().map(|m| m.len()).filter(|&n| n > 0);
                (Box::new(f), p.display().to_string(), size)
            }
            _ => (Box::new(std::io::stdin()), "<stdin>".into(), None),
        };
    let rejects_path = args.rejects.clone().unwrap_or_else(|| match &args.file {
        Some(p) if p.as_os_str() != "-" => PathBuf::from(format!("{}.rejects", p.display())),
        _ => PathBuf::from("import.rejects"),
    });
    let mut rejects_file: Option<std::io::BufWriter<std::fs::File>> = None;
    let mut reject_err: Option<String> = None;
    let mut on_reject = |r: &pando_server::bulk::Reject| {
        if rejects_file.is_none() && reject_err.is_none() {
            match std::fs::File::create(&rejects_path) {
                Ok(f) => rejects_file = Some(std::io::BufWriter::new(f)),
                Err(e) => reject_err = Some(format!("{}: {e}", rejects_path.display())),
            }
        }
        if let Some(f) = rejects_file.as_mut() {
            let _ = writeln!(
                f,
                "# {origin}:{}: {}\n# dn: {}\n",
                r.line,
                r.reason.replace('\n', " "),
                r.dn
            );
        }
    };
    let mut reporter = progress::Reporter::new(size);
    let mut on_progress = |p| reporter.update(p);
    let opts = import_options(&args, &resolved, &schema);
    let suffixes: Vec<String> = resolved
        .suffixes
        .iter()
        .map(|d| schema.normalize_dn(d))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("suffixes: {e}"))?;
    let result = pando_server::bulk::import(
        &store,
        &suffixes,
        input,
        &origin,
        &opts,
        &mut on_reject,
        &mut on_progress,
    );
    reporter.finish();
    let store_size = store.disk_size();
    store.close();
    if let Some(e) = reject_err {
        return Err(e);
    }
    // The error says what became of the store.
    let report = result.map_err(|e| e.to_string())?;
    if let Some(f) = rejects_file.as_mut() {
        f.flush()
            .map_err(|e| format!("{}: {e}", rejects_path.display()))?;
    }
    print_import_report(&report, &rejects_path, store_size);
    if report.member_of > 0 {
        eprintln!(
            "memberOf set on {} entries (the memberof overlay is configured)",
            report.member_of
        );
    }
    print_password_schemes(&report.password_schemes);
    Ok(if report.rejected > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// The import's settings from its arguments and the configuration.
fn import_options(
    args: &ImportArgs,
    resolved: &pando_config::Resolved,
    schema: &Schema,
) -> pando_server::bulk::ImportOptions {
    let defaults = pando_server::bulk::ImportOptions::default();
    pando_server::bulk::ImportOptions {
        continue_on_error: args.continue_on_error,
        commit_every: args.batch.max(1),
        memory: args.memory,
        threads: args.threads.unwrap_or(defaults.threads).max(1),
        allow_file_urls: args.allow_file_urls,
        // Entries imported without creatorsName are credited to the root DN,
        // or with none configured to the local administrator's ldapi identity.
        creator: match &resolved.root_dn {
            Some(d) => d.to_string(),
            None => pando_access::auth::peercred_dn(pando_access::PeerCred {
                // SAFETY: geteuid/getegid have no preconditions.
                uid: unsafe { libc::geteuid() },
                gid: unsafe { libc::getegid() },
            }),
        },
        server_id: resolved.config.replication.server_id,
        member_of: configured_memberof(resolved, schema),
        sample_file: args.file.clone().filter(|p| p.as_os_str() != "-"),
    }
}

/// The import's summary line on standard error.
fn print_import_report(
    report: &pando_server::bulk::ImportReport,
    rejects_path: &std::path::Path,
    store_size: u64,
) {
    eprintln!(
        "imported {} entries ({} rejected{}) in {:.1} s, {:.0} entries/s; {} MiB read ({}); {} index keys{}; store {} MiB{}",
        report.entries,
        report.rejected,
        if report.rejected > 0 { format!(", see {}", rejects_path.display()) } else { String::new() },
        report.secs,
        report.entries as f64 / report.secs.max(1e-9),
        report.bytes_read >> 20,
        report.input_format,
        report.index_keys,
        if report.spilled_runs > 0 { format!(" sorted in {} runs spilled to disk", report.spilled_runs) } else { String::new() },
        store_size >> 20,
        match report.dictionary {
            Some(id) => format!(", entries compressed with dictionary {id}"),
            None => String::new(),
        }
    );
}

/// The import's userPassword values by scheme, naming those no bind can
/// verify (their users cannot log in until their passwords are set again).
fn print_password_schemes(
    schemes: &std::collections::BTreeMap<String, pando_server::bulk::SchemeCount>,
) {
    for line in password_scheme_lines(schemes) {
        eprintln!("{line}");
    }
}

/// What `pando import` and `pando migrate --data` say of the userPassword
/// values they saw, by scheme (nothing when there were none).
pub(crate) fn password_scheme_lines(
    schemes: &std::collections::BTreeMap<String, pando_server::bulk::SchemeCount>,
) -> Vec<String> {
    if schemes.is_empty() {
        return Vec::new();
    }
    let list: Vec<String> = schemes
        .iter()
        .map(|(s, c)| format!("{s} {}", c.values))
        .collect();
    let mut out = vec![format!(
        "userPassword values by scheme: {}",
        list.join(", ")
    )];
    for (s, c) in schemes.iter().filter(|(_, c)| !c.verifiable) {
        out.push(format!(
            "warning: {} userPassword value(s) in {s} cannot be verified here (unknown scheme, or a cost above the caps in docs/operations.md): those users cannot bind until their passwords are set again",
            c.values
        ));
    }
    let legacy: u64 = schemes
        .values()
        .filter(|c| c.legacy)
        .map(|c| c.values)
        .sum();
    if legacy > 0 {
        out.push(format!(
            "note: {legacy} userPassword value(s) in weak or legacy schemes verify, and are rewritten in the configured scheme at each user's next bind ([passwords] upgrade_on_bind)"
        ));
    }
    out
}

fn salvage(args: SalvageArgs) -> Result<ExitCode, String> {
    use std::io::Write;
    let (resolved, _) = resolve(&args.store)?;
    let data_dir = &resolved.config.data_dir;
    let dir = pando_server::store_dir(data_dir);
    // A running server would be changing what is read.
    let _lock = pando_server::datadir::lock(data_dir)?;
    let report_path = args.report.clone().unwrap_or_else(|| {
        let mut p = args.output.clone().into_os_string();
        p.push(".report");
        PathBuf::from(p)
    });
    let f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&args.output)
            .map_err(|e| format!("{}: {e}", args.output.display()))?
    };
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let report = pando_store::salvage::salvage(&dir, &mut |e| {
        if e.placeholder {
            writeln!(
                w,
                "# placeholder: this entry was lost; what was read below it follows"
            )?;
        }
        let flat = e.attrs.iter().flat_map(|a| {
            a.values
                .iter()
                .map(move |v| (a.desc.as_str(), v.as_slice()))
        });
        pando_ldif::write_entry(&mut w, e.dn, flat, Some(76))
    })
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    w.flush()
        .and_then(|()| w.get_ref().sync_all())
        .map_err(|e| format!("{}: {e}", args.output.display()))?;
    let text = report.describe(&dir, &args.output);
    // Salvaged data holds password hashes: owner only.
    pando_store::write_private(&report_path, text.as_bytes())
        .map_err(|e| format!("{}: {e}", report_path.display()))?;
    let lost = report.damage.len() + report.unreadable.len() + report.orphans.len();
    eprintln!(
        "salvaged {} entries from {} to {}; {}",
        report.written,
        dir.display(),
        args.output.display(),
        if lost == 0 {
            "nothing was lost".to_string()
        } else {
            format!(
                "{} unreadable part(s), {} unreadable entries, {} entries without a DN: see {}",
                report.damage.len(),
                report.unreadable.len(),
                report.orphans.len(),
                report_path.display()
            )
        }
    );
    Ok(if lost == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn export(args: ExportArgs) -> Result<ExitCode, String> {
    let (resolved, schema) = resolve(&args.store)?;
    let opts = pando_server::store_options(&resolved);
    let (Some(as_of), Some(chain)) = (&args.as_of, &args.backup) else {
        let dir = pando_server::store_dir(&resolved.config.data_dir);
        return export_from(&args, &dir, schema, &opts);
    };
    let until = match as_of.contains('#') {
        true => restore_until(Some(as_of), None)?,
        false => restore_until(None, Some(as_of))?,
    };
    // The chain is restored up to that point into a private directory of
    // its own, exported from, and removed.
    let tmp = std::env::temp_dir().join(format!("pando-as-of.{}", std::process::id()));
    let built = pando_server::backup::chain::build(chain, &tmp, schema.clone(), &opts, &until);
    let r = built.and_then(|b| {
        eprintln!(
            "{} as of {}: {} entries from {} backup(s)",
            chain.display(),
            b.newest_csn.as_deref().unwrap_or("the full backup"),
            b.entries,
            b.applied_links
        );
        export_from(&args, &tmp, schema, &opts)
    });
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

/// Export the store in `dir` as `args` say.
fn export_from(
    args: &ExportArgs,
    dir: &std::path::Path,
    schema: Arc<Schema>,
    store_opts: &pando_store::StoreOptions,
) -> Result<ExitCode, String> {
    use std::io::Write;
    pando_store::preflight(dir, false, true).map_err(|e| format!("{}: {e}", dir.display()))?;
    let store = pando_store::Store::open_read_only(dir, schema, store_opts)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let opts = pando_server::bulk::ExportOptions {
        base: match &args.base {
            Some(b) => Some(pando_model::Dn::parse(b).map_err(|e| format!("--base '{b}': {e}"))?),
            None => None,
        },
        filter: match &args.filter {
            Some(f) => {
                Some(pando_proto::Filter::parse(f).map_err(|e| format!("--filter '{f}': {e}"))?)
            }
            None => None,
        },
        operational: args.operational,
        wrap: (args.wrap > 1).then_some(args.wrap),
    };
    let started = std::time::Instant::now();
    let n = match &args.output {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            let n = pando_server::bulk::export(&store, &mut w, &opts)?;
            w.flush().map_err(|e| format!("{}: {e}", p.display()))?;
            n
        }
        None => {
            let out = std::io::stdout();
            let mut w = std::io::BufWriter::with_capacity(1 << 20, out.lock());
            let n = pando_server::bulk::export(&store, &mut w, &opts)?;
            w.flush().map_err(|e| e.to_string())?;
            n
        }
    };
    store.close();
    eprintln!(
        "exported {n} entries in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The store of a stopped server, opened for writing: the data directory
/// locked (`stop_first`: what the lock error says to do), a store that a
/// failed import left incomplete refused.
fn open_stopped(
    resolved: &pando_config::Resolved,
    schema: &Arc<Schema>,
    stop_first: &str,
) -> Result<(pando_server::datadir::DirLock, pando_store::Store), String> {
    let data_dir = &resolved.config.data_dir;
    let lock = pando_server::datadir::lock(data_dir).map_err(|e| format!("{e}; {stop_first}"))?;
    let dir = pando_server::store_dir(data_dir);
    let store =
        pando_store::Store::open(&dir, schema.clone(), &pando_server::store_options(resolved))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    pando_server::bulk::check_complete(&store)?;
    Ok((lock, store))
}

fn memberof_rebuild(args: StoreArgs) -> Result<ExitCode, String> {
    let (resolved, schema) = resolve(&args)?;
    let (_lock, store) = open_stopped(&resolved, &schema, "stop the server first")?;
    let sid = resolved.config.replication.server_id;
    let csn = pando_store::clock::clock_for_store(&store, sid);
    let live = pando_server::build_server(resolved, schema, store.clone(), csn, None, None)
        .map_err(|e| e.to_string())?;
    let server = live.server();
    let admin = pando_access::Identity::authenticated(
        server.root_dn_norm.clone(),
        server.root_dn_norm.clone(),
        Default::default(),
    )
    .with_roles(true, false);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let changed = rt
        .block_on(pando_server::overlays::memberof::rebuild(&server, &admin))
        .map_err(|e| format!("{} ({:?})", e.message, e.code))?;
    drop(server);
    drop(live);
    store.sync().map_err(|e| e.to_string())?;
    store.close();
    eprintln!(
        "memberOf set on {changed} entries in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

fn index_rebuild(args: StoreArgs, attrs: Vec<String>) -> Result<ExitCode, String> {
    let (resolved, schema) = resolve(&args)?;
    for a in &attrs {
        let known = resolved
            .indexes
            .iter()
            .any(|i| i.attr.eq_ignore_ascii_case(a))
            || schema
                .attribute(a)
                .is_some_and(|t| resolved.indexes.iter().any(|i| t.has_name(&i.attr)));
        if !known {
            return Err(format!(
                "'{a}' has no index in the configuration ([indexes])"
            ));
        }
    }
    let (_lock, store) = open_stopped(&resolved, &schema, "stop the server first")?;
    let names: Vec<String> = attrs
        .iter()
        .map(|a| {
            schema
                .attribute(a)
                .map(|t| t.name().to_string())
                .unwrap_or_else(|| a.clone())
        })
        .collect();
    let started = std::time::Instant::now();
    let total = entry_count(&store)?;
    let mut reporter = progress::Reporter::new(None);
    let n = store
        .rebuild_indexes(&names, &mut |done| reporter.entries(done, total))
        .map_err(|e| e.to_string())?;
    reporter.finish();
    store.close();
    eprintln!(
        "rebuilt {} from {n} entries in {:.1} s",
        if names.is_empty() {
            "every index".to_string()
        } else {
            names.join(", ")
        },
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
