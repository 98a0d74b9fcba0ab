//! The prefill programs an engine runs beside its decode loop
//! (`amk_model_llama::lower::prefill`): how a chunk of tokens goes through one, and the
//! interface a program must have to be one.

use crate::EngineError;
use crate::engine::ints;
use amk_core::{DType, Program, Session, decode};
use amk_model_llama::lower::prefill::{
    IDS as PREFILL_IDS, LAST as PREFILL_LAST, LIMITS as PREFILL_LIMITS, NLL as PREFILL_NLL,
    POS as PREFILL_POS, STATS as PREFILL_STATS, TARGETS as PREFILL_TARGETS,
};

/// A prefill program loaded beside the decode program: it writes a chunk of prompt tokens'
/// K/V rows into the caches the decode program reads (and, a scorer's, every row's logits).
pub(crate) struct Prefill {
    pub(crate) session: Box<dyn Session>,
    pub(crate) rows: u64,
    /// What the program computes beside the K/V rows.
    pub(crate) logits: Logits,
    /// A scorer that computes each row's NLL of its target itself (the targets an input).
    pub(crate) nll: bool,
    /// A prompt program that summarises its last row's logits (LOGIT_STATS into
    /// `prefill.stats`, under the vocabulary limit of its `prefill.limits` input).
    pub(crate) stats: bool,
}

/// What a chunk's pass reads back: its outputs of these names.
pub(crate) type ReadBack<'a> = &'a mut dyn FnMut(Chunk) -> Vec<&'static str>;

impl Prefill {
    /// Runs one chunk: prompt rows `ids[first..first + len]` at positions from `first`, padded
    /// to the program's rows with id 0 at the positions after them (which decoding overwrites
    /// before it reads them); a scorer's targets are the ids after each row's (0 on padding).
    /// Reads back the outputs named `read`.
    fn run_chunk(
        &mut self,
        ids: &[u32],
        Chunk { rows, first, len }: Chunk,
        vocab_limit: usize,
        read: &[&str],
    ) -> Result<amk_core::Outputs, EngineError> {
        let padded = |from: u64, n: u64| -> Vec<i64> {
            let mut v: Vec<i64> = (ids.iter().skip(from as usize).take(n as usize))
                .map(|&t| i64::from(t))
                .collect();
            v.resize(rows as usize, 0);
            v
        };
        let pos: Vec<i64> = (first as i64..(first + rows) as i64).collect();
        let mut inputs = vec![
            (PREFILL_IDS, ints(&[rows], &padded(first, len))?),
            (PREFILL_POS, ints(&[rows], &pos)?),
        ];
        if self.logits == Logits::Last {
            inputs.push((PREFILL_LAST, ints(&[1], &[len as i64 - 1])?));
        }
        if self.nll {
            inputs.push((PREFILL_TARGETS, ints(&[rows], &padded(first + 1, len))?));
        }
        if self.stats {
            let mut limits = vec![0i64; decode::LIMITS_LEN as usize];
            limits[decode::LIMIT_VOCAB] = vocab_limit as i64;
            inputs.push((PREFILL_LIMITS, ints(&[decode::LIMITS_LEN], &limits)?));
        }
        Ok(self.session.step_reading(&inputs, read)?)
    }

    /// Runs `ids[..n - 1]` through the program a chunk of rows a pass (the last chunk padded),
    /// as far as whole chunks fit a cache of `max_seq` rows ([`feed_chunks`] with this one
    /// program; the last id is only ever predicted).
    pub(crate) fn feed(
        &mut self,
        ids: &[u32],
        max_seq: u64,
        read: ReadBack<'_>,
        on: &mut dyn FnMut(u64, u64, &amk_core::Outputs),
    ) -> Result<u64, EngineError> {
        let todo = ids.len().saturating_sub(1) as u64;
        let to = FeedTo {
            todo,
            max_seq,
            vocab_limit: 0,
        };
        feed_chunks(std::slice::from_mut(self), ids, to, read, on)
    }
}

/// One chunk of a prompt: which program (by its rows) takes prompt rows `[first, first +
/// len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// The program's rows.
    pub(crate) rows: u64,
    /// The chunk's first position.
    pub(crate) first: u64,
    /// Its real rows (the rest of the program's rows are padding).
    pub(crate) len: u64,
}

/// The chunks that `todo` prompt rows go through with programs of `sizes` rows: each chunk
/// the smallest program that takes all the rest, else the largest — among those whose rows
/// fit a cache of `max_seq` rows from the chunk's first position. Rows no program fits are
/// left (the decode loop writes them). A short prompt then runs a chunk its size instead of a
/// mostly padded one.
pub(crate) fn plan_chunks(sizes: &[u64], todo: u64, max_seq: u64) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut done = 0u64;
    while done < todo {
        let rest = todo - done;
        let fits = sizes
            .iter()
            .copied()
            .filter(|&r| r > 0 && done.saturating_add(r) <= max_seq);
        let smallest_whole = fits.clone().filter(|&r| r >= rest).min();
        let Some(rows) = smallest_whole.or_else(|| fits.max()) else {
            break;
        };
        let len = rest.min(rows);
        out.push(Chunk {
            rows,
            first: done,
            len,
        });
        done += len;
    }
    out
}

/// How far [`feed_chunks`] feeds a sequence, and what its programs' summaries assume.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeedTo {
    /// Tokens to write (at most the sequence's).
    pub(crate) todo: u64,
    /// The cache's rows.
    pub(crate) max_seq: u64,
    /// The vocabulary limit of a prompt program's summaries (`≤ 0`: none).
    pub(crate) vocab_limit: usize,
}

/// Runs `ids[..to.todo]` through the programs `progs`, chunks by [`plan_chunks`]; returns the
/// tokens run. After each chunk `on` gets its first position, its real rows and the outputs
/// `read` named for it.
pub(crate) fn feed_chunks(
    progs: &mut [Prefill],
    ids: &[u32],
    to: FeedTo,
    read: ReadBack<'_>,
    on: &mut dyn FnMut(u64, u64, &amk_core::Outputs),
) -> Result<u64, EngineError> {
    let sizes: Vec<u64> = progs.iter().map(|p| p.rows).collect();
    let todo = to.todo.min(ids.len() as u64);
    let mut done = 0u64;
    for c in plan_chunks(&sizes, todo, to.max_seq) {
        let Some(p) = progs.iter_mut().find(|p| p.rows == c.rows) else {
            break;
        };
        let out = p.run_chunk(ids, c, to.vocab_limit, &read(c))?;
        on(c.first, c.len, &out);
        done = c.first + c.len;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::{Chunk, plan_chunks};

    fn plan(sizes: &[u64], todo: u64, max_seq: u64) -> Vec<(u64, u64, u64)> {
        plan_chunks(sizes, todo, max_seq)
            .into_iter()
            .map(|Chunk { rows, first, len }| (rows, first, len))
            .collect()
    }

    #[test]
    fn a_short_prompt_takes_the_small_program() {
        assert_eq!(plan(&[128, 512], 100, 4096), [(128, 0, 100)]);
        assert_eq!(plan(&[128, 512], 128, 4096), [(128, 0, 128)]);
        assert_eq!(plan(&[128, 512], 129, 4096), [(512, 0, 129)]);
    }

    #[test]
    fn a_long_prompt_takes_large_chunks_then_the_small_one() {
        assert_eq!(
            plan(&[128, 512], 1100, 4096),
            [(512, 0, 512), (512, 512, 512), (128, 1024, 76)]
        );
    }

    #[test]
    fn chunks_stop_where_no_program_fits_the_cache() {
        // 512 rows from 0 fit a cache of 600; from 512 only the 64-row program fits.
        assert_eq!(plan(&[64, 512], 700, 600), [(512, 0, 512), (64, 512, 64)]);
        assert_eq!(plan(&[512], 700, 600), [(512, 0, 512)]);
        assert!(plan(&[512], 10, 100).is_empty());
    }

    #[test]
    fn one_program_pads_its_last_chunk() {
        assert_eq!(plan(&[8], 20, 32), [(8, 0, 8), (8, 8, 8), (8, 16, 4)]);
        assert!(plan(&[8], 0, 32).is_empty());
        assert!(plan(&[], 5, 32).is_empty());
    }
}

/// What a prefill program computes beside the chunk's K/V rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Logits {
    /// Nothing.
    None,
    /// One row, chosen by `prefill.last` (a prompt program: the logits of a prompt's last
    /// token, from which the engine chooses the first generated one).
    Last,
    /// Every row's (scoring).
    Every,
}

/// What the engine needs to know of a prefill program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillShape {
    /// Tokens a pass takes.
    pub(crate) rows: u64,
    /// Its logits.
    pub(crate) logits: Logits,
    /// Whether it scores each row's target itself ([`Prefill::nll`]).
    pub(crate) nll: bool,
    /// Whether it summarises its last row's logits ([`Prefill::stats`]).
    pub(crate) stats: bool,
}

/// The rows of a prefill program (`amk_model_llama::lower::prefill`), checked against the
/// decode program `decode` whose caches it writes, and whether its logits are one chosen row:
/// its ids and positions are I32 inputs of one length (the rows); with a `prefill.last` input
/// (one I32) its `logits` are one row of `vocab`, without one they are a row of `vocab` for
/// every row — and then a `prefill.targets` input (I32) and a `prefill.nll` output (F32) of a
/// value a row may come with them, both or neither; each of its KV caches is one of `decode`'s
/// (name, dtype and shape).
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
    let kind = match (last, logits) {
        (Some(1), n) if n == vocab as u64 => Some(Logits::Last),
        (None, 0) => Some(Logits::None),
        (None, n) if n == rows * vocab as u64 => Some(Logits::Every),
        _ => None,
    };
    let (Some(kind), true) = (kind, rows > 0 && input(PREFILL_POS)? == Some(rows)) else {
        return Err(EngineError::Interface(format!(
            "the prefill program's '{PREFILL_IDS}' and '{PREFILL_POS}' must hold its rows, \
             '{PREFILL_LAST}' (if any) one element, and '{}' one row of {vocab} logits (with \
             '{PREFILL_LAST}'), one a row, or none",
            decode::LOGITS
        )));
    };
    let nll = scores_itself(p, rows, kind)?;
    let stats = summarises_itself(p, vocab, kind)?;
    crate::interface::caches_shared(p, decode, "prefill program")?;
    Ok(PrefillShape {
        rows,
        logits: kind,
        nll,
        stats,
    })
}

/// Whether a prefill program with logits `kind` summarises its logits row: a `prefill.limits`
/// I32 input of NEXT_TOKEN's limits and a `prefill.stats` I32 output of LOGIT_STATS's summaries
/// (four words a slot, slots covering a row of `vocab`), only with one row's logits, both or
/// neither.
fn summarises_itself(p: &Program, vocab: usize, kind: Logits) -> Result<bool, EngineError> {
    use amk_core::BufferKind;
    let limits = optional_buffer(p, PREFILL_LIMITS, |b| {
        b.kind == BufferKind::IO_INPUT && b.dtype == DType::I32 && b.numel() == decode::LIMITS_LEN
    })
    .map_err(|()| format!("one I32 input of {} elements", decode::LIMITS_LEN));
    let stats = optional_buffer(p, PREFILL_STATS, |b| {
        b.kind == BufferKind::IO_OUTPUT
            && b.dtype == DType::I32
            && matches!(b.shape[..], [r, g] if r == op_logit_stats::ROWS && g >= 1 && g <= vocab as u64)
    })
    .map_err(|()| {
        format!(
            "one I32 output of {} rows and at most {vocab} slots",
            op_logit_stats::ROWS
        )
    });
    together(
        [(PREFILL_LIMITS, limits), (PREFILL_STATS, stats)],
        kind == Logits::Last,
        "one row's logits",
    )
}

/// Whether a prefill program of `rows` rows and logits `kind` computes its rows' NLLs: a
/// `prefill.targets` I32 input and a `prefill.nll` F32 output of a value a row (only with every
/// row's logits), or neither.
fn scores_itself(p: &Program, rows: u64, kind: Logits) -> Result<bool, EngineError> {
    use amk_core::BufferKind;
    let one = |name: &str, kind: BufferKind, dtype: DType| {
        optional_buffer(p, name, |b| {
            b.kind == kind && b.dtype == dtype && b.numel() == rows
        })
        .map_err(|()| {
            let io = match kind {
                BufferKind::IO_INPUT => "input",
                _ => "output",
            };
            format!("one {dtype} {io} of {rows} elements")
        })
    };
    together(
        [
            (
                PREFILL_TARGETS,
                one(PREFILL_TARGETS, BufferKind::IO_INPUT, DType::I32),
            ),
            (
                PREFILL_NLL,
                one(PREFILL_NLL, BufferKind::IO_OUTPUT, DType::F32),
            ),
        ],
        kind == Logits::Every,
        "every row's logits",
    )
}

/// Whether `p` has the buffer `name`: none (`false`), one that `fits` (`true`), or anything
/// else (`Err`).
fn optional_buffer(
    p: &Program,
    name: &str,
    fits: impl Fn(&amk_core::Buffer) -> bool,
) -> Result<bool, ()> {
    let found: Vec<_> = p.buffers.iter().filter(|b| b.name == name).collect();
    match found[..] {
        [] => Ok(false),
        [b] if fits(b) => Ok(true),
        _ => Err(()),
    }
}

/// Two optional buffers of a prefill program that come together, and only where `allowed`
/// (`with` says when): whether the program has them. `Err` of a buffer's check: what it must be.
fn together(
    [(a, ha), (b, hb)]: [(&str, Result<bool, String>); 2],
    allowed: bool,
    with: &str,
) -> Result<bool, EngineError> {
    let must = |name: &str, what: String| {
        EngineError::Interface(format!("the prefill program's '{name}' must be {what}"))
    };
    let ha = ha.map_err(|w| must(a, w))?;
    let hb = hb.map_err(|w| must(b, w))?;
    match (ha, hb) {
        (false, false) => Ok(false),
        (true, true) if allowed => Ok(true),
        _ => Err(EngineError::Interface(format!(
            "the prefill program's '{a}' and '{b}' come together, and only with {with}"
        ))),
    }
}
