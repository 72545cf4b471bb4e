//! Command-line arguments and their validation into a [`Plan`]: everything
//! the run needs, checked up front so that a mistake is reported before any
//! connection is opened.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use pando_proto::{
    AddRequest, BindAuth, BindRequest, Change, DerefAliases, Filter, ModOp, ModifyRequest,
    PartialAttribute, ProtocolOp, Scope, SearchRequest,
};

use crate::keys::KeySpace;
use crate::template::{check_no_markers, MessageTemplate, TextTemplate, COUNTER, DN, KEY};

/// `pando bench`: an LDAP load generator. A later option overrides an
/// earlier one (scripts can append to a base command line).
#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
pub struct BenchArgs {
    /// Server: ldap://HOST:PORT or ldapi://PATH (percent-encoded socket path).
    #[arg(long, short = 'H', default_value = "ldap://127.0.0.1:3389")]
    pub url: String,
    /// Permit a server that is not on this machine (by default only loopback
    /// addresses are accepted).
    #[arg(long)]
    pub allow_remote: bool,
    /// DN the searching and writing connections bind as (default: anonymous).
    #[arg(long, short = 'D')]
    pub bind_dn: Option<String>,
    /// Password for --bind-dn.
    #[arg(long, short = 'w', conflicts_with = "bind_pw_file")]
    pub bind_pw: Option<String>,
    /// File holding the password for --bind-dn (a trailing newline is ignored).
    #[arg(long, short = 'y')]
    pub bind_pw_file: Option<PathBuf>,
    /// search: searchrate; auth: search by the filter, then bind as the DN
    /// found (SLAMD AuthRate); bind: bind as --dn-template; modify: replace
    /// --modify-attr; add: add uid=bench.N entries; delete: delete them;
    /// mixed: the ratio given by --mix.
    #[arg(long, value_enum)]
    pub workload: Option<Workload>,
    /// Search base; may contain %d (e.g. a base-scope read of one user).
    #[arg(long, short = 'b', default_value = "ou=People,dc=example,dc=com")]
    pub base: String,
    /// Search filter template: %d is the key, %% a percent sign.
    #[arg(long, short = 'f', default_value = "(uid=user.%d)")]
    pub filter: String,
    #[arg(long, short = 's', value_enum, default_value_t = ScopeArg::Sub)]
    pub scope: ScopeArg,
    /// Attributes to return, comma-separated (default: all user attributes;
    /// 1.1 for none).
    #[arg(long, value_delimiter = ',')]
    pub attrs: Vec<String>,
    /// Entry DN template for bind and modify (default uid=user.%d,<base>) and
    /// for add and delete (default uid=bench.%d,<base>).
    #[arg(long)]
    pub dn_template: Option<String>,
    /// Password of the users for the bind and auth workloads.
    #[arg(long, default_value = "password")]
    pub password: String,
    /// Keys, inclusive: %d takes values from this range.
    #[arg(long, default_value = "0-99999")]
    pub range: String,
    /// Keys in order (shared by all connections) instead of uniformly random.
    #[arg(long)]
    pub sequential: bool,
    /// Hot set REQ:KEYS: REQ% of the requests go to the first KEYS% of the
    /// range, e.g. 80:20.
    #[arg(long)]
    pub hot: Option<String>,
    /// Operation ratio for the mixed workload, e.g. search=80,modify=10,auth=10
    /// (search, auth, bind, modify).
    #[arg(long)]
    pub mix: Option<String>,
    /// Attribute the modify workload replaces.
    #[arg(long, default_value = "description")]
    pub modify_attr: String,
    /// The add workload's entries carry `userPassword: PW`, in clear text as
    /// a provisioning tool sends it (the server may hash it).
    #[arg(long)]
    pub add_password: Option<String>,
    /// Concurrent clients (connections; auth and bind use a second one each).
    #[arg(long, short = 'c', default_value_t = 16)]
    pub connections: usize,
    /// Requests outstanding per connection (pipelining). Binds are never
    /// pipelined: the bind and auth workloads run at depth 1.
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
    /// Load generator threads, each driving its share of the connections.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Measured time, e.g. 10s, 500ms, 2m (default 10s unless --count is given).
    #[arg(long)]
    pub duration: Option<String>,
    /// Stop after this many measured operations (the run still ends after
    /// --duration if given, else after 10 minutes).
    #[arg(long)]
    pub count: Option<u64>,
    /// Unmeasured time before measuring (add and delete use up keys during
    /// it too; give 0s to measure every key of the range).
    #[arg(long, default_value = "2s")]
    pub warmup: String,
    /// Open loop: issue this many requests per second in total on a fixed
    /// schedule, measuring latency from each request's scheduled time.
    /// Without it the run is closed-loop (as fast as the server answers).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Progress line period.
    #[arg(long, default_value = "1s")]
    pub interval: String,
    /// Print one JSON object at the end instead of text.
    #[arg(long)]
    pub json: bool,
    /// Server name for the RESULT line (default: the URL).
    #[arg(long)]
    pub label: Option<String>,
    /// Random seed for the keys.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Report this process's CPU use over the measured time (the server's).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Play a record made by `pando proxy --record FILE` instead of a
    /// workload: each recorded connection's requests in order, at the
    /// recorded pace times --speed (withheld bind passwords from -w/-y).
    #[arg(long)]
    pub replay: Option<PathBuf>,
    /// With --replay: 1 the recorded pace, N times faster, 0 as fast as
    /// the server answers.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    Search,
    Auth,
    Bind,
    Modify,
    Add,
    Delete,
    Mixed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScopeArg {
    Base,
    One,
    Sub,
}

/// One kind of operation a run performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Search,
    Auth,
    Bind,
    Modify,
    Add,
    Delete,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Search => "search",
            OpKind::Auth => "auth",
            OpKind::Bind => "bind",
            OpKind::Modify => "modify",
            OpKind::Add => "add",
            OpKind::Delete => "delete",
        }
    }

    fn parse(s: &str) -> Option<OpKind> {
        Some(match s {
            "search" => OpKind::Search,
            "auth" => OpKind::Auth,
            "bind" => OpKind::Bind,
            "modify" => OpKind::Modify,
            "add" => OpKind::Add,
            "delete" => OpKind::Delete,
            _ => return None,
        })
    }

    /// Whether it binds on the second (bind) connection.
    pub fn binds(self) -> bool {
        matches!(self, OpKind::Auth | OpKind::Bind)
    }
}

/// Where the server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// A DN and password. Debug is written by hand so the password never
/// reaches a log.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub dn: String,
    pub password: Vec<u8>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("dn", &self.dn)
            .field("password", &format_args!("<redacted>"))
            .finish()
    }
}

/// The compiled requests of a run (only those its operations use).
#[derive(Debug, Default)]
pub struct Requests {
    pub search: Option<MessageTemplate>,
    /// The search step of auth: same base, scope and filter, attributes 1.1.
    pub auth_search: Option<MessageTemplate>,
    /// The bind step of auth: the DN found ([`DN`] marker).
    pub auth_bind: Option<MessageTemplate>,
    pub bind: Option<MessageTemplate>,
    pub modify: Option<MessageTemplate>,
    pub add: Option<MessageTemplate>,
    pub delete: Option<MessageTemplate>,
}

/// An operation of the run and its share of the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpShare {
    pub kind: OpKind,
    /// Cumulative weight: the op is chosen when a draw below the total
    /// weight is below this and not below the previous op's.
    pub upto: u64,
}

/// A validated run.
#[derive(Debug)]
pub struct Plan {
    pub url: String,
    pub target: Target,
    pub label: String,
    pub bind: Option<Credentials>,
    pub workload: Workload,
    pub ops: Vec<OpShare>,
    pub requests: Requests,
    pub keys: KeySpace,
    pub connections: usize,
    pub depth: usize,
    pub threads: usize,
    pub warmup: Duration,
    /// Measured time (None: until --count operations are done).
    pub duration: Option<Duration>,
    pub count: Option<u64>,
    /// With --count alone: no new request after warm-up + this.
    pub time_cap: Duration,
    pub rate: Option<f64>,
    pub interval: Duration,
    pub json: bool,
    pub seed: u64,
    pub server_pid: Option<u32>,
    /// Human-readable notes about adjusted settings (printed before the run).
    pub notes: Vec<String>,
}

impl Plan {
    pub fn uses_main(&self) -> bool {
        self.ops.iter().any(|o| o.kind != OpKind::Bind)
    }

    pub fn uses_bind_conn(&self) -> bool {
        self.ops.iter().any(|o| o.kind.binds())
    }

    pub fn total_weight(&self) -> u64 {
        self.ops.last().map_or(0, |o| o.upto)
    }
}

/// Time when --count is given without --duration.
const DEFAULT_COUNT_CAP: Duration = Duration::from_secs(600);
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// Parses 10s, 500ms, 2m, 1h, 1.5s, or a bare number of seconds.
pub fn parse_duration(what: &str, s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => f64::NAN,
    };
    let v: f64 = num.parse().unwrap_or(f64::NAN);
    let secs = v * scale;
    if !(0.0..=86_400.0 * 365.0).contains(&secs) {
        return Err(format!(
            "{what} '{s}': expected a duration such as 10s, 500ms or 2m"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `LO-HI`.
pub fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--range '{s}': expected FIRST-LAST, e.g. 0-99999");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let lo = a.trim().parse::<u64>().map_err(|_| bad())?;
    let hi = b.trim().parse::<u64>().map_err(|_| bad())?;
    Ok((lo, hi))
}

/// Parses `REQ:KEYS`, e.g. `80:20`.
pub fn parse_hot(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--hot '{s}': expected REQUESTS%:KEYS%, e.g. 80:20");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    Ok((
        a.trim().trim_end_matches('%').parse().map_err(|_| bad())?,
        b.trim().trim_end_matches('%').parse().map_err(|_| bad())?,
    ))
}

/// Parses `search=80,modify=10,auth=10` into cumulative shares.
pub fn parse_mix(s: &str) -> Result<Vec<OpShare>, String> {
    let mut out: Vec<OpShare> = Vec::new();
    let mut total = 0u64;
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, w) = item
            .split_once('=')
            .ok_or_else(|| format!("--mix '{s}': '{item}' is not NAME=WEIGHT"))?;
        let kind = OpKind::parse(name.trim()).ok_or_else(|| {
            format!("--mix '{s}': unknown operation '{name}' (search, auth, bind, modify)")
        })?;
        if matches!(kind, OpKind::Add | OpKind::Delete) {
            return Err(format!(
                "--mix '{s}': add and delete are separate runs (--workload add, then --workload delete), \
                 so that every delete has an entry to remove"
            ));
        }
        let w: u64 = w
            .trim()
            .parse()
            .map_err(|_| format!("--mix '{s}': weight '{w}' of {name} is not a whole number"))?;
        if w == 0 {
            continue;
        }
        if out.iter().any(|o| o.kind == kind) {
            return Err(format!("--mix '{s}': {name} appears twice"));
        }
        total += w;
        out.push(OpShare { kind, upto: total });
    }
    if out.is_empty() {
        return Err(format!("--mix '{s}': no operation with a weight above 0"));
    }
    Ok(out)
}

/// Parses `ldap://HOST[:PORT][/]` (port 389 by default, empty host =
/// 127.0.0.1) or `ldapi://PATH`.
pub fn parse_url(url: &str, allow_remote: bool) -> Result<Target, String> {
    let lower = url.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("ldapi://").map(|_| &url[8..]) {
        let path = pando_proto::url::percent_decode_str(rest.trim_end_matches('/'))
            .map_err(|e| format!("--url {url}: {e}"))?;
        if path.is_empty() {
            return Err(format!(
                "--url {url}: ldapi:// needs the socket path, percent-encoded, e.g. ldapi://%2Fvar%2Frun%2Fldapi"
            ));
        }
        return Ok(Target::Unix(PathBuf::from(path)));
    }
    if lower.starts_with("ldaps://") {
        return Err(format!(
            "--url {url}: ldaps:// (TLS) is not supported by pando bench; use ldap:// or ldapi://"
        ));
    }
    let Some(rest) = lower.strip_prefix("ldap://").map(|_| &url[7..]) else {
        return Err(format!(
            "--url {url}: expected ldap://HOST:PORT or ldapi://PATH"
        ));
    };
    let (hostport, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if !tail.is_empty() {
        return Err(format!(
            "--url {url}: DN and options in the URL are not used; give --base, --filter and --attrs instead"
        ));
    }
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("--url {url}: unclosed '[' in the host"))?;
        (h, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    let port: u16 = match port {
        None => 389,
        Some(p) => p
            .parse()
            .map_err(|_| format!("--url {url}: bad port '{p}'"))?,
    };
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("--url {url}: cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("--url {url}: {host} has no address"))?;
    if !allow_remote && !addr.ip().is_loopback() {
        return Err(format!(
            "--url {url}: {} is not a loopback address; pass --allow-remote to load a server on another machine",
            addr.ip()
        ));
    }
    Ok(Target::Tcp(addr))
}

fn pa(name: &str, values: &[&str]) -> PartialAttribute {
    PartialAttribute {
        name: name.into(),
        values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
    }
}

/// The value of the first RDN if it is `uid=VALUE` (VALUE without escapes).
fn first_uid(marked_dn: &str) -> Option<&str> {
    let (rdn, _) = marked_dn.split_once(',')?;
    let (attr, value) = rdn.split_once('=')?;
    (attr.trim().eq_ignore_ascii_case("uid") && !value.contains(['\\', '+']) && !value.is_empty())
        .then_some(value)
}

/// The password given (`--bind-pw`, or `--bind-pw-file` with its
/// trailing newline dropped), if any.
pub(crate) fn given_password(a: &BenchArgs) -> Result<Option<Vec<u8>>, String> {
    if let Some(pw) = &a.bind_pw {
        return Ok(Some(pw.as_bytes().to_vec()));
    }
    let Some(f) = &a.bind_pw_file else {
        return Ok(None);
    };
    let mut text = std::fs::read(f).map_err(|e| format!("--bind-pw-file {}: {e}", f.display()))?;
    while matches!(text.last(), Some(b'\n' | b'\r')) {
        text.pop();
    }
    Ok(Some(text))
}

/// The identity the load binds as (`--bind-dn` with `--bind-pw` or
/// `--bind-pw-file`), if any.
fn credentials(a: &BenchArgs) -> Result<Option<Credentials>, String> {
    match (&a.bind_dn, given_password(a)?) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err("--bind-pw/--bind-pw-file need --bind-dn".into()),
        (Some(_), None) => Err("--bind-dn needs --bind-pw or --bind-pw-file".into()),
        (Some(dn), Some(password)) => Ok(Some(Credentials {
            dn: dn.clone(),
            password,
        })),
    }
}

/// The workload (`--workload`, `--mix`) and the operations it runs with
/// their shares.
fn workload_ops(a: &BenchArgs) -> Result<(Workload, Vec<OpShare>), String> {
    let workload = match (a.workload, &a.mix) {
        (None, None) => Workload::Search,
        (None, Some(_)) | (Some(Workload::Mixed), Some(_)) => Workload::Mixed,
        (Some(Workload::Mixed), None) => {
            return Err(
                "--workload mixed needs --mix, e.g. --mix search=80,modify=10,auth=10".into(),
            )
        }
        (Some(w), Some(_)) => {
            return Err(format!(
                "--mix only goes with --workload mixed (not {})",
                w.to_possible_value()
                    .map_or_else(String::new, |v| v.get_name().to_string())
            ))
        }
        (Some(w), None) => w,
    };
    let ops = match workload {
        Workload::Mixed => parse_mix(a.mix.as_deref().unwrap_or_default())?,
        w => vec![OpShare {
            kind: match w {
                Workload::Search => OpKind::Search,
                Workload::Auth => OpKind::Auth,
                Workload::Bind => OpKind::Bind,
                Workload::Modify => OpKind::Modify,
                Workload::Add => OpKind::Add,
                Workload::Delete => OpKind::Delete,
                Workload::Mixed => unreachable!("handled above"),
            },
            upto: 1,
        }],
    };
    Ok((workload, ops))
}

/// Warm-up, reporting interval, duration (None: until `--count`), and
/// the longest the run may take.
fn timing(a: &BenchArgs) -> Result<(Duration, Duration, Option<Duration>, Duration), String> {
    let warmup = parse_duration("--warmup", &a.warmup)?;
    let interval = parse_duration("--interval", &a.interval)?;
    if interval < Duration::from_millis(10) {
        return Err(format!("--interval {}: must be at least 10ms", a.interval));
    }
    let duration = a
        .duration
        .as_deref()
        .map(|d| parse_duration("--duration", d))
        .transpose()?;
    if duration == Some(Duration::ZERO) {
        return Err("--duration must be above 0".into());
    }
    if a.count == Some(0) {
        return Err("--count must be at least 1".into());
    }
    let (duration, time_cap) = match (duration, a.count) {
        (Some(d), _) => (Some(d), d),
        (None, Some(_)) => (None, DEFAULT_COUNT_CAP),
        (None, None) => (Some(DEFAULT_DURATION), DEFAULT_DURATION),
    };
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(format!(
                "--rate {r}: must be a number of requests per second above 0"
            ));
        }
    }
    Ok((warmup, interval, duration, time_cap))
}

/// The request templates each operation of the workload sends (`has`:
/// whether the workload runs an operation; `lo`: the first key, to check
/// `--filter` on).
fn requests(
    a: &BenchArgs,
    has: &dyn Fn(OpKind) -> bool,
    writes_once: bool,
    lo: u64,
) -> Result<Requests, String> {
    let base = TextTemplate::parse("--base", &a.base)?;
    let filter = TextTemplate::parse("--filter", &a.filter)?;
    let sample_filter = filter.render(lo);
    Filter::parse(&sample_filter).map_err(|e| {
        format!(
            "--filter '{}' (for key {lo}: '{sample_filter}'): {e}",
            a.filter
        )
    })?;
    let marked_filter =
        Filter::parse(filter.marked()).map_err(|e| format!("--filter '{}': {e}", a.filter))?;
    for at in &a.attrs {
        check_no_markers("--attrs", at)?;
        if at.is_empty() || at.contains(char::is_whitespace) {
            return Err(format!("--attrs: '{at}' is not an attribute name"));
        }
    }
    let scope = match a.scope {
        ScopeArg::Base => Scope::Base,
        ScopeArg::One => Scope::One,
        ScopeArg::Sub => Scope::Sub,
    };
    let search = |attrs: Vec<String>| {
        MessageTemplate::compile(ProtocolOp::SearchRequest(SearchRequest {
            base: base.marked().to_string(),
            scope,
            deref: DerefAliases::Never,
            size_limit: 0,
            time_limit: 0,
            types_only: false,
            filter: marked_filter.clone(),
            attrs,
        }))
    };
    check_no_markers("--password", &a.password)?;
    if let Some(pw) = &a.add_password {
        check_no_markers("--add-password", pw)?;
    }
    check_no_markers("--modify-attr", &a.modify_attr)?;
    let user_password = a.password.as_bytes().to_vec();
    let dn_default = if writes_once {
        format!("uid=bench.%d,{}", a.base.replace('%', "%%"))
    } else {
        format!("uid=user.%d,{}", a.base.replace('%', "%%"))
    };
    let dn = TextTemplate::parse(
        "--dn-template",
        a.dn_template.as_deref().unwrap_or(&dn_default),
    )?;
    if writes_once && dn.key_count() == 0 {
        return Err(format!(
            "--dn-template '{}': add and delete need %d in the DN, one entry per key",
            a.dn_template.as_deref().unwrap_or(&dn_default)
        ));
    }

    let mut requests = Requests::default();
    if has(OpKind::Search) {
        requests.search = Some(search(a.attrs.clone())?);
    }
    if has(OpKind::Auth) {
        requests.auth_search = Some(search(vec!["1.1".into()])?);
        requests.auth_bind = Some(MessageTemplate::compile(ProtocolOp::BindRequest(
            BindRequest {
                version: 3,
                name: DN.to_string(),
                auth: BindAuth::Simple(user_password.clone()),
            },
        ))?);
    }
    if has(OpKind::Bind) {
        requests.bind = Some(MessageTemplate::compile(ProtocolOp::BindRequest(
            BindRequest {
                version: 3,
                name: dn.marked().to_string(),
                auth: BindAuth::Simple(user_password.clone()),
            },
        ))?);
    }
    write_requests(a, &dn, &dn_default, has, &mut requests)?;
    Ok(requests)
}

/// The modify, add and delete templates, aimed at the entries `dn` names
/// (`dn_default` when `--dn-template` is not given, for messages).
fn write_requests(
    a: &BenchArgs,
    dn: &TextTemplate,
    dn_default: &str,
    has: &dyn Fn(OpKind) -> bool,
    requests: &mut Requests,
) -> Result<(), String> {
    if has(OpKind::Modify) {
        if a.modify_attr.is_empty() || a.modify_attr.contains(char::is_whitespace) {
            return Err(format!(
                "--modify-attr '{}' is not an attribute name",
                a.modify_attr
            ));
        }
        requests.modify = Some(MessageTemplate::compile(ProtocolOp::ModifyRequest(
            ModifyRequest {
                dn: dn.marked().to_string(),
                changes: vec![Change {
                    op: ModOp::Replace,
                    attr: pa(
                        &a.modify_attr,
                        &[&format!("modified by pando bench {COUNTER}")],
                    ),
                }],
            },
        ))?);
    }
    if has(OpKind::Add) {
        let uid = first_uid(dn.marked()).ok_or_else(|| {
            format!(
                "--dn-template '{}': add needs a DN whose first RDN is uid=VALUE, e.g. uid=bench.%d,{}",
                a.dn_template.as_deref().unwrap_or(dn_default),
                a.base
            )
        })?;
        let mut attrs = vec![
            pa(
                "objectClass",
                &["top", "person", "organizationalPerson", "inetOrgPerson"],
            ),
            pa("uid", &[uid]),
            pa("cn", &[&format!("Bench {KEY}")]),
            pa("sn", &["Bench"]),
        ];
        if let Some(pw) = &a.add_password {
            attrs.push(pa("userPassword", &[pw]));
        }
        requests.add = Some(MessageTemplate::compile(ProtocolOp::AddRequest(
            AddRequest {
                dn: dn.marked().to_string(),
                attrs,
            },
        ))?);
    }
    if has(OpKind::Delete) {
        requests.delete = Some(MessageTemplate::compile(ProtocolOp::DelRequest(
            dn.marked().to_string(),
        ))?);
    }
    Ok(())
}

impl Plan {
    pub fn from_args(a: BenchArgs) -> Result<Plan, String> {
        let target = parse_url(&a.url, a.allow_remote)?;
        let bind = credentials(&a)?;

        let (workload, ops) = workload_ops(&a)?;
        let has = |k: OpKind| ops.iter().any(|o| o.kind == k);
        let writes_once = has(OpKind::Add) || has(OpKind::Delete);

        let (lo, hi) = parse_range(&a.range)?;
        let hot = a.hot.as_deref().map(parse_hot).transpose()?;
        if writes_once && hot.is_some() {
            return Err(
                "--hot does not apply to add and delete, which visit each key of --range once"
                    .into(),
            );
        }
        let keys = KeySpace::new(lo, hi, a.sequential || writes_once, hot)?;

        let mut notes = Vec::new();
        if a.connections == 0 || a.connections > 100_000 {
            return Err(format!(
                "--connections {}: must be 1 to 100000",
                a.connections
            ));
        }
        if a.depth == 0 || a.depth > 65_536 {
            return Err(format!("--depth {}: must be 1 to 65536", a.depth));
        }
        let mut depth = a.depth;
        if depth > 1 && ops.iter().all(|o| o.kind.binds()) {
            notes.push(format!(
                "--depth {depth} ignored: binds are not pipelined, so {} runs at depth 1",
                ops.iter()
                    .map(|o| o.kind.name())
                    .collect::<Vec<_>>()
                    .join("/")
            ));
            depth = 1;
        }
        if a.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        let threads = a.threads.min(a.connections);

        let (warmup, interval, duration, time_cap) = timing(&a)?;

        let requests = requests(&a, &has, writes_once, lo)?;

        Ok(Plan {
            label: a.label.clone().unwrap_or_else(|| a.url.clone()),
            url: a.url,
            target,
            bind,
            workload,
            ops,
            requests,
            keys,
            connections: a.connections,
            depth,
            threads,
            warmup,
            duration,
            count: a.count,
            time_cap,
            rate: a.rate,
            interval,
            json: a.json,
            seed: a.seed,
            server_pid: a.server_pid,
            notes,
        })
    }

    /// The workload's name in output ("search", "mixed", ...).
    pub fn workload_name(&self) -> &'static str {
        match self.workload {
            Workload::Search => "search",
            Workload::Auth => "auth",
            Workload::Bind => "bind",
            Workload::Modify => "modify",
            Workload::Add => "add",
            Workload::Delete => "delete",
            Workload::Mixed => "mixed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let mut v = vec!["bench"];
        v.extend_from_slice(args);
        Plan::from_args(Cli::try_parse_from(v).map_err(|e| e.to_string())?.args)
    }

    #[test]
    fn defaults() {
        let p = plan(&[]).unwrap();
        assert_eq!(p.workload, Workload::Search);
        assert_eq!(p.target, Target::Tcp("127.0.0.1:3389".parse().unwrap()));
        assert_eq!((p.connections, p.depth, p.threads), (16, 1, 1));
        assert_eq!(p.duration, Some(Duration::from_secs(10)));
        assert_eq!(p.warmup, Duration::from_secs(2));
        assert_eq!((p.keys.lo, p.keys.n), (0, 100_000));
        assert!(p.requests.search.is_some() && p.requests.modify.is_none());
        assert!(p.uses_main() && !p.uses_bind_conn());
    }

    #[test]
    fn later_options_win() {
        let p = plan(&[
            "--range", "0-9", "--range", "5-6", "--attrs", "cn", "--attrs", "mail",
        ])
        .unwrap();
        assert_eq!((p.keys.lo, p.keys.n), (5, 2));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("d", "10s").unwrap(), Duration::from_secs(10));
        assert_eq!(
            parse_duration("d", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("d", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(
            parse_duration("d", "1.5").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("d", "1h").unwrap(),
            Duration::from_secs(3600)
        );
        let e = parse_duration("--duration", "10 parsecs").unwrap_err();
        assert!(e.contains("--duration '10 parsecs'"), "{e}");
        assert!(parse_duration("d", "").is_err());
        assert!(parse_duration("d", "-1s").is_err());
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("ldap://127.0.0.1:3890/", false).unwrap(),
            Target::Tcp("127.0.0.1:3890".parse().unwrap())
        );
        assert_eq!(
            parse_url("ldap://[::1]", false).unwrap(),
            Target::Tcp("[::1]:389".parse().unwrap())
        );
        assert_eq!(
            parse_url("LDAP://", false).unwrap(),
            Target::Tcp("127.0.0.1:389".parse().unwrap())
        );
        assert_eq!(
            parse_url("ldapi://%2Ftmp%2Fpando%2Fldapi", false).unwrap(),
            Target::Unix("/tmp/pando/ldapi".into())
        );
        for (u, want) in [
            ("http://x", "expected ldap://"),
            ("ldaps://127.0.0.1", "TLS"),
            ("ldap://127.0.0.1:99999", "bad port"),
            ("ldap://127.0.0.1/dc=x?cn", "--base"),
            ("ldap://10.1.2.3:389", "not a loopback"),
            ("ldapi://", "socket path"),
        ] {
            let e = parse_url(u, false).unwrap_err();
            assert!(e.contains(want), "{u}: {e}");
        }
        assert!(parse_url("ldap://10.1.2.3:389", true).is_ok());
    }

    #[test]
    fn ranges_hot_and_mix() {
        assert_eq!(parse_range("5-10").unwrap(), (5, 10));
        assert!(parse_range("10").unwrap_err().contains("FIRST-LAST"));
        assert_eq!(parse_hot("80:20").unwrap(), (80, 20));
        assert_eq!(parse_hot("80%:20%").unwrap(), (80, 20));
        assert!(parse_hot("80/20").is_err());
        let m = parse_mix("search=80, modify=10,auth=10,bind=0").unwrap();
        assert_eq!(
            m,
            [
                OpShare {
                    kind: OpKind::Search,
                    upto: 80
                },
                OpShare {
                    kind: OpKind::Modify,
                    upto: 90
                },
                OpShare {
                    kind: OpKind::Auth,
                    upto: 100
                },
            ]
        );
        assert!(parse_mix("search=1,add=1")
            .unwrap_err()
            .contains("separate runs"));
        assert!(parse_mix("search=1,search=2")
            .unwrap_err()
            .contains("twice"));
        assert!(parse_mix("serch=1")
            .unwrap_err()
            .contains("unknown operation"));
        assert!(parse_mix("search=x").unwrap_err().contains("whole number"));
        assert!(parse_mix("search=0").unwrap_err().contains("no operation"));
    }

    #[test]
    fn workload_specific_checks() {
        let p = plan(&["--workload", "auth", "--depth", "8"]).unwrap();
        assert_eq!(p.depth, 1);
        assert!(p.notes[0].contains("depth 1"), "{:?}", p.notes);
        assert!(p.uses_main() && p.uses_bind_conn());
        let p = plan(&["--workload", "bind"]).unwrap();
        assert!(!p.uses_main() && p.uses_bind_conn());
        let p = plan(&["--mix", "search=9,auth=1", "--depth", "4"]).unwrap();
        assert_eq!(
            (p.workload, p.depth, p.total_weight()),
            (Workload::Mixed, 4, 10)
        );
        assert!(plan(&["--workload", "mixed"])
            .unwrap_err()
            .contains("needs --mix"));
        assert!(plan(&["--workload", "search", "--mix", "search=1"])
            .unwrap_err()
            .contains("only goes with"));
        let p = plan(&["--workload", "add", "--range", "0-9"]).unwrap();
        assert!(p.requests.add.is_some());
        assert_eq!(p.keys.dist, crate::keys::Dist::Sequential);
        assert!(plan(&["--workload", "add", "--hot", "80:20"])
            .unwrap_err()
            .contains("--hot"));
        let e = plan(&["--workload", "add", "--dn-template", "cn=x%d,dc=y"]).unwrap_err();
        assert!(e.contains("uid=VALUE"), "{e}");
        let e = plan(&["--workload", "delete", "--dn-template", "uid=x,dc=y"]).unwrap_err();
        assert!(e.contains("need %d"), "{e}");
    }

    #[test]
    fn bad_input_is_named() {
        let e = plan(&["--filter", "(uid=user.%d"]).unwrap_err();
        assert!(
            e.contains("--filter '(uid=user.%d'") && e.contains("bad search filter"),
            "{e}"
        );
        let e = plan(&["--filter", "(uid=%x)"]).unwrap_err();
        assert!(e.contains("'%x'"), "{e}");
        assert!(plan(&["--bind-dn", "cn=x"])
            .unwrap_err()
            .contains("--bind-pw"));
        assert!(plan(&["--bind-pw", "x"])
            .unwrap_err()
            .contains("need --bind-dn"));
        assert!(plan(&["--connections", "0"])
            .unwrap_err()
            .contains("--connections"));
        assert!(plan(&["--rate", "0"]).unwrap_err().contains("--rate"));
        assert!(plan(&["--count", "0"]).unwrap_err().contains("--count"));
        assert!(plan(&["--range", "9-1"])
            .unwrap_err()
            .contains("below the start"));
        let e = plan(&["--bind-dn", "cn=x", "--bind-pw-file", "/nonexistent/pw"]).unwrap_err();
        assert!(e.contains("/nonexistent/pw"), "{e}");
    }

    #[test]
    fn credentials_debug_hides_the_password() {
        let c = Credentials {
            dn: "cn=x".into(),
            password: b"hunter2".to_vec(),
        };
        let s = format!("{c:?}");
        assert!(s.contains("cn=x") && !s.contains("hunter2"), "{s}");
    }

    #[test]
    fn count_without_duration_is_capped() {
        let p = plan(&["--count", "100"]).unwrap();
        assert_eq!(
            (p.duration, p.count, p.time_cap),
            (None, Some(100), DEFAULT_COUNT_CAP)
        );
        let p = plan(&["--count", "100", "--duration", "3s"]).unwrap();
        assert_eq!(
            (p.duration, p.time_cap),
            (Some(Duration::from_secs(3)), Duration::from_secs(3))
        );
    }
}
