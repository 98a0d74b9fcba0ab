//! The prefill programs an engine runs beside its decode loop
//! (`amk_model_llama::lower::prefill`): how a chunk of tokens goes through one, and the
//! interface a program must have to be one.

use crate::EngineError;
use crate::engine::ints;
use amk_core::{DType, Program, Session, decode};
use amk_model_llama::lower::prefill::{
    IDS as PREFILL_IDS, LAST as PREFILL_LAST, POS as PREFILL_POS,
};

/// A prefill program loaded beside the decode program: it writes a chunk of prompt tokens'
/// K/V rows into the caches the decode program reads (and, a scorer's, every row's logits).
pub(crate) struct Prefill {
    pub(crate) session: Box<dyn Session>,
    pub(crate) rows: u64,
    /// Its logits are one row, chosen by the `prefill.last` input (generation); otherwise
    /// every row's (scoring).
    pub(crate) last: bool,
}

impl Prefill {
    /// Runs `ids[..n - 1]` through the program a chunk of rows a pass (the last chunk padded
    /// with id 0 at the positions after it, which decoding overwrites before it reads them),
    /// as far as whole chunks fit a cache of `max_seq` rows; returns the tokens run. After each
    /// chunk `on` gets its first position, its real rows and the pass's outputs.
    pub(crate) fn feed(
        &mut self,
        ids: &[u32],
        max_seq: u64,
        on: &mut dyn FnMut(u64, u64, &amk_core::Outputs),
    ) -> Result<u64, EngineError> {
        let rows = self.rows;
        let todo = ids.len().saturating_sub(1) as u64;
        let mut done = 0u64;
        while done < todo && done + rows <= max_seq {
            let len = (todo - done).min(rows);
            let mut chunk: Vec<i64> = ids[done as usize..(done + len) as usize]
                .iter()
                .map(|&t| i64::from(t))
                .collect();
            chunk.resize(rows as usize, 0);
            let pos: Vec<i64> = (done as i64..(done + rows) as i64).collect();
            let mut inputs = vec![
                (PREFILL_IDS, ints(&[rows], &chunk)?),
                (PREFILL_POS, ints(&[rows], &pos)?),
            ];
            if self.last {
                inputs.push((PREFILL_LAST, ints(&[1], &[len as i64 - 1])?));
            }
            let out = self.session.step(&inputs)?;
            on(done, len, &out);
            done += len;
        }
        Ok(done)
    }
}

/// The rows of a prefill program (`amk_model_llama::lower::prefill`), checked against the
/// decode program `decode` whose caches it writes, and whether its logits are one chosen row:
/// its ids and positions are I32 inputs of one length (the rows); with a `prefill.last` input
/// (one I32) its `logits` are one row of `vocab`, without one they are a row of `vocab` for
/// every row; each of its KV caches is one of `decode`'s (name, dtype and shape).
/// What the engine needs to know of a prefill program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillShape {
    /// Tokens a pass takes.
    pub(crate) rows: u64,
    /// Its logits are one row chosen by `prefill.last` (generation), not every row's.
    pub(crate) last: bool,
}

pub(crate) fn prefill_interface(
    p: &Program,
    decode: &Program,
    vocab: usize,
) -> Result<PrefillShape, EngineError> {
    let named = |name: &str| -> Vec<&amk_core::Buffer> {
        p.buffers.iter().filter(|b| b.name == name).collect()
    };
    let input = |name: &str| -> Result<Option<u64>, EngineError> {
        match named(name)[..] {
            [] => Ok(None),
            [b] if b.kind == amk_core::BufferKind::IO_INPUT && b.dtype == DType::I32 => {
                Ok(Some(b.numel()))
            }
            _ => Err(EngineError::Interface(format!(
                "the prefill program's '{name}' must be one I32 input"
            ))),
        }
    };
    let rows = input(PREFILL_IDS)?.unwrap_or(0);
    let last = input(PREFILL_LAST)?;
    let logits = match named(decode::LOGITS)[..] {
        [b] if b.kind == amk_core::BufferKind::IO_OUTPUT => b.numel(),
        _ => 0,
    };
    let want_logits = if last.is_some() { 1 } else { rows } * vocab as u64;
    if rows == 0
        || input(PREFILL_POS)? != Some(rows)
        || last.is_some_and(|n| n != 1)
        || logits != want_logits
    {
        return Err(EngineError::Interface(format!(
            "the prefill program's '{PREFILL_IDS}' and '{PREFILL_POS}' must hold its rows, \
             '{PREFILL_LAST}' (if any) one element, and '{}' one row of {vocab} logits (with \
             '{PREFILL_LAST}') or one a row",
            decode::LOGITS
        )));
    }
    for b in p
        .buffers
        .iter()
        .filter(|b| b.kind == amk_core::BufferKind::KV_CACHE)
    {
        if !decode.buffers.iter().any(|d| d.same_slot(b)) {
            return Err(EngineError::Interface(format!(
                "the prefill program's KV cache '{}' is not one of the decode program's",
                b.name
            )));
        }
    }
    Ok(PrefillShape {
        rows,
        last: last.is_some(),
    })
}
