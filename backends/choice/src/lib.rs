//! `--backend cpu|cuda|auto`: which backend runs a program, opened the one way every front
//! end (the `amk` commands, the Python package) opens it.
//!
//! `cpu` is the CPU VM; `cuda` opens the GPU megakernel backend with the environment's knobs
//! (`CudaOptions::from_env`) or fails with the reason (built without the `cuda` feature, no
//! driver, no device, a knob's value refused, ...); `auto` takes the GPU when it opens and the
//! CPU VM otherwise. [`Chosen::line`] says which runs (and why), for the caller to print.

use amk_backend_cpu::CpuBackend;
use amk_backend_cuda::{CudaBackend, CudaError, CudaOptions};
use amk_core::Backend;

/// Which backend runs the program.
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU VM (reference semantics; always available).
    Cpu,
    /// The CUDA megakernel (needs a build with `--features cuda`, an NVIDIA driver and a GPU).
    Cuda,
    /// CUDA when this build has it and a GPU is present, else the CPU VM.
    #[default]
    Auto,
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    /// `cpu`, `cuda` or `auto`.
    fn from_str(s: &str) -> Result<BackendKind, String> {
        match s {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda),
            "auto" => Ok(BackendKind::Auto),
            other => Err(format!(
                "backend {other:?} is not one of \"cpu\", \"cuda\", \"auto\""
            )),
        }
    }
}

/// `--backend cuda` was asked for but the GPU backend cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("--backend cuda: the CUDA backend is unavailable: {0}")]
pub struct BackendUnavailable(pub CudaError);

/// The opened backend and the line that says which it is.
pub struct Chosen {
    /// The backend.
    pub backend: Box<dyn Backend>,
    /// `backend: NAME (WHY)`, for the caller's stderr.
    pub line: String,
    /// The GPU's SM count when the CUDA backend was opened (lowering lays tiles out for it).
    pub gpu_sms: Option<usize>,
}

impl Chosen {
    /// The backend's name (`cpu` or `cuda`).
    pub fn name(&self) -> &'static str {
        self.backend.name()
    }
}

fn cpu(threads: usize) -> Box<dyn Backend> {
    let mut b = CpuBackend::default();
    b.options.threads = threads.max(1);
    Box::new(b)
}

fn gpu(b: CudaBackend) -> Chosen {
    Chosen {
        line: format!("backend: cuda ({})", b.info()),
        gpu_sms: Some(b.info().sms),
        backend: Box::new(b),
    }
}

/// The CUDA backend on the default device with the environment's knobs.
fn open_cuda() -> Result<CudaBackend, CudaError> {
    CudaOptions::from_env().and_then(CudaBackend::new)
}

/// First line of a message (the note is one line).
pub fn one_line(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    s.lines().next().unwrap_or_default().trim_end().to_string()
}

/// Opens the backend `kind` names; `cpu_threads` are the CPU VM's worker threads.
pub fn choose(kind: BackendKind, cpu_threads: usize) -> Result<Chosen, BackendUnavailable> {
    match kind {
        BackendKind::Cpu => Ok(Chosen {
            backend: cpu(cpu_threads),
            line: "backend: cpu".into(),
            gpu_sms: None,
        }),
        BackendKind::Cuda => open_cuda().map(gpu).map_err(BackendUnavailable),
        BackendKind::Auto => match open_cuda() {
            Ok(b) => Ok(gpu(b)),
            Err(e) => Ok(Chosen {
                backend: cpu(cpu_threads),
                line: auto_cpu_line(&e),
                gpu_sms: None,
            }),
        },
    }
}

/// The line for `auto` falling back to the CPU VM: plain `backend: cpu` on a build without the
/// `cuda` feature (the default build, where the CPU VM is what a user expects), the reason
/// when this build has the CUDA backend but cannot open it (no driver, no GPU).
fn auto_cpu_line(e: &dyn std::fmt::Display) -> String {
    if cfg!(feature = "cuda") {
        format!("backend: cpu (cuda unavailable: {})", one_line(e))
    } else {
        "backend: cpu".into()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests

    use super::*;

    #[test]
    fn cpu_is_always_available() {
        let c = choose(BackendKind::Cpu, 4).unwrap();
        assert_eq!(c.name(), "cpu");
        assert_eq!(c.line, "backend: cpu");
        assert_eq!(c.gpu_sms, None);
    }

    #[test]
    fn names_parse_and_others_are_refused() {
        assert_eq!("cpu".parse(), Ok(BackendKind::Cpu));
        assert_eq!("cuda".parse(), Ok(BackendKind::Cuda));
        assert_eq!("auto".parse(), Ok(BackendKind::Auto));
        let err = "gpu".parse::<BackendKind>().unwrap_err();
        assert_eq!(
            err,
            "backend \"gpu\" is not one of \"cpu\", \"cuda\", \"auto\""
        );
    }

    #[test]
    fn auto_and_cuda_agree_with_the_cuda_crate() {
        let auto = choose(BackendKind::Auto, 1).unwrap();
        match open_cuda() {
            Ok(_) => {
                assert_eq!(auto.name(), "cuda");
                assert!(auto.line.starts_with("backend: cuda ("), "{}", auto.line);
                assert_eq!(choose(BackendKind::Cuda, 1).unwrap().name(), "cuda");
            }
            Err(e) => {
                assert_eq!(auto.name(), "cpu");
                let want = if cfg!(feature = "cuda") {
                    format!("backend: cpu (cuda unavailable: {})", one_line(&e))
                } else {
                    "backend: cpu".to_string()
                };
                assert_eq!(auto.line, want);
                let Err(err) = choose(BackendKind::Cuda, 1) else {
                    panic!("--backend cuda opened although the CUDA backend did not");
                };
                assert!(err.to_string().contains(&one_line(&e)), "{err}");
            }
        }
    }
}
