//! OpenLDAP overlays (and 389-DS plugins read as such) as Pando's
//! `[[overlay]]` tables: memberof, refint, unique, ppolicy, accesslog,
//! valsort; syncprov and sssvlv are built in; the rest is reported.

use pando_config::overlay::{
    AccesslogConfig, MemberOfConfig, OverlayConfig, PpolicyConfig, RefintConfig, UniqueConfig,
    ValsortConfig,
};

use super::Ctx;
use crate::report::Severity;
use crate::source::{Directive, Overlay};

/// One overlay's directives, by canonical keyword.
struct Settings<'a> {
    o: &'a Overlay,
}

impl<'a> Settings<'a> {
    fn get(&self, keys: &[&str]) -> Vec<&'a Directive> {
        self.o
            .directives
            .iter()
            .filter(|d| keys.contains(&d.key.as_str()))
            .collect()
    }

    fn values(&self, keys: &[&str]) -> Vec<String> {
        self.get(keys)
            .iter()
            .flat_map(|d| d.words().unwrap_or_default())
            .collect()
    }

    fn first(&self, keys: &[&str]) -> Option<String> {
        self.values(keys).into_iter().next()
    }

    fn yes(&self, keys: &[&str]) -> bool {
        self.get(keys).first().is_some_and(|d| {
            matches!(
                d.single().unwrap_or_default().to_ascii_lowercase().as_str(),
                "true" | "on" | "yes" | "1"
            )
        })
    }
}

/// Defaults of an overlay's settings, as an empty table reads.
fn defaults<T: serde::de::DeserializeOwned>() -> T {
    toml::from_str("").expect("every overlay setting has a default")
}

pub(super) fn overlay(cx: &mut Ctx, o: &Overlay) {
    let text = format!("overlay {}", o.name);
    let s = Settings { o };
    let translated = match o.name.as_str() {
        "memberof" => memberof(cx, &s),
        "refint" => refint(cx, &s),
        "unique" => unique(cx, &s),
        "ppolicy" => ppolicy(cx, &s),
        "accesslog" => accesslog(cx, &s),
        "valsort" => Some((
            OverlayConfig::Valsort(ValsortConfig {
                rules: s
                    .get(&["valsortattr"])
                    .iter()
                    .map(|d| d.value.clone())
                    .collect(),
            }),
            &["valsortattr"][..],
        )),
        "syncprov" => {
            cx.report.add(Severity::Note, Some(&o.origin), &text, "Pando serves content synchronization (RFC 4533) on every suffix; nothing to configure");
            for d in &o.directives {
                cx.note(Severity::Note, d, "Pando's change log (replication.changelog_days, changelog_max_changes) plays this part");
            }
            return;
        }
        "sssvlv" => {
            cx.report.add(
                Severity::Note,
                Some(&o.origin),
                &text,
                "server-side sort and virtual list view are built in",
            );
            return;
        }
        other => {
            cx.report.add(
                Severity::Differs,
                Some(&o.origin),
                &text,
                format!("Pando has no '{other}' overlay; what it did is not done"),
            );
            return;
        }
    };
    let Some((config, known)) = translated else {
        return;
    };
    for d in &o.directives {
        if !known.contains(&d.key.as_str()) {
            cx.note(Severity::Dropped, d, "no Pando counterpart");
        }
    }
    cx.report.add(
        Severity::Note,
        Some(&o.origin),
        &text,
        "translated to an [[overlay]]",
    );
    cx.cfg.overlay.push(config);
}

type Translated = Option<(OverlayConfig, &'static [&'static str])>;

fn memberof(cx: &mut Ctx, s: &Settings) -> Translated {
    const KNOWN: &[&str] = &[
        "memberofgroupoc",
        "memberofmemberad",
        "memberofmemberofad",
        "memberofdangling",
        "memberofrefint",
        "memberofdanglingerror",
        "memberofdn",
    ];
    let mut m: MemberOfConfig = defaults();
    if let Some(v) = s.first(&["memberofgroupoc"]) {
        m.group_classes = vec![v];
    }
    if let Some(v) = s.first(&["memberofmemberad"]) {
        m.member_attributes = vec![v];
    }
    if let Some(v) = s.first(&["memberofmemberofad"]) {
        m.memberof_attribute = v;
    }
    for d in s.get(&["memberofdangling"]) {
        match d.single().unwrap_or_default().as_str() {
            "ignore" => {}
            "error" => m.dangling = "error".into(),
            _ => cx.note(
                Severity::Differs,
                d,
                "Pando ignores or refuses dangling members; 'drop' is kept as 'ignore'",
            ),
        }
    }
    for d in s.get(&["memberofrefint"]) {
        cx.note(
            Severity::Note,
            d,
            "Pando's memberof always follows renames and deletes of groups and members",
        );
    }
    Some((OverlayConfig::Memberof(m), KNOWN))
}

fn refint(cx: &mut Ctx, s: &Settings) -> Translated {
    const KNOWN: &[&str] = &[
        "refintattribute",
        "refintattributes",
        "refintnothing",
        "refintmodifiersname",
    ];
    let mut r: RefintConfig = defaults();
    let attrs = s.values(&["refintattribute", "refintattributes"]);
    if !attrs.is_empty() {
        r.attributes = attrs;
    }
    r.nothing = s.first(&["refintnothing"]);
    for d in s.get(&["refintmodifiersname"]) {
        cx.note(
            Severity::Note,
            d,
            "Pando writes modifiersName of its own referential changes itself",
        );
    }
    Some((OverlayConfig::Refint(r), KNOWN))
}

/// `olcUniqueURI` values each become an overlay of their own; the older
/// attribute/base form one more.
fn unique(cx: &mut Ctx, s: &Settings) -> Translated {
    const KNOWN: &[&str] = &[
        "uniqueuri",
        "uniqueattribute",
        "uniqueattributes",
        "uniquebase",
        "uniqueignore",
        "uniquestrict",
    ];
    for d in s.get(&["uniqueuri"]) {
        match unique_uri(d) {
            Some(u) => {
                cx.cfg.overlay.push(OverlayConfig::Unique(u));
                cx.exact();
            }
            None => cx.note(Severity::Dropped, d, "not a URI of the form [strict ]ldap:///base?attrs?sub: uniqueness is not enforced for it"),
        }
    }
    let attrs = s.values(&["uniqueattribute", "uniqueattributes"]);
    if attrs.is_empty() {
        return None;
    }
    let config = UniqueConfig {
        attributes: attrs,
        base: s.first(&["uniquebase"]),
        strict: s.yes(&["uniquestrict"]),
    };
    Some((OverlayConfig::Unique(config), KNOWN))
}

fn ppolicy(cx: &mut Ctx, s: &Settings) -> Translated {
    const KNOWN: &[&str] = &[
        "ppolicydefault",
        "ppolicyuselockout",
        "ppolicyhashcleartext",
        "ppolicyforwardupdates",
        "ppolicydisablewrite",
        "ppolicysendnetscapecontrols",
    ];
    let mut p: PpolicyConfig = defaults();
    p.default_policy = s.first(&["ppolicydefault"]);
    p.use_lockout = s.yes(&["ppolicyuselockout"]);
    for d in s.get(&["ppolicyhashcleartext"]) {
        cx.note(
            Severity::Note,
            d,
            "Pando always stores clear-text passwords hashed",
        );
    }
    for d in s.get(&[
        "ppolicyforwardupdates",
        "ppolicydisablewrite",
        "ppolicysendnetscapecontrols",
    ]) {
        cx.note(Severity::Dropped, d, "no Pando counterpart");
    }
    Some((OverlayConfig::Ppolicy(p), KNOWN))
}

fn accesslog(cx: &mut Ctx, s: &Settings) -> Translated {
    const KNOWN: &[&str] = &[
        "accesslogdb",
        "logdb",
        "accesslogops",
        "logops",
        "accesslogpurge",
        "logpurge",
        "accesslogsuccess",
        "logsuccess",
        "accesslogold",
        "logold",
        "accesslogoldattr",
        "logoldattr",
        "accesslogbase",
        "logbase",
    ];
    let mut a: AccesslogConfig = defaults();
    let ops = s.values(&["accesslogops", "logops"]);
    if !ops.is_empty() {
        a.ops = ops;
    }
    a.success_only = s.yes(&["accesslogsuccess", "logsuccess"]);
    if let Some(age) = s.first(&["accesslogpurge", "logpurge"]) {
        // dd+hh:mm[:ss]
        let days: u64 = age
            .split('+')
            .next()
            .and_then(|d| d.parse().ok())
            .unwrap_or(7);
        a.purge_days = days.max(1);
    }
    for d in s.get(&["accesslogdb", "logdb"]) {
        if !d
            .single()
            .unwrap_or_default()
            .eq_ignore_ascii_case("cn=accesslog")
        {
            cx.note(
                Severity::Differs,
                d,
                "Pando's log is always at cn=accesslog",
            );
        }
    }
    for d in s.get(&[
        "accesslogold",
        "logold",
        "accesslogoldattr",
        "logoldattr",
        "accesslogbase",
        "logbase",
    ]) {
        cx.note(
            Severity::Dropped,
            d,
            "no Pando counterpart (Pando logs old values of every changed attribute it logs)",
        );
    }
    Some((OverlayConfig::Accesslog(a), KNOWN))
}

/// `[ignore ][strict ]ldap:///ou=people,dc=x?uid,mail?sub`.
fn unique_uri(d: &Directive) -> Option<UniqueConfig> {
    let words = d.words().ok()?;
    let strict = words.iter().any(|w| w == "strict");
    let uri = words.iter().find(|w| w.starts_with("ldap:///"))?;
    let rest = &uri["ldap:///".len()..];
    let mut parts = rest.split('?');
    let base = parts.next().unwrap_or("");
    let attrs: Vec<String> = parts
        .next()
        .unwrap_or("")
        .split(',')
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    if attrs.is_empty() {
        return None;
    }
    Some(UniqueConfig {
        attributes: attrs,
        base: (!base.is_empty()).then(|| base.to_string()),
        strict,
    })
}
