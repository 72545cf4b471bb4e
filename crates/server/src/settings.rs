//! The whole check of a configuration, the one every caller uses (start,
//! reload, cn=config changes, `pando check-config`, migrate): first the
//! values `pando_config` judges alone, then the rule languages, each by
//! the layer that compiles it (access rules and `limits.by` identities by
//! `acl`, external maps by `auth`, overlay rules by `overlays`) and the
//! service account by `privileges`. Nothing here keeps what it compiled.

use pando_config::{Config, ConfigError, Resolved};
use pando_model::Schema;

/// The full check, as a method of the configuration (`cfg.validate(&schema)`).
pub trait Validate {
    /// Checked in full against `schema`, resolved.
    fn validate(self, schema: &Schema) -> Result<Resolved, ConfigError>;
}

impl Validate for Config {
    fn validate(self, schema: &Schema) -> Result<Resolved, ConfigError> {
        let resolved = self.validate_values(schema)?;
        check_rules(&resolved, schema)?;
        Ok(resolved)
    }
}

fn check_rules(resolved: &Resolved, schema: &Schema) -> Result<(), ConfigError> {
    let cfg = &resolved.config;
    pando_access::acl::Acl::compile(&cfg.access, schema).map_err(|(i, key, e)| {
        let key = if key.is_empty() {
            format!("access[{i}]")
        } else {
            format!("access[{i}].{key}")
        };
        ConfigError::new(key, e)
    })?;
    for (i, m) in cfg.auth.external_map.iter().enumerate() {
        pando_access::auth::compile_map(m)
            .map_err(|e| ConfigError::new(format!("auth.external_map[{i}]"), e))?;
    }
    if let Some(u) = &cfg.user {
        crate::privileges::resolve(u, cfg.group.as_deref()).map_err(|e| {
            let key = if e.starts_with("group") {
                "group"
            } else {
                "user"
            };
            ConfigError::new(key, e)
        })?;
    }
    for (i, b) in cfg.limits.by.iter().enumerate() {
        pando_access::acl::Who::parse(&b.who.items(), schema)
            .map_err(|e| ConfigError::new(format!("limits.by[{i}].who"), e))?;
    }
    crate::overlays::check_rules(&cfg.overlay, schema, &resolved.suffixes)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(extra: &str) -> Config {
        Config::from_toml(
            &format!("data_dir = \"/tmp/x\"\n{extra}"),
            Path::new("t.toml"),
        )
        .unwrap()
    }

    /// Each rule language is judged here, not by `validate_values`, and
    /// the error names its key.
    #[test]
    fn rule_languages_are_checked_and_named() {
        let schema = Schema::standard();
        let cases = [
            (
                "[[access]]\nby = [{ who = \"nobody-like-this\", rights = \"read\" }]\n",
                "access[0]",
            ),
            (
                "[[limits.by]]\nwho = \"nobody-like-this\"\nsize_limit = 5\n",
                "limits.by[0].who",
            ),
            (
                "[[overlay]]\ntype = \"errors\"\nrules = [\"no such rule\"]\n",
                "overlay[0].rules",
            ),
            (
                "[[overlay]]\ntype = \"accesslog\"\nops = [\"everything\"]\n",
                "overlay[0].ops",
            ),
        ];
        for (toml, key) in cases {
            assert!(config(toml).validate_values(&schema).is_ok(), "{toml}");
            let e = config(toml).validate(&schema).expect_err(toml);
            assert!(e.key.starts_with(key), "{toml}: {} {}", e.key, e.problem);
        }
        assert!(config("").validate(&schema).is_ok());
    }
}
