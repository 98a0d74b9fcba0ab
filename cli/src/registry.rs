//! The one place every command gets its op registry: the built-in ops plus the plugins named
//! by `AMK_PLUGINS` (`:`-separated) and `--plugin PATH` (repeatable), loaded in that order.

use amk_core::{IrError, Registry};
use amk_plugin_abi::{PluginError, PluginRegistry};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Why the registry could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The built-in ops clash (a build defect).
    #[error("cannot build the op registry: {0}")]
    Builtin(#[from] IrError),
    /// A plugin was refused.
    #[error("cannot load a plugin: {0}")]
    Plugin(#[from] PluginError),
}

/// The plugin paths of this process, set once by `main`.
static PLUGINS: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// Records the plugins to load: those of `AMK_PLUGINS` (empty entries skipped), then `flags`.
pub fn set_plugins(flags: &[PathBuf]) {
    let mut all: Vec<PathBuf> = std::env::var_os("AMK_PLUGINS")
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    all.extend(flags.iter().cloned());
    // Set once, before any command runs; a second call keeps the first list.
    let _ = PLUGINS.set(all);
}

/// The built-in ops plus every plugin of [`set_plugins`].
pub fn registry() -> Result<Registry, RegistryError> {
    let mut reg = amk_ops::registry()?;
    for path in PLUGINS.get().map(Vec::as_slice).unwrap_or_default() {
        reg.load_plugin(path)?;
    }
    Ok(reg)
}
