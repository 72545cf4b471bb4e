//! The whole server in process: arbitrary bytes are one client's side of a
//! connection. The connection's session is the local (ldapi) owner, so a
//! SASL EXTERNAL bind makes the fuzzer an administrator and every write path
//! is reachable, through every overlay (configured below). The server must
//! answer or disconnect, never panic or hang,
//! and every response it sends must be a well-formed LDAP message.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use pando_proto::{frame_length, DecodeLimits, LdapMessage};
use pando_server::net::connection::Connection;
use pando_access::{PeerCred, Session};
use pando_server::settings::Validate;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Harness {
    rt: tokio::runtime::Runtime,
    live: Arc<pando_server::live::Live>,
    _dir: std::path::PathBuf,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pando-fuzz-server-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        // valsort's weighted rule is on an attribute the demo tree does not
        // use: its descriptions carry no weight, and the tree must load.
        let toml = format!(
            "data_dir = {:?}\n[store]\ndurability = \"none\"\nwarm_start = false\nmap_size_mb = 4096\n\
             [limits]\nfailed_bind_max_delay_ms = 0\nfailed_bind_lockout = 0\nfailed_bind_lockout_ip = 0\n\
             max_pdu_bytes = 65536\n\
             [passwords]\nscheme = \"ssha512\"\n\
             [[overlay]]\ntype = \"refint\"\n\
             [[overlay]]\ntype = \"unique\"\nattributes = [\"uid\"]\n\
             [[overlay]]\ntype = \"memberof\"\n\
             [[overlay]]\ntype = \"valsort\"\nrules = [\"description dc=example,dc=com alpha-descend\", \"businessCategory dc=example,dc=com weighted alpha-ascend\"]\n\
             [[overlay]]\ntype = \"ppolicy\"\ndefault_policy = \"cn=policy,dc=example,dc=com\"\n\
             [[overlay]]\ntype = \"accesslog\"\nops = [\"all\"]\n",
            dir.display().to_string()
        );
        let schema = Arc::new(pando_model::Schema::standard());
        let cfg = pando_config::Config::from_toml(&toml, std::path::Path::new("fuzz.toml"))
            .expect("config")
            .validate(&schema)
            .expect("valid config");
        let store = pando_store::Store::open(
            &pando_server::store_dir(&dir),
            schema.clone(),
            &pando_server::store_options(&cfg),
        )
        .expect("store");
        let csn = pando_store::clock::clock_for_store(&store, 0);
        let live = pando_server::build_server(cfg, schema, store, csn, None, None).expect("server");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        // The suffix and the demo tree, written through the server's own
        // pipeline as at a first start.
        let server = live.server();
        rt.block_on(async {
            pando_server::bootstrap::ensure_suffixes(&server, &server.cfg.suffixes)
                .await
                .expect("suffix");
            pando_server::bootstrap::load_demo(&server).await.expect("demo tree");
        });
        Harness {
            rt,
            live,
            _dir: dir,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    let live = h.live.clone();
    let input = data.to_vec();
    let out = h.rt.block_on(async move {
        let (client, conn_side) = tokio::io::duplex(1 << 16);
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        // SAFETY: geteuid/getegid have no preconditions.
        let cred = unsafe { PeerCred { uid: libc::geteuid(), gid: libc::getegid() } };
        let conn = Connection {
            server: live.server(),
            live,
            id: 1,
            peer: "fuzz".into(),
            session: Arc::new(Session {
                peer_cred: Some(cred),
                ..Session::default()
            }),
            shutdown: stop_rx,
        };
        let task = tokio::spawn(conn.run(conn_side));
        let (mut rd, mut wr) = tokio::io::split(client);
        let writer = tokio::spawn(async move {
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        });
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the server neither answered nor closed within 20 s");
        let _ = writer.await;
        let _ = task.await;
        out
    });
    // Everything the server sent frames and decodes as LDAP messages.
    let mut rest = out.as_slice();
    while !rest.is_empty() {
        let len = match frame_length(rest, usize::MAX) {
            Ok(Some(len)) => len,
            other => panic!("server sent a malformed frame: {other:?}"),
        };
        let (frame, tail) = rest.split_at(len);
        if let Err(e) = LdapMessage::decode(frame, &DecodeLimits::default()) {
            panic!("server sent an undecodable message: {e}");
        }
        rest = tail;
    }
});
