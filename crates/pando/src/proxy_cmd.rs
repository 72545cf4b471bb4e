//! `pando proxy`: the proxy's configuration from its file (`[proxy]`) and
//! the command line, then `pando_proxy::run`.

use std::path::PathBuf;
use std::process::ExitCode;

use pando_proxy::{ProxyFile, UpstreamConfig};

#[derive(clap::Args)]
pub struct ProxyArgs {
    /// A file with a `[proxy]` section (docs/proxy.md); the options below
    /// add to it or replace its values.
    #[arg(short = 'c', long)]
    config: Option<PathBuf>,
    /// Listen on this URL (ldap://host:port or ldapi:///path); repeat for
    /// several. Replaces the file's list.
    #[arg(long)]
    listen: Vec<String>,
    /// A server taking writes; the first healthy one in order is the active
    /// one. Repeat for a mirror-mode pair.
    #[arg(long)]
    provider: Vec<String>,
    /// A server for reads only. Repeatable.
    #[arg(long)]
    replica: Vec<String>,
    /// Where contextCSN is read for the lag check.
    #[arg(long)]
    base: Option<String>,
    /// Replicas behind the active provider by more than this leave the
    /// read rotation (needs --base).
    #[arg(long)]
    max_lag: Option<u64>,
    /// Seconds between health checks.
    #[arg(long)]
    health_secs: Option<u64>,
    /// Every message decoded, one line each, to this file ("-": standard output).
    #[arg(long)]
    decode: Option<PathBuf>,
    /// The decode log as JSON lines.
    #[arg(long)]
    json: bool,
    /// Record every client request to this file, replayable with
    /// `pando bench --replay FILE` (simple binds' passwords withheld).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Read LDAP out of this packet capture (pcap or pcapng, e.g. from
    /// tcpdump) instead of relaying: printed decoded (--decode, default
    /// standard output) and recorded (--record); then exit.
    #[arg(long)]
    read_capture: Option<PathBuf>,
    /// With --read-capture: the server's port.
    #[arg(long, default_value_t = 389)]
    ldap_port: u16,
    /// Serve the live dashboard at http://ADDR/dashboard (a loopback
    /// address, e.g. 127.0.0.1:9390).
    #[arg(long, value_name = "ADDR")]
    dashboard: Option<String>,
    /// error, warn, info, debug or trace.
    #[arg(long)]
    log_level: Option<String>,
}

pub fn run(args: ProxyArgs) -> Result<ExitCode, String> {
    let mut file = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            toml::from_str::<ProxyFile>(&text).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => ProxyFile::default(),
    };
    let cfg = &mut file.proxy;
    if !args.listen.is_empty() {
        cfg.listen = args.listen.clone();
    }
    let upstream = |url: &String, role: &str| UpstreamConfig {
        url: url.clone(),
        role: role.into(),
    };
    cfg.upstream
        .extend(args.provider.iter().map(|u| upstream(u, "provider")));
    cfg.upstream
        .extend(args.replica.iter().map(|u| upstream(u, "replica")));
    if let Some(b) = &args.base {
        cfg.base = b.clone();
    }
    if let Some(l) = args.max_lag {
        cfg.max_lag_secs = l;
    }
    if let Some(h) = args.health_secs {
        cfg.health_secs = h;
    }
    if let Some(d) = &args.decode {
        cfg.decode_log = Some(d.clone());
    }
    if args.json {
        cfg.decode_format = "json".into();
    }
    if let Some(r) = &args.record {
        cfg.record = Some(r.clone());
    }
    if let Some(a) = &args.dashboard {
        cfg.dashboard_listen = Some(a.clone());
    }
    if let Some(path) = &args.read_capture {
        if cfg.decode_log.is_none() {
            cfg.decode_log = Some(PathBuf::from("-"));
        }
        let s = pando_proxy::read_capture(path, args.ldap_port, cfg)?;
        eprintln!(
            "{}: {} TCP segments ({} other packets skipped), {} connections to port {}, {} requests, {} responses, {} bytes not LDAP, {} gaps",
            path.display(),
            s.segments,
            s.skipped_packets,
            s.connections,
            args.ldap_port,
            s.requests,
            s.responses,
            s.garbage,
            s.gaps
        );
        return Ok(ExitCode::SUCCESS);
    }
    cfg.validate()?;
    let level = args
        .log_level
        .clone()
        .or(file.log_level.clone())
        .unwrap_or_else(|| "info".into());
    let _ = crate::init_logging(&level);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pando-proxy")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(pando_proxy::run(file.proxy))?;
    Ok(ExitCode::SUCCESS)
}
