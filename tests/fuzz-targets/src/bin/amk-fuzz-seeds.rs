//! Writes every target's seed corpus ([`amk_fuzz_targets::seeds`]) as files under
//! `DIR/<target>/`, the directories `cargo fuzz run <target> DIR/<target>` grows.
//!
//!     cargo run -p amk-fuzz-targets --bin amk-fuzz-seeds -- tests/fuzz-targets/fuzz/corpus

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: amk-fuzz-seeds DIR");
        return ExitCode::from(2);
    };
    let dir = std::path::PathBuf::from(dir);
    for t in amk_fuzz_targets::TARGETS {
        let sub = dir.join(t.name);
        let written = std::fs::create_dir_all(&sub).and_then(|()| {
            for (i, seed) in amk_fuzz_targets::seeds(t.name).iter().enumerate() {
                std::fs::write(sub.join(format!("seed-{i}")), seed)?;
            }
            Ok(())
        });
        if let Err(e) = written {
            eprintln!("error: {}: {e}", sub.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
