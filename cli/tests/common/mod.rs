//! Helpers shared by the CLI tests that check `--backend`.

use std::process::Output;

/// The device `--backend auto` would pick, or why there is none (as the CLI reports it).
pub fn gpu() -> Result<String, String> {
    amk_backend_cuda::CudaOptions::from_env()
        .and_then(amk_backend_cuda::CudaBackend::new)
        .map(|b| b.info().to_string())
        .map_err(|e| e.to_string())
}

/// The one `backend: ...` line on stderr.
pub fn backend_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("backend:")).collect();
    assert_eq!(lines.len(), 1, "one backend line expected: {err}");
    lines[0].to_string()
}

/// `line` says the CPU VM runs because CUDA is unavailable: plainly `backend: cpu` on a build
/// without the cuda feature (the default build), with the reason `why` on one with it.
pub fn assert_cpu_fallback(line: &str, why: &str) {
    if !cfg!(feature = "cuda") {
        assert!(why.contains("built without the `cuda` feature"), "{why}");
        assert_eq!(line, "backend: cpu");
        return;
    }
    assert!(
        line.starts_with("backend: cpu (cuda unavailable:"),
        "{line}"
    );
    assert!(
        line.contains(why.lines().next().unwrap_or_default()),
        "{line}"
    );
}
