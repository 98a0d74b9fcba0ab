//! `--backend cpu|cuda|auto`, shared by `amk run`, `amk generate`, `amk perplexity` and
//! `amk serve`: the choice itself is `amk_backend_choice`'s (the Python package makes it the
//! same way); here the line that says which backend runs goes to stderr, so stdout stays the
//! command's output (pure JSON under `--json`).

pub use amk_backend_choice::{BackendKind, BackendUnavailable, Chosen, choose};

/// [`choose`], then the `backend: ...` line on stderr.
pub fn open(kind: BackendKind, cpu_threads: usize) -> Result<Chosen, BackendUnavailable> {
    let chosen = choose(kind, cpu_threads)?;
    crate::status::status!("{}", chosen.line);
    Ok(chosen)
}
