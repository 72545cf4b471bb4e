//! Overlays: features configured per server on top of the core
//! operations (`[[overlay]]` in the TOML file, one entry each below
//! `olcDatabase={1}mdb,cn=config`). Each compiles to hooks on the write
//! pipeline (`ops::write::hooks::Hook`), run after the built-in hooks in
//! the configured order; a configuration change compiles them again.
//!
//! Overlays do not act on changes a replication consumer receives: the
//! provider's overlays made the related changes, and they arrive too.

pub mod memberof;
pub mod refint;
pub mod related;
pub mod settings;
pub mod unique;

use pando_model::Schema;

pub use settings::OverlayConfig;

#[cfg(test)]
mod tests;

use crate::ops::write::hooks::Hook;

/// One configured overlay, compiled.
pub struct Overlay {
    pub kind: &'static str,
    write: Box<dyn Hook + Send + Sync>,
}

/// The configured overlays, in order.
#[derive(Default)]
pub struct Overlays {
    list: Vec<Overlay>,
}

impl Overlays {
    /// Compile the overlays of a validated configuration.
    pub fn compile(configs: &[OverlayConfig], schema: &Schema) -> Overlays {
        let list = configs
            .iter()
            .map(|c| {
                let write: Box<dyn Hook + Send + Sync> = match c {
                    OverlayConfig::Refint(r) => Box::new(refint::Refint::new(r, schema)),
                    OverlayConfig::Unique(u) => Box::new(unique::Unique::new(u, schema)),
                    OverlayConfig::Memberof(m) => Box::new(memberof::MemberOf::new(m, schema)),
                };
                Overlay {
                    kind: c.type_name(),
                    write,
                }
            })
            .collect();
        Overlays { list }
    }

    /// The write hooks, in the configured order.
    pub fn write_hooks(&self) -> impl Iterator<Item = &dyn Hook> {
        self.list.iter().map(|o| &*o.write as &dyn Hook)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn kinds(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.list.iter().map(|o| o.kind)
    }
}
