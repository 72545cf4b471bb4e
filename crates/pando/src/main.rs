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
    Verify(StoreArgs),
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
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pando: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> Result<ExitCode, String> {
    let mut cfg = load_config(&args.store)?;
    if !args.listen.is_empty() {
        cfg.listen = args.listen.clone();
    }
    if let Some(l) = &args.log_level {
        cfg.log_level = l.clone();
    }
    let schema = Arc::new(Schema::standard());
    let resolved = cfg.validate(&schema).map_err(|e| e.to_string())?;
    init_logging(&resolved.config.log_level);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pando-worker")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(pando_server::run(
        resolved,
        schema,
        pando_server::ServeOptions { demo: args.demo },
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

fn verify(args: StoreArgs) -> Result<ExitCode, String> {
    let cfg = load_config(&args)?;
    let schema = Arc::new(Schema::standard());
    let resolved = cfg.validate(&schema).map_err(|e| e.to_string())?;
    let dir = pando_server::store_dir(&resolved.config.data_dir);
    if !dir.join("data.mdb").exists() {
        return Err(format!("no store in {}", dir.display()));
    }
    let store = pando_store::Store::open(&dir, schema, &pando_server::store_options(&resolved))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
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
