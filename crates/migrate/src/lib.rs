//! `pando migrate`: an OpenLDAP configuration (slapd.d or slapd.conf) →
//! a Pando configuration file, the schema files it needs, and a report of
//! everything not translated exactly (docs/migrating.md).
//!
//! - [`source`] reads both forms into one shape;
//! - [`acl`] translates access rules;
//! - [`translate`] the rest (suffixes, root DN, indexes, limits, TLS,
//!   overlays, replication, schema);
//! - [`report`] the findings.
//!
//! The result is checked the way `pando serve` would check it (schema
//! built, configuration validated, access rules compiled) before anything
//! is written.

pub mod aci;
pub mod acl;
pub mod dse;
pub mod report;
pub mod source;
pub mod translate;

use std::path::{Path, PathBuf};

use pando_config::Config;
use pando_server::settings::Validate;

pub use report::{Report, Severity};

/// A finished migration, not yet written.
pub struct Migration {
    pub config: Config,
    /// The configuration file's text (commented access rules).
    pub toml: String,
    pub report: Report,
    /// Schema files to copy: (file name in `<out>/schema/`, source).
    pub schema_files: Vec<(String, PathBuf)>,
    /// Files of `<out>/secrets/` (0600): (file name, content).
    pub secrets: Vec<(String, String)>,
}

/// Debug never shows the secrets' contents.
impl std::fmt::Debug for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.secrets.iter().map(|(n, _)| n.as_str()).collect();
        write!(
            f,
            "Migration {{ report: {} findings, secrets: {names:?} }}",
            self.report.findings.len()
        )
    }
}

/// Read `from` and translate it; `out` is where the files will go (schema
/// file paths in the configuration point there).
pub fn migrate(from: &Path, out: &Path) -> Result<Migration, String> {
    migrate_with(from, None, out)
}

/// [`migrate`], with 389-DS ACIs also read from a data export.
pub fn migrate_with(
    from: &Path,
    acis_from: Option<&Path>,
    out: &Path,
) -> Result<Migration, String> {
    let src = match acis_from {
        Some(data) if dse::is_dse(from) => dse::read(from, Some(data))?,
        Some(_) => return Err("--acis-from goes with a 389 Directory Server dse.ldif".into()),
        None => source::read(from)?,
    };
    let t = translate::translate(&src);
    let mut config = t.config;
    let schema_dir = absolute(&out.join("schema"));
    let mut schema_files = Vec::new();
    for (name, path) in &t.schema_files {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_else(|| "schema".into());
        let file = format!("{name}.{ext}");
        config.schema_files.push(schema_dir.join(&file));
        schema_files.push((file, path.clone()));
    }
    let secrets_dir = absolute(&out.join("secrets"));
    let mut secrets = Vec::new();
    for (rid, secret) in &t.secrets {
        let name = format!("syncrepl-rid-{rid:03}");
        for c in config
            .replication
            .consumer
            .iter_mut()
            .filter(|c| c.rid == *rid)
        {
            c.credentials_file = Some(secrets_dir.join(&name));
        }
        secrets.push((name, secret.clone()));
    }
    config.access = t.rules.iter().map(|r| r.rule.to_rule()).collect();
    // Check as `pando serve` would, against the source files (the copies
    // do not exist yet).
    let mut check = config.clone();
    check.schema_files = t.schema_files.iter().map(|(_, p)| p.clone()).collect();
    let schema = pando_config::schema_files::build(&check)?;
    check
        .clone()
        .validate(&schema)
        .map_err(|e| format!("the translated configuration does not validate: {e}"))?;
    let toml = render(&config, &t.rules, from)?;
    Ok(Migration {
        config,
        toml,
        report: t.report,
        schema_files,
        secrets,
    })
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

impl Migration {
    /// Write `pando.toml`, `migration-report.txt` and `schema/` into `out`
    /// (created; existing files of those names are replaced).
    pub fn write(&self, out: &Path) -> Result<(), String> {
        let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
        if !self.schema_files.is_empty() {
            let dir = out.join("schema");
            std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
            for (name, from) in &self.schema_files {
                let to = dir.join(name);
                std::fs::copy(from, &to).map_err(|e| io(from, e))?;
            }
        }
        if !self.secrets.is_empty() {
            let dir = out.join("secrets");
            std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| io(&dir, e))?;
            for (name, secret) in &self.secrets {
                let p = dir.join(name);
                write_private(&p, format!("{secret}\n").as_bytes()).map_err(|e| io(&p, e))?;
            }
        }
        let cfg = out.join("pando.toml");
        write_private(&cfg, self.toml.as_bytes()).map_err(|e| io(&cfg, e))?;
        let rep = out.join("migration-report.txt");
        std::fs::write(&rep, self.report.to_string()).map_err(|e| io(&rep, e))?;
        Ok(())
    }
}

/// The configuration may hold a password hash: 0600.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// Keys that differ from Pando's defaults, then the access rules, each
/// under a comment naming the rule(s) it came from.
fn render(cfg: &Config, rules: &[translate::RuleOut], from: &Path) -> Result<String, String> {
    let ser = |c: &Config| {
        toml::Value::try_from(c).map_err(|e| format!("cannot write the configuration: {e}"))
    };
    let mut mine = ser(cfg)?;
    let defaults = ser(&Config::default())?;
    if let toml::Value::Table(t) = &mut mine {
        t.remove("access");
    }
    let diff = differences(&mine, &defaults).unwrap_or(toml::Value::Table(Default::default()));
    let mut out = format!(
        "# Pando configuration translated from {} by `pando migrate`.\n\
         # What could not be translated exactly is in migration-report.txt beside this file.\n\n",
        from.display()
    );
    out.push_str(&toml::to_string(&diff).map_err(|e| e.to_string())?);
    for r in rules {
        out.push('\n');
        for line in r.origin.lines() {
            out.push_str(&format!("# from {line}\n"));
        }
        out.push_str(&render_rule(&r.rule.to_rule()));
    }
    Ok(out)
}

/// One `[[access]]` table with its clauses inline, as docs/access-control.md
/// writes them.
fn render_rule(rule: &pando_config::AccessRule) -> String {
    use pando_config::OneOrMany;
    let s = |v: &str| toml::Value::String(v.to_string()).to_string();
    let many = |v: &OneOrMany| match v {
        OneOrMany::One(x) => s(x),
        OneOrMany::Many(xs) => format!(
            "[{}]",
            xs.iter().map(|x| s(x)).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut out = String::from("[[access]]\n");
    for (key, value) in [
        ("dn", &rule.dn),
        ("scope", &rule.scope),
        ("dn_regex", &rule.dn_regex),
        ("filter", &rule.filter),
    ] {
        if let Some(v) = value {
            out.push_str(&format!("{key} = {}\n", s(v)));
        }
    }
    if let Some(attrs) = &rule.attrs {
        out.push_str(&format!(
            "attrs = {}\n",
            many(&OneOrMany::Many(attrs.clone()))
        ));
    }
    out.push_str("by = [\n");
    for b in &rule.by {
        out.push_str(&format!(
            "  {{ who = {}, rights = {} }},\n",
            many(&b.who),
            many(&b.rights)
        ));
    }
    out.push_str("]\n");
    out
}

/// Tables that are maps, not structs: a key left out of the file is
/// gone, not defaulted, so they are written whole when they differ.
const WHOLE_TABLES: &[&str] = &["indexes"];

/// The parts of `a` that differ from `b` (None: nothing differs).
fn differences(a: &toml::Value, b: &toml::Value) -> Option<toml::Value> {
    match (a, b) {
        (toml::Value::Table(ta), toml::Value::Table(tb)) => {
            let mut out = toml::map::Map::new();
            for (k, va) in ta {
                match tb.get(k) {
                    Some(vb) => {
                        if let Some(d) = differences(va, vb) {
                            // Structs are compared key by key; anything else whole.
                            let whole = !va.is_table() || WHOLE_TABLES.contains(&k.as_str());
                            out.insert(k.clone(), if whole { va.clone() } else { d });
                        }
                    }
                    None => {
                        out.insert(k.clone(), va.clone());
                    }
                }
            }
            (!out.is_empty()).then_some(toml::Value::Table(out))
        }
        _ => (a != b).then(|| a.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_file_reads_back_as_the_translated_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("slapd.conf");
        std::fs::write(
            &conf,
            "database mdb\nsuffix dc=x\nrootdn cn=m,dc=x\nindex telephoneNumber eq\nsizelimit 20\n\
             access to * by users read\n\
             overlay memberof\nsyncrepl rid=2 provider=ldap://h binddn=cn=r,dc=x credentials=pw searchbase=dc=x\n",
        )
        .unwrap();
        let m = migrate(&conf, &dir.path().join("out")).unwrap();
        let back: Config = toml::from_str(&m.toml).unwrap();
        // Indexes are a map: written whole, Pando's defaults included.
        assert_eq!(back.indexes, m.config.indexes);
        assert!(
            back.indexes.contains_key("member") && back.indexes.contains_key("telephoneNumber")
        );
        assert_eq!(back, m.config);
    }
}
