//! Every byte the CLI writes goes through here, so that a closed pipe or a full disk is an exit
//! code and never a panic (std's `println!` and `eprintln!` panic when their write fails).
//!
//! Policy, applied by [`finish`] when the command returns:
//! - a closed pipe (`EPIPE`) on stdout or stderr ends the command quietly with its own exit
//!   code (0 when it succeeded), as `cat` does: the reader went away, nothing was lost that it
//!   wanted;
//! - any other write error (a full disk, `/dev/full`) exits 2, with a message on stderr while
//!   stderr still works.
//!
//! Commands that produce output for a long time stop early once stdout is closed
//! ([`stdout_closed`]).

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::Mutex;

/// The first write error of each stream.
#[derive(Default)]
struct Failures {
    stdout: Option<io::Error>,
    stderr: Option<io::Error>,
}

static FAILURES: Mutex<Failures> = Mutex::new(Failures {
    stdout: None,
    stderr: None,
});

fn note(on_stdout: bool, e: io::Error) {
    if let Ok(mut f) = FAILURES.lock() {
        let slot = if on_stdout {
            &mut f.stdout
        } else {
            &mut f.stderr
        };
        slot.get_or_insert(e);
    }
}

/// Writes to stdout; a failure is remembered for [`finish`] (later writes are skipped).
pub fn write_out(args: fmt::Arguments<'_>) {
    if stdout_failed() {
        return;
    }
    if let Err(e) = io::stdout().lock().write_fmt(args) {
        note(true, e);
    }
}

/// Writes raw bytes to stdout (a result that is not text).
pub fn write_out_bytes(bytes: &[u8]) {
    if stdout_failed() {
        return;
    }
    if let Err(e) = io::stdout().lock().write_all(bytes) {
        note(true, e);
    }
}

/// Flushes stdout (a partial line the reader should see now).
pub fn flush_out() {
    if stdout_failed() {
        return;
    }
    if let Err(e) = io::stdout().lock().flush() {
        note(true, e);
    }
}

/// The most bytes one stderr message shows: an error quoting hostile input (a 100 MB string
/// in a program, a name of any length) must not become a line of that size.
pub const MAX_ERR_BYTES: usize = 16 << 10;

/// Writes to stderr, each message cut at [`MAX_ERR_BYTES`] (saying how much was cut); a
/// failure is remembered for [`finish`].
pub fn write_err(args: fmt::Arguments<'_>) {
    if FAILURES.lock().is_ok_and(|f| f.stderr.is_some()) {
        return;
    }
    let full = args.to_string();
    let text = bounded(&full, MAX_ERR_BYTES);
    if let Err(e) = io::stderr().lock().write_all(text.as_bytes()) {
        note(false, e);
    }
}

/// `text` cut at `max` bytes (on a character boundary) with a note of what was left out, its
/// final newline kept; unchanged when short enough.
pub fn bounded(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let nl = if text.ends_with('\n') { "\n" } else { "" };
    format!(
        "{} … ({} more bytes not shown){nl}",
        &text[..cut],
        text.len() - cut
    )
    .into()
}

fn stdout_failed() -> bool {
    FAILURES.lock().is_ok_and(|f| f.stdout.is_some())
}

/// Whether stderr has failed a write.
pub fn stderr_failed() -> bool {
    FAILURES.lock().is_ok_and(|f| f.stderr.is_some())
}

/// Whether stdout can no longer be written (its reader is gone, or its device is full):
/// producing more of it is pointless.
pub fn stdout_closed() -> bool {
    stdout_failed()
}

/// The exit code of a command that returned `code`, after its output: stdout flushed, then
/// the policy of this module's docs.
pub fn finish(code: ExitCode) -> ExitCode {
    flush_out();
    let Ok(f) = FAILURES.lock() else {
        return ExitCode::from(2);
    };
    let broken = |e: &Option<io::Error>| e.as_ref().map(|e| e.kind() == io::ErrorKind::BrokenPipe);
    match (broken(&f.stdout), broken(&f.stderr)) {
        (Some(false), _) => {
            if f.stderr.is_none()
                && let Some(e) = &f.stdout
            {
                let _ = writeln!(io::stderr(), "error: writing to standard output: {e}");
            }
            ExitCode::from(2)
        }
        (_, Some(false)) => ExitCode::from(2),
        _ => code,
    }
}

/// `print!` through [`write_out`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_out(format_args!($($arg)*))
    };
}
/// `println!` through [`write_out`].
macro_rules! outln {
    () => {
        $crate::output::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}
/// `eprintln!` through [`write_err`].
macro_rules! errln {
    () => {
        $crate::output::write_err(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use {errln, out, outln};
