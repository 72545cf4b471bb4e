//! The overlays' own languages, checked when a configuration is: the
//! rules of `errors` and `valsort`, the operation list of `accesslog`, the
//! quality settings of `ppolicy` and the remote of `translucent`. The
//! settings `pando_config::overlay` judges alone were checked before.

use pando_config::overlay::err;
use pando_config::{ConfigError, OverlayConfig};
use pando_model::{Dn, Schema};

/// Every overlay's rules, compiled once to see that they compile.
pub fn check_rules(
    overlays: &[OverlayConfig],
    schema: &Schema,
    suffixes: &[Dn],
) -> Result<(), ConfigError> {
    for (i, o) in overlays.iter().enumerate() {
        let kind = o.type_name();
        match o {
            OverlayConfig::Ppolicy(p) => {
                super::ppolicy::quality::Quality::load(p.min_classes, p.banned_file.as_deref())
                    .map_err(|e| err(i, kind, "banned_file", e))?;
            }
            OverlayConfig::Accesslog(a) => {
                super::accesslog::Ops::parse(&a.ops).map_err(|e| err(i, kind, "ops", e))?;
            }
            OverlayConfig::Translucent(t) => {
                super::translucent::check(t, schema, suffixes)
                    .map_err(|(key, e)| err(i, kind, key, e))?;
            }
            OverlayConfig::Errors(e) => {
                for r in &e.rules {
                    super::errors::parse_rule(schema, r).map_err(|e| err(i, kind, "rules", e))?;
                }
            }
            OverlayConfig::Valsort(v) => {
                for r in &v.rules {
                    super::valsort::parse_rule(schema, r).map_err(|e| err(i, kind, "rules", e))?;
                }
            }
            OverlayConfig::Refint(_)
            | OverlayConfig::Unique(_)
            | OverlayConfig::Memberof(_)
            | OverlayConfig::Retrochangelog(_) => {}
        }
    }
    Ok(())
}
