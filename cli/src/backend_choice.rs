//! `--backend cpu|cuda|auto`, shared by `amk run`, `amk generate` and `amk perplexity`.
//!
//! `cpu` is the CPU VM; `cuda` opens the GPU megakernel backend or fails with the reason
//! (built without the `cuda` feature, no driver, no device, ...); `auto` (the default) takes
//! the GPU when it opens and the CPU VM otherwise. Whichever runs, one line on stderr says so
//! (and why), so stdout stays the command's output (pure JSON under `--json`).

use amk_backend_cpu::CpuBackend;
use amk_backend_cuda::{CudaBackend, CudaError, CudaOptions};
use amk_core::Backend;

/// Which backend runs the program.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU VM (reference semantics; always available).
    Cpu,
    /// The CUDA megakernel (needs a build with `--features cuda`, an NVIDIA driver and a GPU).
    Cuda,
    /// CUDA when this build has it and a GPU is present, else the CPU VM.
    #[default]
    Auto,
}

/// `--backend cuda` was asked for but the GPU backend cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("--backend cuda: the CUDA backend is unavailable: {0}")]
pub struct BackendUnavailable(pub CudaError);

/// The opened backend and the stderr line that announced it.
pub struct Chosen {
    /// The backend.
    pub backend: Box<dyn Backend>,
    /// `backend: NAME (WHY)` as printed on stderr.
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

/// First line of a message (the stderr note is one line).
fn one_line(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    s.lines().next().unwrap_or_default().trim_end().to_string()
}

/// Opens the backend `kind` names without printing anything; `cpu_threads` are the CPU VM's
/// worker threads.
pub fn choose(kind: BackendKind, cpu_threads: usize) -> Result<Chosen, BackendUnavailable> {
    match kind {
        BackendKind::Cpu => Ok(Chosen {
            backend: cpu(cpu_threads),
            line: "backend: cpu".into(),
            gpu_sms: None,
        }),
        BackendKind::Cuda => CudaBackend::new(CudaOptions::default())
            .map(gpu)
            .map_err(BackendUnavailable),
        BackendKind::Auto => match CudaBackend::new(CudaOptions::default()) {
            Ok(b) => Ok(gpu(b)),
            Err(e) => Ok(Chosen {
                backend: cpu(cpu_threads),
                line: auto_cpu_line(&e),
                gpu_sms: None,
            }),
        },
    }
}

/// The line for `--backend auto` falling back to the CPU VM: plain `backend: cpu` on a build
/// without the `cuda` feature (the default build, where the CPU VM is what a user expects),
/// the reason when this build has the CUDA backend but cannot open it (no driver, no GPU).
fn auto_cpu_line(e: &dyn std::fmt::Display) -> String {
    if cfg!(feature = "cuda") {
        format!("backend: cpu (cuda unavailable: {})", one_line(e))
    } else {
        "backend: cpu".into()
    }
}

/// [`choose`], then the `backend: ...` line on stderr.
pub fn open(kind: BackendKind, cpu_threads: usize) -> Result<Chosen, BackendUnavailable> {
    let chosen = choose(kind, cpu_threads)?;
    crate::status::status!("{}", chosen.line);
    Ok(chosen)
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
    }

    #[test]
    fn auto_and_cuda_agree_with_the_cuda_crate() {
        let auto = choose(BackendKind::Auto, 1).unwrap();
        match CudaBackend::new(CudaOptions::default()) {
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
                    panic!("--backend cuda opened although CudaBackend::new failed");
                };
                assert!(err.to_string().contains(&one_line(&e)), "{err}");
            }
        }
    }
}
