//! `pando bench --replay FILE`: a record made by `pando proxy --record`
//! played against a server. Each recorded connection gets a connection of
//! its own and sends its requests in their order, never before the
//! previous request of the same connection has been answered. With
//! `--speed N` each is sent at its recorded time divided by N (connections
//! run side by side, as recorded); with `--speed 0`, as fast as the server
//! answers, keeping the record's order across connections too (a request
//! waits until every request recorded before it has been answered), so a
//! replay gives the same final data as the session. Latency is measured
//! from sending to the last response; results are counted by operation and
//! result code.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pando_proto::{frame_length, op_tag, BindAuth, DecodeLimits, LdapMessage, ProtocolOp};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use crate::config::{parse_url, BenchArgs, Target};
use crate::stats::{ErrKey, KindStats};
use crate::wire;

/// The longest wait for one request's answer before the connection is
/// given up (a persistent search recorded, say).
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// One recorded request.
struct Request {
    /// Its place in the record.
    seq: usize,
    t: f64,
    bytes: Vec<u8>,
    msg_id: i32,
    /// The operation's name in the report.
    kind: &'static str,
    /// No response is awaited (unbind, abandon).
    silent: bool,
}

type Results = BTreeMap<&'static str, KindStats>;

/// The record's order across connections (`--speed 0`): which requests
/// are finished (answered, or sent when none is awaited, or given up).
struct Order {
    /// (the first request not finished, each request's finished flag)
    state: Mutex<(usize, Vec<bool>)>,
    notify: Notify,
}

impl Order {
    fn new(n: usize) -> Order {
        Order {
            state: Mutex::new((0, vec![false; n])),
            notify: Notify::new(),
        }
    }

    /// Until every request before `seq` is finished.
    async fn wait_turn(&self, seq: usize) {
        loop {
            let woken = self.notify.notified();
            if self.state.lock().map_or(true, |s| s.0 >= seq) {
                return;
            }
            woken.await;
        }
    }

    fn finished(&self, seqs: impl IntoIterator<Item = usize>) {
        if let Ok(mut s) = self.state.lock() {
            for q in seqs {
                if let Some(f) = s.1.get_mut(q) {
                    *f = true;
                }
            }
            while s.0 < s.1.len() && s.1[s.0] {
                s.0 += 1;
            }
        }
        self.notify.notify_waiters();
    }
}

pub fn run(args: BenchArgs) -> Result<(), String> {
    let path = args.replay.clone().unwrap_or_default();
    let password = crate::config::given_password(&args)?;
    let conns = read(&path, password.as_deref())?;
    let target = parse_url(&args.url, args.allow_remote)?;
    if !(args.speed >= 0.0 && args.speed.is_finite()) {
        return Err(format!("--speed {}: 0 or more", args.speed));
    }
    let total: usize = conns.values().map(Vec::len).sum();
    println!(
        "replaying {} requests on {} connections from {} against {} at {}",
        total,
        conns.len(),
        path.display(),
        args.url,
        if args.speed == 0.0 {
            "full speed".to_string()
        } else {
            format!("{}x the recorded pace", args.speed)
        }
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let started = Instant::now();
    let results = rt.block_on(play(conns, target, args.speed))?;
    report(&results, started.elapsed());
    Ok(())
}

/// The record, by connection. A line that is not a record names its
/// number and what is wrong.
fn read(path: &Path, password: Option<&[u8]>) -> Result<BTreeMap<u64, Vec<Request>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut conns: BTreeMap<u64, Vec<Request>> = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = |why: String| format!("{}:{}: {why}", path.display(), i + 1);
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        let t = v["t"].as_f64().ok_or_else(|| at("no \"t\"".into()))?;
        let conn = v["conn"].as_u64().ok_or_else(|| at("no \"conn\"".into()))?;
        let hex = v["ber"].as_str().ok_or_else(|| at("no \"ber\"".into()))?;
        let bytes = unhex(hex).ok_or_else(|| at("\"ber\" is not hex".into()))?;
        let mut msg = LdapMessage::decode(&bytes, &DecodeLimits::default())
            .map_err(|e| at(format!("not an LDAP request: {}", e.reason)))?;
        let withheld = v["withheld"].as_bool().unwrap_or(false);
        let bytes = match (&mut msg.op, withheld, password) {
            (ProtocolOp::BindRequest(b), true, Some(pw)) => {
                b.auth = BindAuth::Simple(pw.to_vec());
                msg.to_bytes()
            }
            _ => bytes,
        };
        let tag = msg.op.tag();
        let seq = conns.values().map(Vec::len).sum();
        conns.entry(conn).or_default().push(Request {
            seq,
            t,
            bytes,
            msg_id: msg.id,
            kind: kind(tag),
            silent: matches!(tag, op_tag::UNBIND_REQUEST | op_tag::ABANDON_REQUEST),
        });
    }
    Ok(conns)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn kind(tag: u8) -> &'static str {
    match tag {
        op_tag::BIND_REQUEST => "bind",
        op_tag::SEARCH_REQUEST => "search",
        op_tag::MODIFY_REQUEST => "modify",
        op_tag::ADD_REQUEST => "add",
        op_tag::DEL_REQUEST => "delete",
        op_tag::MODIFY_DN_REQUEST => "modrdn",
        op_tag::COMPARE_REQUEST => "compare",
        op_tag::EXTENDED_REQUEST => "extended",
        op_tag::ABANDON_REQUEST => "abandon",
        _ => "unbind",
    }
}

async fn play(
    conns: BTreeMap<u64, Vec<Request>>,
    target: Target,
    speed: f64,
) -> Result<Results, String> {
    let start = Instant::now();
    let total = conns.values().map(Vec::len).sum();
    let order = (speed == 0.0).then(|| Arc::new(Order::new(total)));
    let tasks: Vec<_> = conns
        .into_values()
        .map(|reqs| {
            let (target, order) = (target.clone(), order.clone());
            tokio::spawn(async move { one_connection(reqs, target, start, speed, order).await })
        })
        .collect();
    let mut all = Results::new();
    for t in tasks {
        let got = t
            .await
            .map_err(|e| format!("a replayed connection failed: {e}"))??;
        for (k, s) in got {
            all.entry(k).or_default().merge(&s);
        }
    }
    Ok(all)
}

async fn one_connection(
    reqs: Vec<Request>,
    target: Target,
    start: Instant,
    speed: f64,
    order: Option<Arc<Order>>,
) -> Result<Results, String> {
    let seqs: Vec<usize> = reqs.iter().map(|r| r.seq).collect();
    let played = match &target {
        Target::Tcp(addr) => match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                Ok(send_all(s, reqs, start, speed, order.as_deref()).await)
            }
            Err(e) => Err(format!("cannot connect to {addr}: {e}")),
        },
        Target::Unix(path) => match tokio::net::UnixStream::connect(path).await {
            Ok(s) => Ok(send_all(s, reqs, start, speed, order.as_deref()).await),
            Err(e) => Err(format!("cannot connect to {}: {e}", path.display())),
        },
    };
    // Whatever this connection did not play no longer holds the others up.
    if let Some(o) = &order {
        o.finished(seqs);
    }
    played
}

async fn send_all<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    reqs: Vec<Request>,
    start: Instant,
    speed: f64,
    order: Option<&Order>,
) -> Results {
    let mut results = Results::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    for r in reqs {
        match order {
            Some(o) => o.wait_turn(r.seq).await,
            None => {
                let due = start + Duration::from_secs_f64(r.t / speed);
                tokio::time::sleep_until(due.into()).await;
            }
        }
        let stats = results.entry(r.kind).or_default();
        let sent = Instant::now();
        if s.write_all(&r.bytes).await.is_err() {
            stats.err(ErrKey::Ldap(81));
            break;
        }
        if r.silent {
            order.inspect(|o| o.finished([r.seq]));
            continue;
        }
        let got = tokio::time::timeout(ANSWER_WAIT, answer(&mut s, &mut buf, r.msg_id)).await;
        order.inspect(|o| o.finished([r.seq]));
        match got {
            Ok(Ok((code, entries))) => {
                stats.entries += entries;
                match code {
                    0 | 5 | 6 => stats.ok(sent.elapsed().as_nanos() as u64),
                    c => stats.err(ErrKey::Ldap(c)),
                }
            }
            // Server down (81) or no answer in time (85, timeout): the
            // connection's remaining requests are not sent.
            Ok(Err(_)) => {
                stats.err(ErrKey::Ldap(81));
                break;
            }
            Err(_) => {
                stats.err(ErrKey::Ldap(85));
                break;
            }
        }
    }
    results
}

/// Read until the last response to `msg_id`: its result code, and the
/// entries that came before it.
async fn answer<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    msg_id: i32,
) -> Result<(u32, u64), String> {
    let mut entries = 0;
    loop {
        while let Some(n) = frame_length(buf, usize::MAX).map_err(|e| e.to_string())? {
            let frame: Vec<u8> = buf.drain(..n).collect();
            let env = wire::envelope(&frame)?;
            if env.msg_id != msg_id {
                continue;
            }
            if env.op == op_tag::SEARCH_RESULT_ENTRY {
                entries += 1;
            }
            if let Some(code) = env.code {
                return Ok((code, entries));
            }
        }
        buf.reserve(16 * 1024);
        if s.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("the server closed the connection".into());
        }
    }
}

fn report(results: &Results, elapsed: Duration) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let ops: u64 = results.values().map(|s| s.ops + s.errors).sum();
    println!(
        "{ops} requests answered in {secs:.2}s: {:.0}/s",
        ops as f64 / secs
    );
    println!(
        "{:<9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}  errors",
        "op", "ok", "failed", "mean ms", "p50 ms", "p99 ms", "max ms"
    );
    for (kind, s) in results.iter().filter(|(_, s)| s.ops + s.errors > 0) {
        let l = s.latency();
        let errors: Vec<String> = s
            .by_error
            .iter()
            .map(|(k, n)| format!("{}×{n}", k.describe()))
            .collect();
        println!(
            "{kind:<9} {:>8} {:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3}  {}",
            s.ops,
            s.errors,
            l.mean,
            l.p50,
            l.p99,
            l.max,
            errors.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::{BindRequest, ProtocolOp};

    #[test]
    fn a_record_is_read_with_withheld_passwords_filled_and_bad_lines_named() {
        let dir = std::env::temp_dir().join(format!("pando-replay-{}", std::process::id()));
        let bind = LdapMessage {
            id: 1,
            op: ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: "cn=a".into(),
                auth: BindAuth::Simple(Vec::new()),
            }),
            controls: Vec::new(),
        };
        let hex: String = bind.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        let unbind = "300502010242 00".replace(' ', "");
        std::fs::write(
            &dir,
            format!(
                "{{\"t\":0.5,\"conn\":3,\"ber\":\"{hex}\",\"withheld\":true}}\n{{\"t\":0.6,\"conn\":3,\"ber\":\"{unbind}\"}}\n"
            ),
        )
        .unwrap();
        let conns = read(&dir, Some(b"pw")).unwrap();
        let reqs = &conns[&3];
        assert_eq!(reqs.len(), 2);
        let m = LdapMessage::decode(&reqs[0].bytes, &DecodeLimits::default()).unwrap();
        assert!(
            matches!(m.op, ProtocolOp::BindRequest(b) if b.auth == BindAuth::Simple(b"pw".to_vec()))
        );
        assert!(reqs[1].silent && reqs[0].kind == "bind");
        std::fs::write(&dir, "{\"t\":1,\"conn\":1,\"ber\":\"3003\"}\n").unwrap();
        let e = read(&dir, None).err().unwrap();
        assert!(
            e.ends_with(":1: not an LDAP request: unexpected end of data")
                || e.contains(":1: not an LDAP request"),
            "{e}"
        );
        std::fs::write(&dir, "\n{\"t\":1,\"conn\":1,\"ber\":\"zz\"}\n").unwrap();
        assert!(read(&dir, None)
            .err()
            .unwrap()
            .contains(":2: \"ber\" is not hex"));
        let _ = std::fs::remove_file(&dir);
    }
}
