//! `ops::config_write::write` applies the write controls around any
//! configuration tree's staged change: a tree that knows nothing of them
//! (the one here records what it was asked) still has its No-Op
//! rehearsed, its failed assertion never finished, its entry read back.

use std::sync::{Arc, Mutex, Weak};

use pando_model::{Dn, Entry, Schema};
use pando_proto::{
    oid, Change, Filter, ModOp, ModifyRequest, PartialAttribute, ProtocolOp, ResultCode,
};

use crate::ops::controls::{ReadEntry, Requested};
use crate::ops::operation::Operation;
use crate::ops::seams::{ConfigAfter, ConfigChange, ConfigFuture, ConfigTree, StagedConfig};
use crate::state::{Current, Server};
use crate::test_server::{bare_live, user};
use pando_access::Identity;

/// What the recording tree was asked: `stage` once per change, then
/// `finish(rehearse)`.
#[derive(Default)]
struct Asked {
    staged: usize,
    finished: Vec<bool>,
}

struct Recording {
    asked: Arc<Mutex<Asked>>,
    schema: Arc<Schema>,
}

fn the_entry() -> Entry {
    let mut e = Entry::new(Dn::parse("cn=config").unwrap());
    e.add_values("objectClass", vec![b"olcGlobal".to_vec()]);
    e.add_values("cn", vec![b"config".to_vec()]);
    e.add_values("olcSizeLimit", vec![b"500".to_vec()]);
    e
}

impl ConfigTree for Recording {
    fn entries(&self, _: &Server) -> Vec<(String, Entry)> {
        vec![("cn=config".into(), the_entry())]
    }

    fn stage<'a>(
        &'a self,
        _: &'a Arc<Server>,
        _: ConfigChange<'a>,
    ) -> ConfigFuture<'a, Box<dyn StagedConfig<'a> + 'a>> {
        self.asked.lock().unwrap().staged += 1;
        let staged: Box<dyn StagedConfig<'a> + 'a> = Box::new(Staged {
            asked: self.asked.clone(),
            schema: self.schema.clone(),
            before: the_entry(),
        });
        Box::pin(async move { Ok(staged) })
    }

    fn shared_state(&self, _: &Server) -> Result<Vec<u8>, String> {
        Err("not shared".into())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct Staged {
    asked: Arc<Mutex<Asked>>,
    schema: Arc<Schema>,
    before: Entry,
}

impl<'a> StagedConfig<'a> for Staged {
    fn before(&self) -> Option<&Entry> {
        Some(&self.before)
    }

    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn finish(self: Box<Self>, rehearse: bool) -> ConfigFuture<'a, ConfigAfter> {
        self.asked.lock().unwrap().finished.push(rehearse);
        let mut after = self.before.clone();
        after.remove("olcSizeLimit");
        after.add_values("olcSizeLimit", vec![b"7".to_vec()]);
        Box::pin(async move {
            Ok(ConfigAfter {
                entry: Some(after),
                schema: self.schema.clone(),
            })
        })
    }
}

/// A server over a fresh store whose cn=config is `tree`.
fn with_tree(dir: &std::path::Path, tree: Arc<dyn ConfigTree>) -> Arc<Server> {
    let live = bare_live(dir, "");
    let running = live.server();
    let cfg = running.cfg.clone();
    let compiled = crate::compile(
        cfg,
        running.schema.clone(),
        None,
        running.passwords.clone(),
        running.logs.clone(),
    )
    .unwrap();
    let mut rt = running.rt.clone();
    rt.config_tree = tree;
    let weak: Weak<dyn Current> = Weak::<crate::live::Live>::new();
    Arc::new(Server::assemble(compiled, rt, weak))
}

fn set_limit(who: Identity, controls: Requested) -> Operation {
    Operation {
        msg_id: 1,
        who,
        request: ProtocolOp::ModifyRequest(ModifyRequest {
            dn: "cn=config".into(),
            changes: vec![Change {
                op: ModOp::Replace,
                attr: PartialAttribute {
                    name: "olcSizeLimit".into(),
                    values: vec![b"7".to_vec()],
                },
            }],
        }),
        controls,
    }
}

fn run(server: &Arc<Server>, op: Operation) -> (u32, Vec<pando_proto::Control>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let response = rt
        .block_on(crate::ops::operation::perform(server, op))
        .expect("a modify is performed");
    (response.code().unwrap(), response.controls)
}

#[test]
fn the_write_controls_are_applied_around_any_configuration_tree() {
    let dir = tempfile::tempdir().unwrap();
    let asked = Arc::new(Mutex::new(Asked::default()));
    let tree = Arc::new(Recording {
        asked: asked.clone(),
        schema: Arc::new(Schema::standard()),
    });
    let server = with_tree(dir.path(), tree);
    let admin = || user(&server, "cn=admin,dc=example,dc=com", true);

    // Not an administrator: the tree is never asked.
    let anonymous = Identity::anonymous(Arc::default());
    let (code, _) = run(&server, set_limit(anonymous, Requested::default()));
    assert_eq!(code, ResultCode::NO_SUCH_OBJECT.0);
    assert_eq!(asked.lock().unwrap().staged, 0);

    // An assertion false for the entry: staged, never finished.
    let false_assertion = Requested {
        assertion: Some(Filter::parse("(olcSizeLimit=9)").unwrap()),
        ..Default::default()
    };
    let (code, _) = run(&server, set_limit(admin(), false_assertion));
    assert_eq!(code, ResultCode::ASSERTION_FAILED.0);
    assert_eq!(asked.lock().unwrap().finished, Vec::<bool>::new());

    // No-Op: rehearsed, answered noOperation.
    let no_op = Requested {
        no_op: true,
        ..Default::default()
    };
    let (code, _) = run(&server, set_limit(admin(), no_op));
    assert_eq!(code, ResultCode::NO_OPERATION.0);
    assert_eq!(asked.lock().unwrap().finished, vec![true]);

    // A true assertion with pre- and post-read: made, both sides read.
    let read = |attr: &str| ReadEntry {
        attrs: vec![attr.to_string()],
        critical: true,
    };
    let reads = Requested {
        assertion: Some(Filter::parse("(olcSizeLimit=500)").unwrap()),
        pre_read: Some(read("olcSizeLimit")),
        post_read: Some(read("olcSizeLimit")),
        ..Default::default()
    };
    let (code, controls) = run(&server, set_limit(admin(), reads));
    assert_eq!(code, ResultCode::SUCCESS.0);
    assert_eq!(asked.lock().unwrap().finished, vec![true, false]);
    let oids: Vec<&str> = controls.iter().map(|c| c.oid.as_str()).collect();
    assert_eq!(oids, [oid::PRE_READ, oid::POST_READ]);
    let shows = |c: &pando_proto::Control, v: &[u8]| {
        c.value.as_ref().unwrap().windows(v.len()).any(|w| w == v)
    };
    assert!(shows(&controls[0], b"500") && !shows(&controls[0], b"\x017"));
    assert!(shows(&controls[1], b"\x017"));
}
