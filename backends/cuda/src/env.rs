//! The environment variables that tune the CUDA backend, in one documented list, and the one
//! place that reads them ([`CudaOptions::from_env`]). [`CudaOptions::default`] reads none, so
//! a library user gets the same backend whatever the process's environment holds; the CLI
//! and the Python package call `from_env`, so a user can measure a knob without rebuilding.

use crate::{CudaError, CudaOptions, parse_defines};
use std::time::Duration;

/// One environment variable [`CudaOptions::from_env`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvKnob {
    /// Its name.
    pub name: &'static str,
    /// The values it takes, and what it sets.
    pub sets: &'static str,
}

/// Every variable [`CudaOptions::from_env`] reads (the cubin cache's `AMK_CUDA_CACHE` is read
/// where the cache is opened).
pub const ENV_KNOBS: &[EnvKnob] = &[
    EnvKnob {
        name: "AMK_CUDA_WATCHDOG_MS",
        sets: "milliseconds a forward pass may run before it is aborted (watchdog; default 10000)",
    },
    EnvKnob {
        name: "AMK_CUDA_SMEM_KB",
        sets: "KiB of dynamic shared memory every launch reserves at least (min_smem_bytes; default 0)",
    },
    EnvKnob {
        name: "AMK_CUDA_L2_EVICT_FIRST",
        sets: "0 or 1: streamed weights are evicted first from L2 (l2_evict_first; default 1)",
    },
    EnvKnob {
        name: "AMK_CUDA_DEFINES",
        sets: "NAME=VALUE or NAME entries separated by spaces: device-code defines (defines)",
    },
    EnvKnob {
        name: "AMK_CUDA_PROGRAM_OPS",
        sets: "0 or 1: compile only the ops a program uses into its kernel (program_ops; default 1)",
    },
];

/// A variable's value that is not one it takes.
fn bad(name: &'static str, value: &str) -> CudaError {
    let want = ENV_KNOBS
        .iter()
        .find(|k| k.name == name)
        .map_or("", |k| k.sets);
    CudaError::BadEnv {
        name,
        value: value.to_string(),
        want,
    }
}

/// Reads the variables through `get` (`std::env::var` in [`CudaOptions::from_env`]).
struct Vars<G: Fn(&str) -> Option<String>> {
    get: G,
}

impl<G: Fn(&str) -> Option<String>> Vars<G> {
    fn num<T: std::str::FromStr>(&self, name: &'static str) -> Result<Option<T>, CudaError> {
        match (self.get)(name) {
            None => Ok(None),
            Some(v) => v.trim().parse::<T>().map(Some).map_err(|_| bad(name, &v)),
        }
    }

    fn flag(&self, name: &'static str, default: bool) -> Result<bool, CudaError> {
        match (self.get)(name).as_deref().map(str::trim) {
            None => Ok(default),
            Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(v) => Err(bad(name, v)),
        }
    }

    fn kib(&self, name: &'static str) -> Result<Option<u64>, CudaError> {
        match self.num::<u64>(name)? {
            Some(kb) => kb
                .checked_mul(1024)
                .map(Some)
                .ok_or_else(|| bad(name, &kb.to_string())),
            None => Ok(None),
        }
    }
}

impl CudaOptions {
    /// The defaults with the variables of [`ENV_KNOBS`] applied; a value a variable does not
    /// take is refused ([`CudaError::BadEnv`]) rather than ignored.
    pub fn from_env() -> Result<CudaOptions, CudaError> {
        CudaOptions::from_vars(|name| std::env::var(name).ok())
    }

    /// [`CudaOptions::from_env`] over any source of variables (`get` returns a variable's
    /// value, `None` when it is unset).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<CudaOptions, CudaError> {
        let v = Vars { get };
        let d = CudaOptions::default();
        let usize_kib = |name| -> Result<Option<usize>, CudaError> {
            v.kib(name)?
                .map(|b| usize::try_from(b).map_err(|_| bad(name, &b.to_string())))
                .transpose()
        };
        Ok(CudaOptions {
            watchdog: v
                .num::<u64>("AMK_CUDA_WATCHDOG_MS")?
                .map_or(d.watchdog, Duration::from_millis),
            min_smem_bytes: usize_kib("AMK_CUDA_SMEM_KB")?.unwrap_or(d.min_smem_bytes),
            l2_evict_first: v.flag("AMK_CUDA_L2_EVICT_FIRST", d.l2_evict_first)?,
            defines: (v.get)("AMK_CUDA_DEFINES").map_or_else(Vec::new, |s| parse_defines(&s)),
            program_ops: v.flag("AMK_CUDA_PROGRAM_OPS", d.program_ops)?,
            ..d
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests

    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<CudaOptions, CudaError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaOptions::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn no_variables_give_the_defaults() {
        let (a, b) = (with(&[]).unwrap(), CudaOptions::default());
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn every_knob_is_read() {
        let o = with(&[
            ("AMK_CUDA_WATCHDOG_MS", "2500"),
            ("AMK_CUDA_SMEM_KB", "200"),
            ("AMK_CUDA_L2_EVICT_FIRST", "0"),
            ("AMK_CUDA_DEFINES", "LT_STAGES=6 AMK_X"),
            ("AMK_CUDA_PROGRAM_OPS", "0"),
        ])
        .unwrap();
        assert_eq!(o.watchdog, Duration::from_millis(2500));
        assert_eq!(o.min_smem_bytes, 200 << 10);
        assert!(!o.l2_evict_first && !o.program_ops);
        assert_eq!(
            o.defines,
            [
                ("LT_STAGES".to_string(), "6".to_string()),
                ("AMK_X".to_string(), "1".to_string())
            ]
        );
    }

    #[test]
    fn the_list_names_every_variable_read() {
        let seen = std::cell::RefCell::new(Vec::new());
        CudaOptions::from_vars(|k| {
            seen.borrow_mut().push(k.to_string());
            None
        })
        .unwrap();
        let mut seen = seen.into_inner();
        seen.sort();
        seen.dedup();
        let mut listed: Vec<&str> = ENV_KNOBS.iter().map(|k| k.name).collect();
        listed.sort();
        assert_eq!(seen, listed);
    }

    #[test]
    fn a_value_a_variable_does_not_take_is_refused_by_name() {
        for (name, value) in [
            ("AMK_CUDA_WATCHDOG_MS", "ten"),
            ("AMK_CUDA_SMEM_KB", "-1"),
            ("AMK_CUDA_SMEM_KB", "18446744073709551615"),
            ("AMK_CUDA_L2_EVICT_FIRST", "yes"),
            ("AMK_CUDA_PROGRAM_OPS", "2"),
        ] {
            let err = with(&[(name, value)]).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(name) && msg.contains(value), "{msg}");
            assert!(matches!(err, CudaError::BadEnv { .. }), "{err:?}");
        }
    }
}
