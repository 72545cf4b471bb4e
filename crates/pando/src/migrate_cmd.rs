//! `pando migrate`: translate an OpenLDAP configuration, write the Pando
//! one with its report, and optionally check the translated access rules
//! against the running slapd (`--verify-against`, [`crate::acl_check`]).

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct MigrateArgs {
    /// The configuration: OpenLDAP's slapd.d directory (holding
    /// cn=config.ldif) or slapd.conf file, or 389 Directory Server's dse.ldif.
    #[arg(long, default_value = "/etc/ldap/slapd.d")]
    pub from: PathBuf,
    /// 389 Directory Server: a data export (db2ldif, LDIF) whose `aci`
    /// values to translate with the dse.ldif given as --from.
    #[arg(long, value_name = "LDIF")]
    pub acis_from: Option<PathBuf>,
    /// The data export (slapcat or db2ldif output) to look through: its
    /// userPassword values counted by scheme, naming those no bind here
    /// can verify, in the report and on the terminal. Nothing is imported.
    #[arg(long, value_name = "LDIF")]
    pub data: Option<PathBuf>,
    /// Where to write pando.toml, migration-report.txt and schema/.
    #[arg(long, default_value = "pando-migrated")]
    pub out: PathBuf,
    /// After writing: compare what identities may do on this slapd (with
    /// the original configuration) and on a Pando started with the
    /// migrated one (--pando), and report every difference.
    #[arg(long, value_name = "LDAP_URL", requires = "pando")]
    pub verify_against: Option<String>,
    /// The Pando server serving the migrated configuration and the same data.
    #[arg(long, value_name = "LDAP_URL")]
    pub pando: Option<String>,
    /// Identities to check as, one per line: `DN<TAB>password` (a file,
    /// keep it 0600). Anonymous is always checked.
    #[arg(long, value_name = "FILE")]
    pub identities: Option<PathBuf>,
    /// Most entries probed with compares and writes per identity.
    #[arg(long, default_value_t = 200)]
    pub max_entries: usize,
}

pub fn run(args: MigrateArgs) -> Result<ExitCode, String> {
    let m = pando_migrate::migrate_with(&args.from, args.acis_from.as_deref(), &args.out)?;
    m.write(&args.out)?;
    let r = &m.report;
    use pando_migrate::Severity::*;
    println!(
        "wrote {}/pando.toml and {}/migration-report.txt: {} translated exactly, {} notes, {} dropped, {} stricter, {} may differ",
        args.out.display(),
        args.out.display(),
        r.exact,
        r.count(Note),
        r.count(Dropped),
        r.count(Stricter),
        r.count(Differs),
    );
    if let Some(data) = &args.data {
        let schemes = schemes_in(data)?;
        let text = crate::password_scheme_lines(&schemes).join("\n");
        eprintln!("{text}");
        let report = args.out.join("migration-report.txt");
        let mut all =
            std::fs::read_to_string(&report).map_err(|e| format!("{}: {e}", report.display()))?;
        all.push_str(&format!(
            "\n## Passwords in {}\n\n{}\n",
            data.display(),
            if text.is_empty() {
                "no userPassword values"
            } else {
                &text
            }
        ));
        std::fs::write(&report, all).map_err(|e| format!("{}: {e}", report.display()))?;
    }
    let Some(slapd) = args.verify_against else {
        return Ok(ExitCode::SUCCESS);
    };
    let pando = args.pando.unwrap_or_default();
    let identities = match &args.identities {
        Some(f) => crate::acl_check::read_identities(f)?,
        None => Vec::new(),
    };
    let found = crate::acl_check::run(
        &slapd,
        &pando,
        &identities,
        &m.config.suffixes,
        args.max_entries,
    )?;
    print!("{}", found.text);
    Ok(if found.differences == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The userPassword values of an LDIF export by scheme; a record that
/// does not parse is an error naming its line.
fn schemes_in(
    path: &std::path::Path,
) -> Result<std::collections::BTreeMap<String, pando_server::bulk::SchemeCount>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let reader = pando_ldif::LdifReader::new(
        std::io::BufReader::new(f),
        pando_ldif::ReaderOptions::default(),
    );
    let mut all = std::collections::BTreeMap::new();
    for rec in reader {
        let rec = rec.map_err(|e| format!("{}: {e}", path.display()))?;
        let pairs = match rec {
            pando_ldif::Record::Content { attrs, .. } => attrs,
            pando_ldif::Record::Change {
                change: pando_ldif::ChangeRecord::Add(attrs),
                ..
            } => attrs,
            pando_ldif::Record::Change { .. } => continue,
        };
        // One attribute per value: only their names and values are looked at.
        let attrs: Vec<pando_model::Attribute> = pairs
            .into_iter()
            .map(|(desc, v)| pando_model::Attribute {
                desc,
                values: vec![v],
            })
            .collect();
        for (scheme, one) in pando_server::bulk::password_schemes(&attrs) {
            all.entry(scheme)
                .and_modify(|c: &mut pando_server::bulk::SchemeCount| c.values += 1)
                .or_insert(one);
        }
    }
    Ok(all)
}
