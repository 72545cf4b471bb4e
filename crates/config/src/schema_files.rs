//! Extra schema files named by `schema_files` in the configuration, added
//! at start after the built-in schema, in the order given, in either of the
//! forms schemas ship in:
//! - OpenLDAP `.schema` text (`attributetype`, `objectclass`,
//!   `objectidentifier`, `ldapsyntax`), the form of `include` files;
//! - `cn=schema` LDIF (`olcAttributeTypes`, `olcObjectClasses`,
//!   `olcObjectIdentifier`, `olcLdapSyntaxes`, or the same without `olc`),
//!   the form of `slapd.d` and of `ldapadd -f x.ldif` on cn=config; `{n}`
//!   ordering prefixes are dropped.
//!
//! Any problem stops the start with the file, the line and what is wrong.

use std::path::Path;

use base64::Engine;
use pando_model::{PosixSchema, Schema};

/// The built-in schema (with the NIS definitions `posix_schema` names),
/// then `schema_files`, then the `[[schema]]` documents.
pub fn build(cfg: &crate::Config) -> Result<Schema, String> {
    let posix = PosixSchema::parse(&cfg.posix_schema).ok_or_else(|| {
        format!(
            "posix_schema: '{}' is not one of {}",
            cfg.posix_schema,
            PosixSchema::NAMES.join(", ")
        )
    })?;
    let mut schema = Schema::standard_with(posix);
    for path in &cfg.schema_files {
        add_file(&mut schema, path)?;
    }
    for (i, doc) in cfg.schema.iter().enumerate() {
        add_doc(&mut schema, doc)
            .map_err(|e| format!("cn={{{i}}}{},cn=schema,cn=config: {e}", doc.name))?;
    }
    Ok(schema)
}

/// One document's definitions, in the order slapd applies an entry's:
/// macros, syntaxes, attribute types, object classes.
pub fn add_doc(schema: &mut Schema, doc: &crate::SchemaDoc) -> Result<(), String> {
    for (keyword, attr, values) in [
        (
            "objectidentifier",
            "olcObjectIdentifier",
            &doc.object_identifiers,
        ),
        ("ldapsyntax", "olcLdapSyntaxes", &doc.ldap_syntaxes),
        ("attributetype", "olcAttributeTypes", &doc.attribute_types),
        ("objectclass", "olcObjectClasses", &doc.object_classes),
    ] {
        for (j, v) in values.iter().enumerate() {
            schema
                .add_definitions(&format!("{keyword} {v}"))
                .map_err(|e| format!("{attr} {{{j}}}: {}", e.message))?;
        }
    }
    Ok(())
}

fn add_file(schema: &mut Schema, path: &Path) -> Result<(), String> {
    let at =
        |line: usize, what: &str| format!("schema file {}, line {line}: {what}", path.display());
    let bytes = std::fs::read(path).map_err(|e| format!("schema file {}: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("schema file {}: not UTF-8 ({e})", path.display()))?;
    if !is_ldif(&text) {
        return schema
            .add_definitions(&text)
            .map_err(|e| at(e.line, &e.message));
    }
    let mut defs = Vec::new();
    for line in unfold(&text) {
        if let Some((keyword, value)) = definition(&line.text).map_err(|e| at(line.number, &e))? {
            defs.push((keyword, value, line.number));
        }
    }
    // As slapd applies a cn=schema entry: macros, syntaxes, attribute
    // types, object classes, each kind in file order.
    let rank = |k: &str| KINDS.iter().position(|x| *x == k).unwrap_or(KINDS.len());
    defs.sort_by_key(|(keyword, _, _)| rank(keyword));
    for (keyword, value, line) in defs {
        schema
            .add_definitions(&format!("{keyword} {value}"))
            .map_err(|e| at(line, &e.message))?;
    }
    Ok(())
}

/// The order the definitions of one LDIF file are applied in.
const KINDS: [&str; 4] = [
    "objectidentifier",
    "ldapsyntax",
    "attributetype",
    "objectclass",
];

/// LDIF when the first line that is not a comment or blank starts a
/// record (`dn:`) or a version line.
fn is_ldif(text: &str) -> bool {
    text.lines()
        .map(str::trim_start)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .is_some_and(|l| {
            let l = l.to_ascii_lowercase();
            l.starts_with("dn:") || l.starts_with("version:")
        })
}

/// One LDIF line with its continuations joined, and where it starts.
struct Logical {
    number: usize,
    text: String,
}

/// RFC 2849: a line starting with one space continues the previous one;
/// comments (`#` in column 0, with their own continuations) are left out
/// wherever they are.
fn unfold(text: &str) -> Vec<Logical> {
    let mut out: Vec<Logical> = Vec::new();
    let mut in_comment = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with('#') || (in_comment && line.starts_with(' ')) {
            in_comment = true;
            continue;
        }
        in_comment = false;
        match (line.strip_prefix(' '), out.last_mut()) {
            (Some(rest), Some(last)) if !last.text.is_empty() => last.text.push_str(rest),
            _ => out.push(Logical {
                number: i + 1,
                text: line.to_string(),
            }),
        }
    }
    out
}

/// The schema-file keyword and the description of a schema attribute
/// line; None for any other line (dn, objectClass, cn, …).
fn definition(line: &str) -> Result<Option<(&'static str, String)>, String> {
    let Some((attr, rest)) = line.split_once(':') else {
        return Ok(None);
    };
    let keyword = match attr.trim().to_ascii_lowercase().as_str() {
        "olcattributetypes" | "attributetypes" => "attributetype",
        "olcobjectclasses" | "objectclasses" => "objectclass",
        "olcobjectidentifier" => "objectidentifier",
        "olcldapsyntaxes" | "ldapsyntaxes" => "ldapsyntax",
        _ => return Ok(None),
    };
    let value = match rest.strip_prefix(':') {
        Some(b64) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| format!("{attr}: invalid base64 ({e})"))?;
            String::from_utf8(raw).map_err(|_| format!("{attr}: the value is not UTF-8"))?
        }
        None => rest.trim().to_string(),
    };
    // `{3}( 1.2.3 NAME …` → `( 1.2.3 NAME …`: the ordering prefix.
    let value = match value.strip_prefix('{').and_then(|v| v.split_once('}')) {
        Some((n, v)) if n.bytes().all(|b| b.is_ascii_digit()) => v.trim().to_string(),
        _ => value,
    };
    Ok(Some((keyword, value)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn load(files: &[PathBuf]) -> Result<Schema, String> {
        build(&crate::Config {
            schema_files: files.to_vec(),
            ..Default::default()
        })
    }

    #[test]
    fn posix_schema_chooses_the_nis_definitions() {
        let with = |name: &str| {
            build(&crate::Config {
                posix_schema: name.to_string(),
                ..Default::default()
            })
        };
        let kind = |s: &Schema| s.object_class("posixGroup").unwrap().kind;
        assert_eq!(
            kind(&with("rfc2307").unwrap()),
            pando_model::ObjectClassKind::Structural
        );
        assert_eq!(
            kind(&with("rfc2307bis").unwrap()),
            pando_model::ObjectClassKind::Auxiliary
        );
        assert_eq!(
            with("rfc2307-bis").unwrap_err(),
            "posix_schema: 'rfc2307-bis' is not one of rfc2307, rfc2307bis"
        );
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn both_forms_load_and_define_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let text = write(
            dir.path(),
            "site.schema",
            "# a site schema\nobjectidentifier siteOID 1.3.6.1.4.1.99999\n\
             objectidentifier siteAT siteOID:1\n\
             attributetype ( siteAT:1 NAME 'siteBadge'\n    EQUALITY caseIgnoreMatch\n    \
             SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n\n\
             objectclass ( siteOID:2.1 NAME 'sitePerson' SUP inetOrgPerson\n    \
             AUXILIARY MAY siteBadge )\n",
        );
        let ldif = write(
            dir.path(),
            "site.ldif",
            "dn: cn=site,cn=schema,cn=config\nobjectClass: olcSchemaConfig\ncn: site\n\
             olcObjectIdentifier: {0}roomOID 1.3.6.1.4.1.99998\n\
             # a comment inside the record\n\
             olcAttributeTypes: {0}( roomOID:1.1 NAME 'siteRoom'\n  EQUALITY caseIgnoreMatch\n  \
             SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n\
             olcObjectClasses:: ezF9KCByb29tT0lEOjIuMSBOQU1FICdzaXRlUm9vbUhvbGRlcicgQVVYSUxJQVJZIE1BWSBzaXRlUm9vbSAp\n",
        );
        let s = load(&[text, ldif]).unwrap();
        assert_eq!(
            s.attribute("siteBadge").unwrap().oid,
            "1.3.6.1.4.1.99999.1.1"
        );
        assert_eq!(
            s.attribute("siteRoom").unwrap().oid,
            "1.3.6.1.4.1.99998.1.1"
        );
        assert!(s.object_class("sitePerson").is_some());
        assert!(s.object_class("siteRoomHolder").is_some());
    }

    #[test]
    fn ldif_definitions_apply_by_kind_and_folded_comments_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let ldif = write(
            dir.path(),
            "order.ldif",
            "dn: cn=order,cn=schema,cn=config\r\n\
             olcObjectClasses: ( orderOID:2 NAME 'orderThing' AUXILIARY MAY orderAttr )\r\n\
             # a comment that goes on\r\n  on the next line\r\n\
             olcAttributeTypes: ( orderOID:1 NAME 'orderAttr'\r\n  SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\r\n\
             olcObjectIdentifier: orderOID 1.3.6.1.4.1.99997\r\n",
        );
        let s = load(&[ldif]).unwrap();
        assert_eq!(s.attribute("orderAttr").unwrap().oid, "1.3.6.1.4.1.99997.1");
        assert!(s.object_class("orderThing").is_some());
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let bad = write(
            dir.path(),
            "bad.schema",
            "attributetype ( 1.2.3.4.5 NAME 'x1' SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n\n\
             objectclass ( 1.2.3.4.6 NAME 'x2' SUP noSuchClass AUXILIARY )\n",
        );
        let e = load(&[bad]).unwrap_err();
        assert!(
            e.contains("bad.schema, line 3") && e.contains("noSuchClass"),
            "{e}"
        );
        let dup = write(
            dir.path(),
            "dup.ldif",
            "dn: cn=dup,cn=schema,cn=config\n\
             olcAttributeTypes: ( 2.5.4.3 NAME 'notCn' SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n",
        );
        let e = load(&[dup]).unwrap_err();
        assert!(e.contains("dup.ldif, line 2"), "{e}");
        let e = load(&[dir.path().join("missing.schema")]).unwrap_err();
        assert!(e.contains("missing.schema"), "{e}");
    }
}
