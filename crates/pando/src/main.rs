//! `pando`: the one binary. Subcommands: serve, passwd (more to come:
//! import, export, backup, restore, verify, index, gen, bench, stat).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use pando_model::Schema;
use pando_server::config::Config;

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
    /// Hash a password for `root_password_hash` (reads it from standard input).
    Passwd,
    /// Check that the store's databases agree with each other (server stopped or running).
    Verify(VerifyArgs),
    /// Copy the store to a new directory with a manifest, while the server runs or not.
    Backup(BackupArgs),
    /// Replace the store of a stopped server with a backup (checked first).
    Restore(RestoreArgs),
    /// Generate LDIF from a MakeLDIF template (built-in: example, telco).
    Gen(GenArgs),
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
}

#[derive(clap::Args)]
struct RestoreArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// A directory made by `pando backup`.
    src: PathBuf,
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
}

fn load_config(args: &StoreArgs) -> Result<Config, String> {
    let mut cfg = match &args.config {
        Some(p) => Config::load(p).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    if let Some(d) = &args.data_dir {
        // The default ldapi socket follows the data directory.
        cfg.data_dir = d.clone();
    }
    Ok(cfg)
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PANDO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},heed=warn")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Passwd => passwd(),
        Command::Verify(args) => verify(args),
        Command::Backup(args) => backup(args),
        Command::Restore(args) => restore(args),
        Command::Gen(args) => gen(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pando: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve_config(
    args: &ServeArgs,
    schema: &Schema,
) -> Result<pando_server::config::Resolved, String> {
    let mut cfg = load_config(&args.store)?;
    if !args.listen.is_empty() {
        cfg.listen = args.listen.clone();
    }
    if let Some(l) = &args.log_level {
        cfg.log_level = l.clone();
    }
    cfg.validate(schema).map_err(|e| e.to_string())
}

fn serve(args: ServeArgs) -> Result<ExitCode, String> {
    let schema = Arc::new(Schema::standard());
    let resolved = serve_config(&args, &schema)?;
    let demo = args.demo;
    let reload: Option<pando_server::Reloader> = if args.store.config.is_some() {
        let schema = schema.clone();
        Some(Arc::new(move || serve_config(&args, &schema)))
    } else {
        None
    };
    init_logging(&resolved.config.log_level);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pando-worker")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(pando_server::run(
        resolved,
        schema,
        pando_server::ServeOptions { demo, reload },
    ))
    .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}

fn passwd() -> Result<ExitCode, String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let clear = line.trim_end_matches(['\r', '\n']);
    if clear.is_empty() {
        return Err("no password on standard input".into());
    }
    println!(
        "{}",
        pando_server::password::hash_password(clear.as_bytes())
    );
    Ok(ExitCode::SUCCESS)
}

fn resolve(args: &StoreArgs) -> Result<(pando_server::config::Resolved, Arc<Schema>), String> {
    let cfg = load_config(args)?;
    let schema = Arc::new(Schema::standard());
    let resolved = cfg.validate(&schema).map_err(|e| e.to_string())?;
    Ok((resolved, schema))
}

fn verify(args: VerifyArgs) -> Result<ExitCode, String> {
    let (resolved, schema) = resolve(&args.store)?;
    let data_dir = &resolved.config.data_dir;
    let dir = pando_server::store_dir(data_dir);
    let opts = pando_server::store_options(&resolved);
    let store = if args.repair_indexes {
        // Rebuilding writes: the server must not be running.
        let _lock = pando_server::datadir::lock(data_dir)?;
        let store = pando_store::Store::open(&dir, schema, &opts)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let started = std::time::Instant::now();
        let n = store.rebuild_indexes(&[]).map_err(|e| e.to_string())?;
        println!(
            "rebuilt every index from {n} entries in {:.2} s",
            started.elapsed().as_secs_f64()
        );
        store
    } else {
        pando_store::Store::open_read_only(&dir, schema, &opts)
            .map_err(|e| format!("{}: {e}", dir.display()))?
    };
    let rtxn = store.read().map_err(|e| e.to_string())?;
    let view = rtxn.view();
    let count = view.entry_count().map_err(|e| e.to_string())?;
    let problems = view.verify().map_err(|e| e.to_string())?;
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

fn backup(args: BackupArgs) -> Result<ExitCode, String> {
    let (resolved, schema) = resolve(&args.store)?;
    let dir = pando_server::store_dir(&resolved.config.data_dir);
    let r = pando_server::backup::backup(
        &dir,
        &args.dest,
        schema,
        &pando_server::store_options(&resolved),
    )?;
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
    Ok(ExitCode::SUCCESS)
}

fn restore(args: RestoreArgs) -> Result<ExitCode, String> {
    let cfg = load_config(&args.store)?;
    let data_dir = cfg.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let _lock = pando_server::datadir::lock(&data_dir)
        .map_err(|e| format!("{e}; stop the server before restoring"))?;
    let m = pando_server::backup::restore(&args.src, &data_dir)?;
    println!(
        "restored {} entries (backup of {}, suffixes {}) into {}",
        m.entries,
        m.created,
        m.suffixes.join("; "),
        pando_server::store_dir(&data_dir).display()
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
