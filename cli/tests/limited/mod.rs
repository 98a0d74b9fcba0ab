//! `amk` in a child under a 1 GiB address-space limit (`prlimit --as`): a child that went past
//! it would abort instead of exiting with its typed error, so hostile-input tests see a runaway
//! allocation as a failure. Without `/usr/bin/prlimit` the command runs unlimited (with a note).

use std::path::Path;
use std::process::Command;

/// The address-space limit.
pub const LIMIT_BYTES: u64 = 1 << 30;

/// `amk` (arguments to add) under [`LIMIT_BYTES`] of address space.
pub fn amk_limited() -> Command {
    let prlimit = Path::new("/usr/bin/prlimit");
    if !prlimit.exists() {
        eprintln!("note: /usr/bin/prlimit is missing: running without the address-space limit");
        return Command::new(env!("CARGO_BIN_EXE_amk"));
    }
    let mut c = Command::new(prlimit);
    c.arg(format!("--as={LIMIT_BYTES}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_amk"));
    c
}
