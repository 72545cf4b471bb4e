//! The audit log: every successful change as an LDIF change record
//! (RFC 2849), preceded by a comment saying when, who and on which
//! connection:
//!
//! ```text
//! # 2026-11-22T07:02:25.123456Z cn=admin,dc=example,dc=com conn=5 op=2
//! dn: uid=zoe,ou=People,dc=example,dc=com
//! changetype: add
//! objectClass: inetOrgPerson
//! userPassword: {ARGON2}$argon2id$v=19$...
//! ...
//! ```
//!
//! Records hold user attributes only: the server-maintained ones
//! (entryUUID, timestamps, creatorsName…) cannot be set by a client, so
//! leaving them out lets `ldapmodify -a` replay the log into another server.
//! Password values are the stored (hashed) forms, never clear text: a
//! modify touching userPassword is logged as a `replace` with the values
//! the entry holds afterwards, whatever the client sent (a `delete` of a
//! value names the clear password, which must not be written anywhere).
//! Other secrets (`pando_model::secret`: sambaNTPassword, authPassword…)
//! have no salted stored form: their values are withheld, the record
//! saying in a comment which attribute and how many values, so a replay
//! leaves them as they were.

use pando_model::{Attribute, Schema};
use pando_proto::{Change, ModOp};

use crate::logfile::LogFile;

pub struct AuditLog {
    pub file: LogFile,
}

/// Who made a change, and over which connection/operation (0 when made
/// outside a connection).
pub struct Origin<'a> {
    pub time_micros: u64,
    pub who: &'a str,
    /// The DN that acted as `who` with proxied authorization.
    pub proxied_by: Option<&'a str>,
    pub conn: u64,
    pub op: u64,
}

/// A secret other than userPassword (whose stored form is written).
fn withheld(schema: &Schema, desc: &str) -> bool {
    schema.is_secret(desc) && !schema.names_password(desc)
}

/// A change that happened, in the terms the record is written in.
pub enum Record<'a> {
    /// The entry as stored (hashed passwords); operational attributes are
    /// left out when writing.
    Add {
        dn: &'a str,
        attrs: &'a [Attribute],
    },
    Delete {
        dn: &'a str,
    },
    /// `passwords`: the userPassword values after the change, when any
    /// change touched userPassword.
    Modify {
        dn: &'a str,
        changes: &'a [Change],
        passwords: Option<&'a [Vec<u8>]>,
    },
    ModDn {
        dn: &'a str,
        new_rdn: &'a str,
        delete_old_rdn: bool,
        new_superior: Option<&'a str>,
    },
}

struct Out {
    buf: Vec<u8>,
    logical: Vec<u8>,
}

impl Out {
    /// A comment in place of a secret's values: `what` (the attribute,
    /// or a modify's `op: attribute`) and how many values it had.
    fn withheld(&mut self, what: &str, values: usize) {
        let what: String = what
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        self.buf
            .extend_from_slice(format!("# {what}: {values} value(s) withheld\n").as_bytes());
    }

    fn line(&mut self, name: &str, value: &[u8]) {
        pando_ldif::append_line(
            &mut self.buf,
            &mut self.logical,
            name.as_bytes(),
            value,
            Some(pando_ldif::DEFAULT_WRAP),
        );
    }
}

impl Out {
    /// An added entry's attributes: operational ones left out, withheld
    /// ones counted, not shown.
    fn added(&mut self, schema: &Schema, attrs: &[Attribute]) {
        for a in attrs.iter() {
            let base = pando_model::desc::base(&a.desc);
            let operational = schema
                .attribute(base)
                .map(|t| t.is_operational())
                .unwrap_or(false);
            if operational {
                continue;
            }
            if withheld(schema, &a.desc) {
                self.withheld(&a.desc, a.values.len());
                continue;
            }
            for v in &a.values {
                self.line(&a.desc, v);
            }
        }
    }

    /// A modify's changes; every change of the password becomes one
    /// replace with the values stored after it (hashed), withheld ones
    /// are counted, not shown.
    fn changes(&mut self, schema: &Schema, changes: &[Change], passwords: Option<&[Vec<u8>]>) {
        let mut password_done = false;
        for c in changes.iter() {
            if schema.names_password(&c.attr.name) {
                if password_done {
                    continue;
                }
                password_done = true;
                self.line("replace", b"userPassword");
                for v in passwords.unwrap_or(&[]) {
                    self.line("userPassword", v);
                }
                self.buf.extend_from_slice(b"-\n");
                continue;
            }
            let kind = match c.op {
                ModOp::Add => "add",
                ModOp::Delete => "delete",
                ModOp::Replace => "replace",
                ModOp::Increment => "increment",
            };
            if withheld(schema, &c.attr.name) {
                self.withheld(&format!("{kind}: {}", c.attr.name), c.attr.values.len());
                continue;
            }
            self.line(kind, c.attr.name.as_bytes());
            for v in &c.attr.values {
                self.line(&c.attr.name, v);
            }
            self.buf.extend_from_slice(b"-\n");
        }
    }
}

/// The LDIF text of one record, blank line included.
pub fn format(schema: &Schema, origin: &Origin<'_>, record: &Record<'_>) -> String {
    let mut o = Out {
        buf: Vec::with_capacity(512),
        logical: Vec::with_capacity(128),
    };
    // The comment is one line whatever the DN holds.
    let who: String = if origin.who.is_empty() {
        "anonymous".into()
    } else {
        origin
            .who
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect()
    };
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect()
    };
    let by = origin
        .proxied_by
        .map(|d| format!(" (proxied by {})", clean(d)))
        .unwrap_or_default();
    o.buf.extend_from_slice(
        format!(
            "# {} {who}{by} conn={} op={}\n",
            pando_store::clock::rfc3339_micros(origin.time_micros),
            origin.conn,
            origin.op
        )
        .as_bytes(),
    );
    match record {
        Record::Add { dn, attrs } => {
            o.line("dn", dn.as_bytes());
            o.line("changetype", b"add");
            o.added(schema, attrs);
        }
        Record::Delete { dn } => {
            o.line("dn", dn.as_bytes());
            o.line("changetype", b"delete");
        }
        Record::Modify {
            dn,
            changes,
            passwords,
        } => {
            o.line("dn", dn.as_bytes());
            o.line("changetype", b"modify");
            o.changes(schema, changes, *passwords);
        }
        Record::ModDn {
            dn,
            new_rdn,
            delete_old_rdn,
            new_superior,
        } => {
            o.line("dn", dn.as_bytes());
            o.line("changetype", b"modrdn");
            o.line("newrdn", new_rdn.as_bytes());
            o.line("deleteoldrdn", if *delete_old_rdn { b"1" } else { b"0" });
            if let Some(s) = new_superior {
                o.line("newsuperior", s.as_bytes());
            }
        }
    }
    o.buf.push(b'\n');
    // append_line base64-encodes everything that is not a SAFE-STRING, so
    // the bytes are ASCII.
    String::from_utf8_lossy(&o.buf).into_owned()
}

impl AuditLog {
    pub fn write(&self, schema: &Schema, origin: &Origin<'_>, record: &Record<'_>) {
        self.file.write(format(schema, origin, record));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::PartialAttribute;

    fn origin() -> Origin<'static> {
        Origin {
            time_micros: 0,
            who: "cn=admin,dc=example,dc=com",
            proxied_by: None,
            conn: 3,
            op: 4,
        }
    }

    fn schema() -> Schema {
        Schema::standard()
    }

    #[test]
    fn add_leaves_out_operational_attributes() {
        let attrs = vec![
            Attribute {
                desc: "objectClass".into(),
                values: vec![b"person".to_vec()],
            },
            Attribute {
                desc: "cn".into(),
                values: vec!["Zoë".as_bytes().to_vec()],
            },
            Attribute {
                desc: "entryUUID".into(),
                values: vec![b"0f9a...".to_vec()],
            },
            Attribute {
                desc: "creatorsName".into(),
                values: vec![b"cn=admin".to_vec()],
            },
        ];
        let r = format(
            &schema(),
            &origin(),
            &Record::Add {
                dn: "cn=z,dc=example,dc=com",
                attrs: &attrs,
            },
        );
        assert_eq!(
            r,
            "# 1970-01-01T00:00:00.000000Z cn=admin,dc=example,dc=com conn=3 op=4\n\
             dn: cn=z,dc=example,dc=com\nchangetype: add\nobjectClass: person\ncn:: Wm/Dqw==\n\n"
        );
    }

    #[test]
    fn modify_logs_stored_passwords_only() {
        let changes = vec![
            Change {
                op: ModOp::Delete,
                attr: PartialAttribute {
                    name: "userPassword".into(),
                    values: vec![b"old-clear".to_vec()],
                },
            },
            Change {
                op: ModOp::Add,
                attr: PartialAttribute {
                    name: "userPassword".into(),
                    values: vec![b"{ARGON2}hash".to_vec()],
                },
            },
            Change {
                op: ModOp::Replace,
                attr: PartialAttribute {
                    name: "mail".into(),
                    values: vec![b"z@example.com".to_vec()],
                },
            },
        ];
        let stored = vec![b"{ARGON2}hash".to_vec()];
        let r = format(
            &schema(),
            &origin(),
            &Record::Modify {
                dn: "cn=z,dc=example,dc=com",
                changes: &changes,
                passwords: Some(&stored),
            },
        );
        assert!(!r.contains("old-clear"));
        assert!(
            r.ends_with(
                "changetype: modify\nreplace: userPassword\nuserPassword: {ARGON2}hash\n-\n\
             replace: mail\nmail: z@example.com\n-\n\n"
            ),
            "{r}"
        );
    }

    #[test]
    fn other_secrets_are_withheld() {
        let attrs = vec![
            Attribute {
                desc: "cn".into(),
                values: vec![b"z".to_vec()],
            },
            Attribute {
                desc: "sambaNTPassword".into(),
                values: vec![b"8846F7EAEE8FB117AD06BDD830B7586C".to_vec()],
            },
        ];
        let r = format(
            &schema(),
            &origin(),
            &Record::Add {
                dn: "cn=z,dc=example,dc=com",
                attrs: &attrs,
            },
        );
        assert!(!r.contains("8846F7"), "{r}");
        assert!(
            r.contains("cn: z\n# sambaNTPassword: 1 value(s) withheld\n"),
            "{r}"
        );
        let changes = vec![Change {
            op: ModOp::Replace,
            attr: PartialAttribute {
                name: "sambaLMPassword".into(),
                values: vec![b"AAD3B435B51404EE".to_vec()],
            },
        }];
        let r = format(
            &schema(),
            &origin(),
            &Record::Modify {
                dn: "cn=z,dc=example,dc=com",
                changes: &changes,
                passwords: None,
            },
        );
        assert!(!r.contains("AAD3B4"), "{r}");
        assert!(
            r.ends_with("changetype: modify\n# replace: sambaLMPassword: 1 value(s) withheld\n\n"),
            "{r}"
        );
    }

    #[test]
    fn moddn_and_delete() {
        let r = format(
            &schema(),
            &origin(),
            &Record::ModDn {
                dn: "cn=a,dc=x",
                new_rdn: "cn=b",
                delete_old_rdn: true,
                new_superior: Some("ou=y,dc=x"),
            },
        );
        assert!(r.ends_with(
            "dn: cn=a,dc=x\nchangetype: modrdn\nnewrdn: cn=b\ndeleteoldrdn: 1\nnewsuperior: ou=y,dc=x\n\n"
        ));
        let d = format(&schema(), &origin(), &Record::Delete { dn: "cn=a,dc=x" });
        assert!(d.ends_with("dn: cn=a,dc=x\nchangetype: delete\n\n"));
    }
}
