//! Reading an OpenLDAP configuration, in either form, into one shape:
//! the global section, then each database with its directives and its
//! overlays'. Every directive keeps where it came from (file and line)
//! and its text, for the migration report.
//!
//! - `slapd.conf`: `keyword args…` lines, a line starting with white
//!   space continuing the one before, `#` comments, `include` of schema
//!   files (or of more configuration), `database` and `overlay` opening
//!   sections.
//! - `slapd.d`: one LDIF entry per file (`cn=config.ldif`,
//!   `cn=config/olcDatabase={1}mdb.ldif`, its overlays in
//!   `olcDatabase={1}mdb/olcOverlay={0}memberof.ldif`, schema in
//!   `cn=config/cn=schema/`). An `olcX` attribute is the directive `x`;
//!   the `{n}` ordering prefixes of values are dropped.
//!
//! Keywords are compared in one canonical form ([`canonical`]): lower
//! case, `-` and `_` removed, and for cn=config names the `olc` (and
//! `olcDb`) prefix removed, so `olcDbIndex` and `index`,
//! `olcMemberOfGroupOC` and `memberof-group-oc` are the same key.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;

/// Where a directive was read.
#[derive(Clone, Debug, PartialEq)]
pub struct Origin {
    pub path: PathBuf,
    pub line: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.path.display(), self.line)
    }
}

/// One configuration statement.
#[derive(Clone, Debug)]
pub struct Directive {
    /// Canonical keyword (see the module docs).
    pub key: String,
    /// The keyword as written (`olcAccess`, `access`).
    pub keyword: String,
    /// Everything after the keyword, `{n}` prefix removed.
    pub value: String,
    /// Read from cn=config LDIF (a value is one argument unless the
    /// directive is one of those written as several words).
    pub from_ldif: bool,
    pub origin: Origin,
}

impl Directive {
    /// The text as the report quotes it.
    pub fn text(&self) -> String {
        if self.from_ldif {
            format!("{}: {}", self.keyword, self.value)
        } else {
            format!("{} {}", self.keyword, self.value)
        }
    }

    /// The words of the value (double quotes group, `\` escapes inside).
    pub fn words(&self) -> Result<Vec<String>, String> {
        words(&self.value)
    }

    /// The value as one argument: cn=config values are taken whole; a
    /// slapd.conf line must hold exactly one word.
    pub fn single(&self) -> Result<String, String> {
        if self.from_ldif {
            return Ok(self.value.trim().to_string());
        }
        let w = self.words()?;
        match w.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(format!("'{}' takes one value", self.keyword)),
        }
    }
}

/// A `database` section (or the global one) with its overlays.
#[derive(Clone, Debug, Default)]
pub struct Section {
    /// `mdb`, `frontend`, `config`, `monitor`…; empty for the global section.
    pub kind: String,
    pub directives: Vec<Directive>,
    pub overlays: Vec<Overlay>,
    pub origin: Option<Origin>,
}

impl Section {
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a Directive> + 'a {
        self.directives.iter().filter(move |d| d.key == key)
    }

    pub fn first<'a>(&'a self, key: &'a str) -> Option<&'a Directive> {
        self.all(key).next()
    }
}

#[derive(Clone, Debug)]
pub struct Overlay {
    pub name: String,
    pub directives: Vec<Directive>,
    pub origin: Origin,
}

/// Schema the configuration loads beyond slapd's built-in definitions.
#[derive(Clone, Debug)]
pub struct SchemaSource {
    /// `core`, `cosine`, `nis`, `mysite`…
    pub name: String,
    /// The file (a `.schema` include, or a cn=schema LDIF entry file).
    pub path: PathBuf,
    pub origin: Origin,
}

/// Which server wrote the configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SourceKind {
    #[default]
    OpenLdap,
    /// 389 Directory Server (dse.ldif): access control is `aci` values.
    Dirsrv,
}

/// A whole configuration.
#[derive(Clone, Debug, Default)]
pub struct Source {
    pub kind: SourceKind,
    /// 389-DS: (entry DN, aci value, where) of every ACI found.
    pub acis: Vec<(String, String, Origin)>,
    /// 389-DS: server-wide plugins Pando has, as overlays.
    pub plugins: Vec<Overlay>,
    pub global: Section,
    /// In order; the frontend (`database frontend`, `olcDatabase={-1}frontend`)
    /// is among them with kind `frontend`.
    pub databases: Vec<Section>,
    pub schema: Vec<SchemaSource>,
    /// `moduleload` / `olcModuleLoad` values (reported, not needed).
    pub modules: Vec<Directive>,
}

impl Source {
    pub fn frontend(&self) -> Option<&Section> {
        self.databases.iter().find(|d| d.kind == "frontend")
    }
}

/// The canonical form of a keyword.
pub fn canonical(keyword: &str) -> String {
    let k = if let Some(rest) = keyword.strip_prefix("olc") {
        match rest.strip_prefix("Db") {
            Some(r) if r.starts_with(|c: char| c.is_ascii_uppercase()) => r,
            _ => rest,
        }
    } else {
        keyword
    };
    k.chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Split at white space outside double quotes; `\` escapes the next
/// character inside quotes.
pub fn words(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e) => {
                                // Keep the escape for characters regular
                                // expressions and DNs give meaning to.
                                if e != '"' && e != '\\' {
                                    cur.push('\\');
                                }
                                cur.push(e)
                            }
                            None => return Err("a quoted value ends with '\\'".into()),
                        },
                        Some(ch) => cur.push(ch),
                        None => return Err("a quoted value has no closing '\"'".into()),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Read `path`: a slapd.d directory (holding `cn=config.ldif`) or a
/// slapd.conf file.
pub fn read(path: &Path) -> Result<Source, String> {
    if crate::dse::is_dse(path) {
        crate::dse::read(path, None)
    } else if path.is_dir() {
        read_slapd_d(path)
    } else {
        let mut src = Source::default();
        let mut state = ConfState::default();
        read_conf(path, &mut src, &mut state, 0)?;
        state.flush(&mut src);
        Ok(src)
    }
}

// ---------------------------------------------------------------- slapd.conf

#[derive(Default)]
struct ConfState {
    /// The section being read: None = global.
    db: Option<Section>,
    overlay: Option<Overlay>,
}

impl ConfState {
    fn close_overlay(&mut self, src: &mut Source) {
        if let Some(o) = self.overlay.take() {
            match self.db.as_mut() {
                Some(db) => db.overlays.push(o),
                None => src.global.overlays.push(o),
            }
        }
    }

    fn flush(&mut self, src: &mut Source) {
        self.close_overlay(src);
        if let Some(db) = self.db.take() {
            src.databases.push(db);
        }
    }

    fn push(&mut self, src: &mut Source, d: Directive) {
        // slapd hands what an overlay does not know on to its database.
        let for_database = DATABASE_KEYS.contains(&d.key.as_str());
        if let (Some(o), false) = (self.overlay.as_mut(), for_database) {
            o.directives.push(d);
        } else if let Some(db) = self.db.as_mut() {
            db.directives.push(d);
        } else {
            src.global.directives.push(d);
        }
    }
}

/// Logical lines of a slapd.conf file: (first line number, text).
fn conf_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches('\r');
        if line.trim_start().starts_with('#') && !line.starts_with([' ', '\t']) {
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if let Some(last) = out.last_mut() {
                last.1.push(' ');
                last.1.push_str(line.trim());
                continue;
            }
        }
        out.push((i + 1, line.to_string()));
    }
    out
}

const MAX_INCLUDE_DEPTH: usize = 16;

/// Database directives, which belong to the database even when written
/// after an `overlay` line.
const DATABASE_KEYS: &[&str] = &[
    "access",
    "index",
    "limits",
    "sizelimit",
    "timelimit",
    "suffix",
    "rootdn",
    "rootpw",
    "directory",
    "maxsize",
    "checkpoint",
    "syncrepl",
    "multiprovider",
    "mirrormode",
    "updateref",
    "readonly",
    "lastmod",
    "dbnosync",
    "envflags",
    "maxreaders",
    "monitoring",
    "hidden",
];

fn read_conf(
    path: &Path,
    src: &mut Source,
    st: &mut ConfState,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_INCLUDE_DEPTH {
        return Err(format!("{}: includes nested too deeply", path.display()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for (line, content) in conf_lines(&text) {
        let origin = Origin {
            path: path.to_path_buf(),
            line,
        };
        let (keyword, value) = match content.trim().split_once(char::is_whitespace) {
            Some((k, v)) => (k.to_string(), v.trim().to_string()),
            None => (content.trim().to_string(), String::new()),
        };
        let d = Directive {
            key: canonical(&keyword),
            keyword,
            value,
            from_ldif: false,
            origin: origin.clone(),
        };
        match d.key.as_str() {
            "include" => {
                let file = PathBuf::from(d.single().map_err(|e| format!("{origin}: {e}"))?);
                if is_schema_file(&file) {
                    src.schema.push(SchemaSource {
                        name: schema_name(&file),
                        path: file,
                        origin,
                    });
                } else {
                    read_conf(&file, src, st, depth + 1)
                        .map_err(|e| format!("{e} (included at {origin})"))?;
                }
            }
            "database" => {
                st.flush(src);
                st.db = Some(Section {
                    kind: d.single().map_err(|e| format!("{origin}: {e}"))?,
                    directives: Vec::new(),
                    overlays: Vec::new(),
                    origin: Some(origin),
                });
            }
            "overlay" => {
                st.close_overlay(src);
                st.overlay = Some(Overlay {
                    name: d.single().map_err(|e| format!("{origin}: {e}"))?,
                    directives: Vec::new(),
                    origin,
                });
            }
            "moduleload" => src.modules.push(d),
            _ => st.push(src, d),
        }
    }
    Ok(())
}

/// Does an included file hold only schema definitions?
fn is_schema_file(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return path.extension().is_some_and(|e| e == "schema");
    };
    let mut any = false;
    for (_, l) in conf_lines(&text) {
        let kw = canonical(l.split_whitespace().next().unwrap_or(""));
        match kw.as_str() {
            "attributetype" | "attributetypes" | "objectclass" | "objectclasses"
            | "objectidentifier" | "ldapsyntax" | "ldapsyntaxes" | "attributeype" => any = true,
            _ => return false,
        }
    }
    any
}

fn schema_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // cn={3}nis → nis
    let stem = stem.strip_prefix("cn=").unwrap_or(&stem);
    match stem.strip_prefix('{').and_then(|s| s.split_once('}')) {
        Some((_, rest)) => rest.to_string(),
        None => stem.to_string(),
    }
}

// ------------------------------------------------------------------ slapd.d

/// One LDIF entry: DN, (attribute, value, line), and the line of its DN.
pub struct LdifEntry {
    pub dn: String,
    pub attrs: Vec<(String, String, usize)>,
    pub line: usize,
}

impl LdifEntry {
    /// Values of `name` (case-insensitive).
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.attrs
            .iter()
            .filter(move |(n, _, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v, _)| v.as_str())
    }

    pub fn has_class(&self, class: &str) -> bool {
        self.values("objectClass")
            .any(|v| v.eq_ignore_ascii_case(class))
    }
}

/// Every entry of an LDIF file (records separated by blank lines; `#`
/// comments, continuation lines and base64 values).
pub fn read_ldif(path: &Path) -> Result<Vec<LdifEntry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // Logical lines; None marks a record boundary.
    let mut lines: Vec<Option<(usize, String)>> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let l = raw.trim_end_matches('\r');
        if l.starts_with('#') {
            continue;
        }
        if let Some(cont) = l.strip_prefix(' ') {
            match lines.last_mut() {
                Some(Some(last)) => last.1.push_str(cont),
                _ => {
                    return Err(format!(
                        "{}:{}: a continuation line with nothing to continue",
                        path.display(),
                        i + 1
                    ))
                }
            }
            continue;
        }
        lines.push((!l.is_empty()).then(|| (i + 1, l.to_string())));
    }
    let mut out = Vec::new();
    let mut cur: Option<LdifEntry> = None;
    for item in lines {
        let Some((line, l)) = item else {
            out.extend(cur.take());
            continue;
        };
        let at = |m: &str| format!("{}:{line}: {m}", path.display());
        let (name, rest) = l
            .split_once(':')
            .ok_or_else(|| at("not 'attribute: value'"))?;
        let value = if let Some(b64) = rest.strip_prefix(':') {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| at(&format!("bad base64 value: {e}")))?;
            match String::from_utf8(bytes) {
                Ok(v) => v,
                // A DN must be text; other binary values (389-DS's nsState,
                // a jpegPhoto in a data export) configure nothing read here.
                Err(_) if name.eq_ignore_ascii_case("dn") => return Err(at("DN is not UTF-8")),
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            }
        } else {
            rest.trim_start().to_string()
        };
        match cur.as_mut() {
            None if name.eq_ignore_ascii_case("dn") => {
                cur = Some(LdifEntry {
                    dn: value,
                    attrs: Vec::new(),
                    line,
                })
            }
            None if name.eq_ignore_ascii_case("version") => {}
            None => return Err(at("an entry must start with a dn: line")),
            Some(e) => e.attrs.push((name.to_string(), value, line)),
        }
    }
    out.extend(cur);
    Ok(out)
}

/// A slapd.d file: exactly one entry.
fn read_ldif_entry(path: &Path) -> Result<LdifEntry, String> {
    let mut entries = read_ldif(path)?;
    match entries.len() {
        1 => Ok(entries.remove(0)),
        0 => Err(format!("{}: no dn: line", path.display())),
        n => Err(format!(
            "{}: {n} entries where slapd.d keeps one",
            path.display()
        )),
    }
}

/// Attributes every slapd.d entry carries that configure nothing.
const BOOKKEEPING: &[&str] = &[
    "objectclass",
    "structuralobjectclass",
    "entryuuid",
    "creatorsname",
    "createtimestamp",
    "entrycsn",
    "modifiersname",
    "modifytimestamp",
    "cn",
    "database",
    "overlay",
];

fn directives_of(entry: &LdifEntry, path: &Path) -> Vec<Directive> {
    entry
        .attrs
        .iter()
        .filter(|(name, _, _)| !BOOKKEEPING.contains(&canonical(name).as_str()))
        .map(|(name, value, line)| Directive {
            key: canonical(name),
            keyword: name.clone(),
            value: strip_order(value).to_string(),
            from_ldif: true,
            origin: Origin {
                path: path.to_path_buf(),
                line: *line,
            },
        })
        .collect()
}

/// `{3}to * by …` → `to * by …`.
pub fn strip_order(v: &str) -> &str {
    if let Some(rest) = v.strip_prefix('{') {
        if let Some((n, tail)) = rest.split_once('}') {
            if n.trim_start_matches('-')
                .chars()
                .all(|c| c.is_ascii_digit())
                && !n.is_empty()
            {
                return tail;
            }
        }
    }
    v
}

/// `olcDatabase={1}mdb` → (1, "mdb").
fn ordered_name(file_stem: &str, attr: &str) -> Option<(i64, String)> {
    let rest = file_stem.strip_prefix(attr)?.strip_prefix("={")?;
    let (n, name) = rest.split_once('}')?;
    Some((n.parse().ok()?, name.to_string()))
}

fn sorted_entries(dir: &Path, attr: &str) -> Result<Vec<(i64, String, PathBuf)>, String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in rd {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        let p = e.path();
        if p.extension().is_some_and(|x| x == "ldif") {
            let stem = p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if let Some((n, name)) = ordered_name(&stem, attr) {
                out.push((n, name, p));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn read_slapd_d(dir: &Path) -> Result<Source, String> {
    let root = dir.join("cn=config.ldif");
    if !root.exists() {
        return Err(format!(
            "{}: no cn=config.ldif here; give a slapd.d directory or a slapd.conf file",
            dir.display()
        ));
    }
    let mut src = Source::default();
    let global = read_ldif_entry(&root)?;
    if !global.dn.eq_ignore_ascii_case("cn=config") {
        return Err(format!(
            "{}: the entry is {}, not cn=config",
            root.display(),
            global.dn
        ));
    }
    src.global.directives = directives_of(&global, &root);
    let sub = dir.join("cn=config");
    // Modules.
    for (_, _, p) in sorted_entries(&sub, "cn=module")? {
        let e = read_ldif_entry(&p)?;
        src.modules.extend(directives_of(&e, &p));
    }
    // Schema: cn=schema.ldif holds slapd's hard-coded definitions; the
    // files below it are the loaded schemas, in order.
    for (_, name, p) in sorted_entries(&sub.join("cn=schema"), "cn")? {
        src.schema.push(SchemaSource {
            name,
            origin: Origin {
                path: p.clone(),
                line: 1,
            },
            path: p,
        });
    }
    for (_, kind, p) in sorted_entries(&sub, "olcDatabase")? {
        let e = read_ldif_entry(&p)?;
        let mut db = Section {
            kind,
            directives: directives_of(&e, &p),
            overlays: Vec::new(),
            origin: Some(Origin {
                path: p.clone(),
                line: 1,
            }),
        };
        let stem = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for (_, name, op) in sorted_entries(&sub.join(&stem), "olcOverlay")? {
            let oe = read_ldif_entry(&op)?;
            db.overlays.push(Overlay {
                name,
                directives: directives_of(&oe, &op),
                origin: Origin { path: op, line: 1 },
            });
        }
        src.databases.push(db);
    }
    Ok(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_of_both_forms_meet() {
        assert_eq!(canonical("olcDbIndex"), "index");
        assert_eq!(canonical("index"), "index");
        assert_eq!(canonical("olcMemberOfGroupOC"), "memberofgroupoc");
        assert_eq!(canonical("memberof-group-oc"), "memberofgroupoc");
        assert_eq!(canonical("ppolicy_default"), canonical("olcPPolicyDefault"));
        assert_eq!(canonical("olcDatabase"), "database");
        assert_eq!(canonical("olcRootDN"), "rootdn");
    }

    #[test]
    fn words_group_quotes() {
        assert_eq!(
            words(r#"to dn.regex="^uid=([^,]+),ou=a b$" by * read"#).unwrap(),
            vec!["to", "dn.regex=^uid=([^,]+),ou=a b$", "by", "*", "read"]
        );
        assert!(words("to \"x").is_err());
    }

    #[test]
    fn slapd_conf_sections_continuations_and_includes() {
        let dir = tempfile::tempdir().unwrap();
        let schema = dir.path().join("site.schema");
        std::fs::write(
            &schema,
            "attributetype ( 1.2.3.4 NAME 'x'\n  SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n",
        )
        .unwrap();
        let conf = dir.path().join("slapd.conf");
        std::fs::write(
            &conf,
            format!(
                "# comment\ninclude {}\nsizelimit 10\n\ndatabase mdb\nsuffix \"dc=example,dc=com\"\naccess to *\n  by self write\n  by * read\noverlay memberof\nmemberof-group-oc groupOfNames\n",
                schema.display()
            ),
        )
        .unwrap();
        let src = read(&conf).unwrap();
        assert_eq!(src.schema.len(), 1);
        assert_eq!(src.schema[0].name, "site");
        assert_eq!(src.global.directives[0].key, "sizelimit");
        let db = &src.databases[0];
        assert_eq!(db.kind, "mdb");
        assert_eq!(
            db.first("suffix").unwrap().single().unwrap(),
            "dc=example,dc=com"
        );
        let acl = db.first("access").unwrap();
        assert_eq!(acl.value, "to * by self write by * read");
        assert_eq!(acl.origin.line, 7);
        assert_eq!(db.overlays[0].name, "memberof");
        assert_eq!(db.overlays[0].directives[0].key, "memberofgroupoc");
    }

    #[test]
    fn slapd_d_entries_and_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("cn=config.ldif"),
            "# AUTO-GENERATED\ndn: cn=config\nobjectClass: olcGlobal\ncn: config\nolcServerID: 1\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.join("cn=config/cn=schema")).unwrap();
        std::fs::create_dir_all(d.join("cn=config/olcDatabase={1}mdb")).unwrap();
        std::fs::write(
            d.join("cn=config/cn=schema/cn={0}core.ldif"),
            "dn: cn={0}core,cn=schema,cn=config\n",
        )
        .unwrap();
        std::fs::write(
            d.join("cn=config/olcDatabase={1}mdb.ldif"),
            "dn: olcDatabase={1}mdb,cn=config\nolcDatabase: {1}mdb\nolcSuffix: o=My Org\nolcAccess: {0}to attrs=userPassword by self write by anon\n ymous auth by * none\nolcAccess:: ezF9dG8gKiBieSAqIHJlYWQ=\n",
        )
        .unwrap();
        std::fs::write(
            d.join("cn=config/olcDatabase={1}mdb/olcOverlay={0}memberof.ldif"),
            "dn: olcOverlay={0}memberof,olcDatabase={1}mdb,cn=config\nolcMemberOfDangling: ignore\n",
        )
        .unwrap();
        let src = read(d).unwrap();
        assert_eq!(src.global.first("serverid").unwrap().single().unwrap(), "1");
        assert_eq!(src.schema[0].name, "core");
        let db = &src.databases[0];
        assert_eq!(db.first("suffix").unwrap().single().unwrap(), "o=My Org");
        let acls: Vec<_> = db.all("access").map(|d| d.value.as_str()).collect();
        assert_eq!(
            acls,
            [
                "to attrs=userPassword by self write by anonymous auth by * none",
                "to * by * read"
            ]
        );
        assert_eq!(db.overlays[0].name, "memberof");
        assert_eq!(db.overlays[0].directives[0].key, "memberofdangling");
    }
}
