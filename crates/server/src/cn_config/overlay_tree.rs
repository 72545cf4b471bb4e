//! Overlays changed while serving: one entry per `[[overlay]]` below the
//! database entry, `olcOverlay={n}<type>,olcDatabase={1}mdb,cn=config`, as
//! slapd names them. Its settings are attributes (`olcRefintAttribute`…,
//! in `overlays::settings::TYPES`). Adding an entry adds the overlay at
//! position n (or last), deleting it removes it; the order is the order
//! they run in.

use pando_model::{Dn, Entry};
use pando_proto::{Change, ModOp, PartialAttribute, ResultCode};

use super::{change_values, split_ordinal, DATABASE_DN, DATABASE_NORM};
use crate::error::LdapError;
use pando_config::overlay::{overlay_type, OverlayConfig, OverlayType, SettingForm, TYPES};
use pando_config::Config;

/// Whether `norm` names an overlay entry (or would).
pub fn is_overlay(norm: &str) -> bool {
    norm.starts_with("olcoverlay=") && norm.ends_with(&format!(",{DATABASE_NORM}"))
}

fn the_type(o: &OverlayConfig) -> &'static OverlayType {
    overlay_type(o.type_name()).expect("every overlay config has a type entry")
}

/// The settings of `o` as attribute values (per setting, in order).
fn values_of(o: &OverlayConfig) -> Vec<(&'static str, SettingForm, Vec<String>)> {
    let t = the_type(o);
    let table = match toml::Value::try_from(o) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    t.settings
        .iter()
        .map(|s| {
            let vals = match table.get(s.key) {
                None => Vec::new(),
                Some(toml::Value::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(String::from)
                            .unwrap_or_else(|| v.to_string())
                    })
                    .collect(),
                Some(toml::Value::Boolean(b)) => vec![if *b { "TRUE" } else { "FALSE" }.into()],
                Some(toml::Value::String(v)) => vec![v.clone()],
                Some(other) => vec![other.to_string()],
            };
            (s.attr, s.form, vals)
        })
        .collect()
}

/// One entry per overlay.
pub fn entries(overlays: &[OverlayConfig]) -> Vec<(String, Entry)> {
    let mut out = Vec::new();
    for (i, o) in overlays.iter().enumerate() {
        let t = the_type(o);
        let dn = format!("olcOverlay={{{i}}}{},{DATABASE_DN}", t.name);
        let Ok(parsed) = Dn::parse(&dn) else { continue };
        let mut e = Entry::new(parsed);
        e.add_values(
            "objectClass",
            vec![
                b"top".to_vec(),
                b"olcOverlayConfig".to_vec(),
                t.class.as_bytes().to_vec(),
            ],
        );
        e.add_values(
            "olcOverlay",
            vec![format!("{{{i}}}{}", t.name).into_bytes()],
        );
        for (attr, _, vals) in values_of(o) {
            if !vals.is_empty() {
                e.add_values(attr, vals.into_iter().map(String::into_bytes).collect());
            }
        }
        out.push((dn, e));
    }
    out
}

fn no_such() -> LdapError {
    LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object")
}

/// The overlay `norm` names: `olcOverlay={n}type` must be the one at n;
/// `olcOverlay=type` the only one of its type.
fn find(overlays: &[OverlayConfig], norm: &str) -> Result<usize, LdapError> {
    let value = norm
        .strip_suffix(&format!(",{DATABASE_NORM}"))
        .and_then(|r| r.strip_prefix("olcoverlay="))
        .ok_or_else(no_such)?;
    let (at, name) = split_ordinal(value);
    let same: Vec<usize> = overlays
        .iter()
        .enumerate()
        .filter(|(_, o)| o.type_name().eq_ignore_ascii_case(name))
        .map(|(i, _)| i)
        .collect();
    match at {
        Some(n) if same.contains(&n) => Ok(n),
        Some(_) => Err(no_such()),
        None if same.len() == 1 => Ok(same[0]),
        None if same.is_empty() => Err(no_such()),
        None => Err(LdapError::unwilling(format!(
            "there are {} {name} overlays: name one as olcOverlay={{n}}{name}",
            same.len()
        ))),
    }
}

fn utf8(attr: &str, values: &[Vec<u8>]) -> Result<Vec<String>, LdapError> {
    values
        .iter()
        .map(|v| {
            String::from_utf8(v.clone())
                .map_err(|_| LdapError::invalid_syntax(format!("{attr}: a value is not UTF-8")))
        })
        .collect()
}

fn setting_names(t: &OverlayType) -> String {
    t.settings
        .iter()
        .map(|s| s.attr)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The overlay of type `t` whose settings are `values` (attribute →
/// values); an unknown attribute or a bad value is refused.
fn build(
    t: &OverlayType,
    values: &[(&'static str, SettingForm, Vec<String>)],
) -> Result<OverlayConfig, LdapError> {
    let mut table = toml::Table::new();
    table.insert("type".into(), toml::Value::String(t.name.into()));
    for ((attr, form, vals), s) in values.iter().zip(t.settings) {
        if vals.is_empty() {
            continue;
        }
        let v = match form {
            SettingForm::Text if vals.len() > 1 => {
                return Err(LdapError::new(
                    ResultCode::CONSTRAINT_VIOLATION,
                    format!("{attr} takes one value"),
                ))
            }
            SettingForm::Text => toml::Value::String(vals[0].clone()),
            SettingForm::Integer => match vals.as_slice() {
                [one] => toml::Value::Integer(one.trim().parse::<i64>().map_err(|_| {
                    LdapError::invalid_syntax(format!("{attr}: '{one}' is not an integer"))
                })?),
                _ => {
                    return Err(LdapError::new(
                        ResultCode::CONSTRAINT_VIOLATION,
                        format!("{attr} takes one value"),
                    ))
                }
            },
            SettingForm::Boolean => match vals[0].to_ascii_uppercase().as_str() {
                "TRUE" if vals.len() == 1 => toml::Value::Boolean(true),
                "FALSE" if vals.len() == 1 => toml::Value::Boolean(false),
                _ => {
                    return Err(LdapError::invalid_syntax(format!(
                        "{attr}: '{}' is not TRUE or FALSE",
                        vals.join(" ")
                    )))
                }
            },
            SettingForm::List => {
                toml::Value::Array(vals.iter().cloned().map(toml::Value::String).collect())
            }
        };
        table.insert(s.key.into(), v);
    }
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| {
            LdapError::invalid_syntax(format!("{} overlay: {}", t.name, e.message()))
        })
}

/// The configuration with the overlay `dn` (normalised `norm`) added
/// from an add request's attributes.
pub fn add(
    desired: &Config,
    dn: &Dn,
    norm: &str,
    attrs: &[PartialAttribute],
) -> Result<Config, LdapError> {
    let (at, name) = super::added_name(
        dn,
        norm,
        DATABASE_NORM,
        "olcoverlay",
        format!("overlays are added as olcOverlay=<type>,{DATABASE_DN}"),
    )?;
    let name = name.as_str();
    let Some(t) = overlay_type(name) else {
        return Err(LdapError::unwilling(format!(
            "'{name}' is not an overlay this server has ({})",
            TYPES.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
        )));
    };
    let mut values: Vec<(&'static str, SettingForm, Vec<String>)> = t
        .settings
        .iter()
        .map(|s| (s.attr, s.form, Vec::new()))
        .collect();
    for a in attrs {
        if ["objectClass", "olcOverlay"]
            .iter()
            .any(|n| n.eq_ignore_ascii_case(&a.name))
        {
            continue;
        }
        let Some(slot) = values
            .iter_mut()
            .find(|(attr, _, _)| attr.eq_ignore_ascii_case(&a.name))
        else {
            return Err(LdapError::new(
                ResultCode::UNDEFINED_ATTRIBUTE_TYPE,
                format!(
                    "{}: not a setting of the {} overlay ({})",
                    a.name,
                    t.name,
                    setting_names(t)
                ),
            ));
        };
        slot.2.extend(utf8(slot.0, &a.values)?);
    }
    let overlay = build(t, &values)?;
    let mut cfg = desired.clone();
    let at = at.unwrap_or(cfg.overlay.len()).min(cfg.overlay.len());
    cfg.overlay.insert(at, overlay);
    Ok(cfg)
}

/// The configuration without the overlay `norm`.
pub fn delete(desired: &Config, norm: &str) -> Result<Config, LdapError> {
    let i = find(&desired.overlay, norm)?;
    let mut cfg = desired.clone();
    cfg.overlay.remove(i);
    Ok(cfg)
}

/// The configuration with `changes` applied to the overlay `norm`.
pub fn modify(desired: &Config, norm: &str, changes: &[Change]) -> Result<Config, LdapError> {
    let i = find(&desired.overlay, norm)?;
    let t = the_type(&desired.overlay[i]);
    let mut values = values_of(&desired.overlay[i]);
    for ch in changes {
        let Some(slot) = values
            .iter_mut()
            .find(|(attr, _, _)| attr.eq_ignore_ascii_case(&ch.attr.name))
        else {
            let code = if ["olcOverlay", "objectClass"]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(&ch.attr.name))
            {
                ResultCode::CONSTRAINT_VIOLATION
            } else {
                ResultCode::UNDEFINED_ATTRIBUTE_TYPE
            };
            return Err(LdapError::new(
                code,
                format!(
                    "{}: cannot be changed here (the {} overlay's settings: {})",
                    ch.attr.name,
                    t.name,
                    setting_names(t)
                ),
            ));
        };
        if ch.op == ModOp::Increment {
            return Err(LdapError::new(
                ResultCode::CONSTRAINT_VIOLATION,
                format!("{} cannot be incremented", slot.0),
            ));
        }
        let given = utf8(slot.0, &ch.attr.values)?;
        let single = slot.1 != SettingForm::List;
        slot.2 = change_values(slot.0, false, single, &slot.2, ch.op, &given)?;
    }
    let overlay = build(t, &values)?;
    let mut cfg = desired.clone();
    cfg.overlay[i] = overlay;
    Ok(cfg)
}

/// The configuration schema of overlay entries (appended to
/// `cn_config::schema_text`).
pub fn schema_text(oid_arc: &str, olc_overlay_n: u32) -> String {
    let mut s = format!(
        "attributetype ( {oid_arc}.1.{olc_overlay_n} NAME 'olcOverlay'\n\tDESC 'an overlay: its position and type'\n\tEQUALITY caseIgnoreMatch\n\tSYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE\n\tX-ORDERED 'SIBLINGS' )\n\n"
    );
    for t in TYPES {
        for set in t.settings {
            let (syntax, eq, single) = match set.form {
                SettingForm::Boolean => ("1.3.6.1.4.1.1466.115.121.1.7", "booleanMatch", true),
                SettingForm::Integer => ("1.3.6.1.4.1.1466.115.121.1.27", "integerMatch", true),
                SettingForm::Text => ("1.3.6.1.4.1.1466.115.121.1.15", "caseIgnoreMatch", true),
                SettingForm::List => ("1.3.6.1.4.1.1466.115.121.1.15", "caseIgnoreMatch", false),
            };
            s.push_str(&format!(
                "attributetype ( {oid_arc}.1.{} NAME '{}'\n\tDESC '{} overlay: {}'\n\tEQUALITY {eq}\n\tSYNTAX {syntax}{} )\n\n",
                set.n,
                set.attr,
                t.name,
                set.key,
                if single { " SINGLE-VALUE" } else { "" }
            ));
        }
    }
    s.push_str(&format!(
        "objectclass ( {oid_arc}.2.10 NAME 'olcOverlayConfig'\n\tDESC 'an overlay'\n\tSUP olcConfig STRUCTURAL\n\tMUST olcOverlay )\n\n"
    ));
    for t in TYPES {
        s.push_str(&format!(
            "objectclass ( {oid_arc}.2.{} NAME '{}'\n\tDESC 'the {} overlay'\n\tSUP olcOverlayConfig STRUCTURAL\n\tMAY ( {} ) )\n\n",
            t.class_n,
            t.class,
            t.name,
            t.settings
                .iter()
                .map(|s| s.attr)
                .collect::<Vec<_>>()
                .join(" $ ")
        ));
    }
    s
}
