//! Status lines on stderr — the backend line, progress, summaries — and the global `-q` that
//! silences them. Results go to stdout and errors and warnings to stderr whatever `-q` says.

use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Sets `-q` for the process (once, before the command runs).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `-q` was given: no status lines.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// `eprintln!` for a status line: nothing under `-q`.
macro_rules! status {
    ($($arg:tt)*) => {
        if !$crate::status::quiet() {
            $crate::output::errln!($($arg)*);
        }
    };
}
pub(crate) use status;
