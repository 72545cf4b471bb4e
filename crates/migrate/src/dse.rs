//! 389 Directory Server's configuration (`dse.ldif`) read into the same
//! shape as OpenLDAP's ([`crate::source::Source`]): the server entry's
//! settings as global directives, each backend (`nsBackendInstance`) as a
//! database with its suffix and indexes, the plugins Pando has as
//! overlays, the TLS settings, the replica ID. Keywords are given the
//! OpenLDAP names the translation knows (`nsslapd-sizelimit` is
//! `sizelimit`); what has no counterpart is gathered into one directive per
//! entry, reported as dropped. Access control comes from `aci` values
//! (parsed by `aci.rs`), in dse.ldif and in a data export (`--acis-from`).

use std::path::Path;

use crate::source::{
    read_ldif, Directive, LdifEntry, Origin, Overlay, Section, Source, SourceKind,
};

/// Is `path` a dse.ldif (an LDIF file whose cn=config entry has nsslapd-
/// attributes)?
pub fn is_dse(path: &Path) -> bool {
    path.is_file()
        && std::fs::read_to_string(path)
            .map(|t| {
                t.lines()
                    .any(|l| l.to_ascii_lowercase().starts_with("nsslapd-"))
            })
            .unwrap_or(false)
}

/// A 389-DS attribute read as the directive `key`.
fn directive(path: &Path, name: &str, key: &str, value: &str, line: usize) -> Directive {
    Directive {
        key: key.to_string(),
        keyword: name.to_string(),
        value: value.to_string(),
        from_ldif: true,
        origin: Origin {
            path: path.to_path_buf(),
            line,
        },
    }
}

/// (389 attribute, OpenLDAP keyword) of the server entry's settings.
const SERVER: &[(&str, &str)] = &[
    ("nsslapd-sizelimit", "sizelimit"),
    ("nsslapd-timelimit", "timelimit"),
    ("nsslapd-idletimeout", "idletimeout"),
    ("nsslapd-threadnumber", "threads"),
    ("nsslapd-maxbersize", "sockbufmaxincomingauth"),
    ("nsslapd-rootdn", "rootdn"),
    ("nsslapd-rootpw", "rootpw"),
    ("nsslapd-port", "dirsrvport"),
    ("nsslapd-secureport", "dirsrvsecureport"),
    ("nsslapd-listenhost", "dirsrvlistenhost"),
    ("nsslapd-security", "dirsrvsecurity"),
    ("nsslapd-allow-anonymous-access", "dirsrvanonymous"),
    ("nsslapd-require-secure-binds", "dirsrvsecurebinds"),
];

/// Read a dse.ldif, and the ACIs of `acis_from` (a data export) if given.
pub fn read(path: &Path, acis_from: Option<&Path>) -> Result<Source, String> {
    let entries = read_ldif(path)?;
    let mut src = Source {
        kind: SourceKind::Dirsrv,
        ..Source::default()
    };
    let at = |e: &LdifEntry| e.dn.to_ascii_lowercase().replace(", ", ",");
    let mut suffixes: Vec<(String, Section)> = Vec::new();
    for e in &entries {
        let dn = at(e);
        if dn == "cn=config" {
            server_entry(path, e, &mut src);
        } else if e.has_class("nsBackendInstance") {
            let mut db = Section {
                kind: "mdb".into(),
                origin: Some(Origin {
                    path: path.to_path_buf(),
                    line: e.line,
                }),
                ..Section::default()
            };
            for (n, v, line) in &e.attrs {
                if n.eq_ignore_ascii_case("nsslapd-suffix") {
                    db.directives.push(directive(path, n, "suffix", v, *line));
                }
            }
            suffixes.push((dn, db));
        } else if e.has_class("nsIndex") {
            index_entry(path, e, &dn, &mut suffixes);
        } else if dn == "cn=encryption,cn=config" {
            encryption(path, e, &mut src);
        } else if e.has_class("nsds5Replica") {
            for (n, v, line) in &e.attrs {
                if n.eq_ignore_ascii_case("nsDS5ReplicaId") {
                    src.global
                        .directives
                        .push(directive(path, n, "serverid", v, *line));
                }
            }
        } else if e.has_class("nsds5replicationAgreement") {
            src.global.directives.push(directive(
                path,
                "nsds5replicationAgreement",
                "dirsrvagreement",
                &e.dn,
                e.line,
            ));
        } else if e.has_class("nsSlapdPlugin") {
            plugin(path, e, &mut src);
        }
    }
    src.databases = suffixes.into_iter().map(|(_, db)| db).collect();
    // The root DN is the server's; every database gets it (one root DN here).
    let root: Vec<Directive> = src
        .global
        .directives
        .iter()
        .filter(|d| d.key == "rootdn" || d.key == "rootpw")
        .cloned()
        .collect();
    src.global
        .directives
        .retain(|d| d.key != "rootdn" && d.key != "rootpw");
    for db in &mut src.databases {
        db.directives.extend(root.iter().cloned());
    }
    acis_of(&entries, path, &mut src.acis);
    if let Some(data) = acis_from {
        acis_of(&read_ldif(data)?, data, &mut src.acis);
    }
    Ok(src)
}

/// The `aci` values of `entries` (read from `path`), with where they are.
fn acis_of(entries: &[LdifEntry], path: &Path, out: &mut Vec<(String, String, Origin)>) {
    for e in entries {
        for (n, v, line) in &e.attrs {
            if n.eq_ignore_ascii_case("aci") {
                let origin = Origin {
                    path: path.to_path_buf(),
                    line: *line,
                };
                out.push((e.dn.clone(), v.clone(), origin));
            }
        }
    }
}

fn server_entry(path: &Path, e: &LdifEntry, src: &mut Source) {
    let mut unmapped = Vec::new();
    for (n, v, line) in &e.attrs {
        let lower = n.to_ascii_lowercase();
        match SERVER.iter().find(|(a, _)| *a == lower) {
            Some((_, key)) => src
                .global
                .directives
                .push(directive(path, n, key, v, *line)),
            None if lower.starts_with("nsslapd-") || lower.starts_with("password") => {
                unmapped.push(n.clone())
            }
            None => {}
        }
    }
    if !unmapped.is_empty() {
        src.global.directives.push(directive(
            path,
            "(server settings)",
            "dirsrvunmapped",
            &unmapped.join(", "),
            e.line,
        ));
    }
}

/// `cn=uid,cn=index,cn=userRoot,cn=ldbm database,…`: an index of the
/// backend named in its DN.
fn index_entry(path: &Path, e: &LdifEntry, dn: &str, suffixes: &mut [(String, Section)]) {
    let Some((_, backend)) = dn.split_once(",cn=index,") else {
        return; // cn=default indexes: copied into each backend at its creation
    };
    let Some((_, db)) = suffixes.iter_mut().find(|(b, _)| b == backend) else {
        return;
    };
    if e.values("nsSystemIndex")
        .any(|v| v.eq_ignore_ascii_case("true"))
    {
        return; // 389's own (entryrdn, parentid, aci…): Pando keeps its own
    }
    let attr = e.values("cn").next().unwrap_or_default();
    let kinds: Vec<&str> = e.values("nsIndexType").collect();
    if attr.is_empty() || kinds.is_empty() {
        return;
    }
    db.directives.push(directive(
        path,
        "nsIndexType",
        "index",
        &format!("{attr} {}", kinds.join(",")),
        e.line,
    ));
}

fn encryption(path: &Path, e: &LdifEntry, src: &mut Source) {
    for (n, v, line) in &e.attrs {
        let (key, value) = match n.to_ascii_lowercase().as_str() {
            "sslversionmin" => (
                "tlsprotocolmin",
                if v.eq_ignore_ascii_case("TLS1.3") {
                    "3.4"
                } else if v.eq_ignore_ascii_case("TLS1.2") {
                    "3.3"
                } else {
                    "3.1"
                },
            ),
            "nssslclientauth" => (
                "tlsverifyclient",
                match v.to_ascii_lowercase().as_str() {
                    "allowed" => "allow",
                    "required" => "demand",
                    _ => "never",
                },
            ),
            _ => continue,
        };
        src.global
            .directives
            .push(directive(path, n, key, value, *line));
    }
    src.global.directives.push(directive(
        path,
        "cn=encryption",
        "dirsrvcertificate",
        &e.dn,
        e.line,
    ));
}

/// The plugins Pando has, as overlays of every database.
fn plugin(path: &Path, e: &LdifEntry, src: &mut Source) {
    if !e
        .values("nsslapd-pluginEnabled")
        .any(|v| v.eq_ignore_ascii_case("on"))
    {
        return;
    }
    let plugin_path = e
        .values("nsslapd-pluginPath")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let (name, map): (&str, &[(&str, &str)]) = if plugin_path.contains("memberof") {
        (
            "memberof",
            &[
                ("memberofgroupattr", "memberofmemberad"),
                ("memberofattr", "memberofmemberofad"),
            ],
        )
    } else if plugin_path.contains("referint") {
        ("refint", &[("referint-membership-attr", "refintattribute")])
    } else if plugin_path.contains("attr-unique") {
        (
            "unique",
            &[
                ("uniqueness-attribute-name", "uniqueattribute"),
                ("uniqueness-subtrees", "uniquebase"),
            ],
        )
    } else {
        return;
    };
    let mut o = Overlay {
        name: name.into(),
        directives: Vec::new(),
        origin: Origin {
            path: path.to_path_buf(),
            line: e.line,
        },
    };
    for (n, v, line) in &e.attrs {
        if let Some((_, key)) = map.iter().find(|(a, _)| a.eq_ignore_ascii_case(n)) {
            o.directives.push(directive(path, n, key, v, *line));
        }
    }
    src.plugins.push(o);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::translate;

    const DSE: &str = "dn: cn=config\nobjectClass: top\nobjectClass: nsslapdConfig\ncn: config\n\
nsslapd-port: 389\nnsslapd-secureport: 636\nnsslapd-security: on\nnsslapd-sizelimit: 2000\n\
nsslapd-rootdn: cn=Directory Manager\nnsslapd-rootpw: {SSHA}E3/kFvAfzWZcELXjSLJ5SYQrafK/NHqi\n\
nsslapd-accesslog-logging-enabled: on\nnsslapd-allow-anonymous-access: on\n\n\
dn: cn=encryption,cn=config\nobjectClass: nsEncryptionConfig\ncn: encryption\nsslVersionMin: TLS1.2\nnsSSLClientAuth: allowed\n\n\
dn: cn=userRoot,cn=ldbm database,cn=plugins,cn=config\nobjectClass: nsBackendInstance\ncn: userRoot\nnsslapd-suffix: dc=example,dc=com\n\n\
dn: cn=uid,cn=index,cn=userRoot,cn=ldbm database,cn=plugins,cn=config\nobjectClass: nsIndex\ncn: uid\nnsSystemIndex: false\nnsIndexType: eq\nnsIndexType: pres\n\n\
dn: cn=entryrdn,cn=index,cn=userRoot,cn=ldbm database,cn=plugins,cn=config\nobjectClass: nsIndex\ncn: entryrdn\nnsSystemIndex: true\nnsIndexType: subtree\n\n\
dn: cn=MemberOf Plugin,cn=plugins,cn=config\nobjectClass: nsSlapdPlugin\ncn: MemberOf Plugin\nnsslapd-pluginPath: libmemberof-plugin\nnsslapd-pluginEnabled: on\nmemberofgroupattr: uniqueMember\nmemberofattr: memberOf\n\n\
dn: cn=replica,cn=dc\\3Dexample\\2Cdc\\3Dcom,cn=mapping tree,cn=config\nobjectClass: nsds5Replica\nnsDS5ReplicaId: 3\n";

    const DATA: &str = "dn: dc=example,dc=com\nobjectClass: domain\ndc: example\n\
aci: (targetattr=\"cn || uid || mail || nsUniqueId\")(targetfilter=\"(objectClass=person)\")(version 3.0; acl \"Enable anyone user read\"; allow (read, search, compare)(userdn=\"ldap:///anyone\");)\n\
aci: (targetattr=\"userPassword || telephoneNumber\")(version 3.0; acl \"Enable self partial modify\"; allow (write)(userdn=\"ldap:///self\");)\n\
aci: (targetattr=\"*\")(version 3.0; acl \"admins\"; allow (all) groupdn=\"ldap:///cn=admins,dc=example,dc=com\";)\n\
aci: (targetattr != \"userPassword\")(version 3.0; acl \"not mapped\"; allow (read) userdn=\"ldap:///all\";)\n\n\
dn: ou=People,dc=example,dc=com\nobjectClass: organizationalUnit\nou: People\n";

    /// What a dse.ldif written by `dscreate` holds beside the settings:
    /// binary values (the unique ID generator's nsState) and index entries
    /// named in lower case (`memberuid`), where Pando's defaults say
    /// `memberUid`.
    #[test]
    fn binary_values_and_index_names_in_another_case() {
        let dir = tempfile::tempdir().unwrap();
        let dse = dir.path().join("dse.ldif");
        let text = format!(
            "{DSE}\ndn: cn=uniqueid generator,cn=config\nobjectClass: extensibleObject\n\
nsState:: gGynhQLr8QHkAeZrDK6cWgEAAAAAAAAA\ncn: uniqueid generator\n\n\
dn: cn=memberuid,cn=index,cn=userRoot,cn=ldbm database,cn=plugins,cn=config\nobjectClass: nsIndex\n\
cn: memberuid\nnsSystemIndex: false\nnsIndexType: eq\nnsIndexType: pres\n"
        );
        std::fs::write(&dse, text).unwrap();
        let t = translate(&read(&dse, None).unwrap());
        let memberuid: Vec<_> = t
            .config
            .indexes
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("memberUid"))
            .collect();
        assert_eq!(memberuid.len(), 1, "{:?}", t.config.indexes);
        assert!(
            memberuid[0].1.contains(&"pres".to_string()),
            "{memberuid:?}"
        );
        // A DN is still text.
        std::fs::write(&dse, "dn:: gGynhQLr8QHk\nobjectClass: top\n").unwrap();
        assert!(read(&dse, None).unwrap_err().contains("DN is not UTF-8"));
    }

    #[test]
    fn a_dse_ldif_and_its_acis() {
        let dir = tempfile::tempdir().unwrap();
        let (dse, data) = (dir.path().join("dse.ldif"), dir.path().join("data.ldif"));
        std::fs::write(&dse, DSE).unwrap();
        std::fs::write(&data, DATA).unwrap();
        assert!(is_dse(&dse) && !is_dse(&data));
        let t = translate(&read(&dse, Some(&data)).unwrap());
        let c = &t.config;
        assert_eq!(c.suffixes, ["dc=example,dc=com"]);
        assert_eq!(c.root_dn.as_deref(), Some("cn=Directory Manager"));
        // No PEM certificate (389-DS keeps it in NSS): no ldaps listener and
        // no client certificates yet, both said in the report.
        assert_eq!(c.listen, ["ldap://0.0.0.0:389", "ldapi://"]);
        assert_eq!((c.limits.size_limit, c.replication.server_id), (2000, 3));
        assert_eq!(
            (c.tls.min_version.as_str(), c.tls.client_certs.as_str()),
            ("1.2", "none")
        );
        assert_eq!(c.indexes["uid"], ["eq", "sub", "pres"]);
        assert!(!c.indexes.contains_key("entryrdn"));
        assert!(
            matches!(&c.overlay[..], [pando_config::overlay::OverlayConfig::Memberof(m)] if m.member_attributes == ["uniqueMember"])
        );
        let report = t.report.to_string();
        assert!(
            report.contains("nsslapd-accesslog-logging-enabled"),
            "{report}"
        );
        assert!(
            report.contains("not mapped") && report.contains("targetattr !="),
            "{report}"
        );
        assert!(report.contains("nsUniqueId"), "{report}");
        // Rules: who sees entries (people, the rest, any entry as a search
        // base), then person attributes (read for anyone), self
        // phone/password, the group's all, and binds for everyone.
        let rules: Vec<String> = t
            .rules
            .iter()
            .map(|r| {
                format!(
                    "{:?} {:?}",
                    r.rule.attrs,
                    r.rule
                        .by
                        .iter()
                        .map(|b| b.who.items().join("&"))
                        .collect::<Vec<_>>()
                )
            })
            .collect();
        // Attributes one rule each where their clauses differ (userPassword
        // also lets everyone bind), then binds, then the root DN's rest.
        assert_eq!(rules.len(), 9, "{rules:#?}");
        assert!(
            rules[3].starts_with(r#"Some(["cn", "uid", "mail"])"#),
            "{rules:#?}"
        );
        assert!(rules[7].contains("userPassword"), "{rules:#?}");
        assert!(rules[8].starts_with("None"), "{rules:#?}");
        assert!(rules.iter().all(|r| r.contains("admins")), "{rules:#?}");
    }
}
