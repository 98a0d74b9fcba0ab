//! The short-context decode program: a second decode-loop program of the same model, loaded
//! beside the engine's own, that runs the passes at positions below a bound. Why: the layout
//! that keeps the step flat at long context (the attention split over every SM, its partials
//! merged before the output projection) has a fixed cost at every position, which a layout of
//! one attention task a KV head writing finished rows does not pay; that one's time grows with
//! the cache instead, so it wins while the cache is short (docs/perf-notes.md rounds 36, 39).
//! Both are validated programs over the same KV caches; the engine hands the loop's state
//! (position and token) from one to the other between launches.

use crate::EngineError;
use crate::interface::Interface;
use amk_core::{Program, Session, ValidatedProgram, decode};

/// A decode-loop program for the positions below `below`.
pub(crate) struct ShortDecode {
    pub(crate) session: Box<dyn Session>,
    /// The program the session runs (its task labels name a trace's tasks).
    pub(crate) program: ValidatedProgram,
    /// The first position it does not run.
    pub(crate) below: u64,
}

/// Which decode program runs a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bucket {
    /// The engine's own program (any position).
    Main,
    /// The short-context program.
    Short,
}

impl ShortDecode {
    /// The program for the pass at `pos`, and how many passes it may run from there.
    pub(crate) fn bucket_at(short: Option<&ShortDecode>, pos: u64) -> (Bucket, u64) {
        match short {
            Some(s) if pos < s.below => (Bucket::Short, s.below - pos),
            _ => (Bucket::Main, u64::MAX),
        }
    }
}

/// Checks that `p` can run passes in place of `main` (whose interface is `io`): the same
/// decode-loop interface and every KV cache one of `main`'s, so that either program attends
/// to the rows the other wrote.
pub(crate) fn check_short(p: &Program, main: &Program, io: &Interface) -> Result<(), EngineError> {
    let other = Interface::of(p)?;
    if other != *io {
        return Err(EngineError::Interface(format!(
            "the short-context program's interface ({other:?}) is not the decode program's \
             ({io:?})"
        )));
    }
    crate::interface::caches_shared(p, main, "short-context program")
}

/// Hands the loop's state from `from` to `to`: the position the next pass runs and the token
/// it feeds (the inputs both got when the request started; the emitted rows before the
/// position were reported already).
pub(crate) fn hand_over(from: &mut dyn Session, to: &mut dyn Session) -> Result<(), EngineError> {
    let token = from.read(decode::TOKEN)?;
    let pos = from.read(decode::POS)?;
    to.write(&[(decode::TOKEN, token), (decode::POS, pos)])?;
    Ok(())
}
