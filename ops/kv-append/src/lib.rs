//! Opcode `KV_APPEND` (code 16): Writes new K or V rows into the cache at pos, in place.
//!
//! Inputs `[new, cache]` with param `pos`, or `[new, cache, pos]` where `pos` is an integer
//! buffer whose element 0 is the row; one output, the cache itself. Why the input: a decode
//! step then sets one element of a buffer (as QKV_ROPE_APPEND and ROPE read theirs) instead of
//! patching every layer's KV_APPEND params each token. The param and the input are exclusive
//! (one source of truth: a task given both is refused). A position from the input is data,
//! checked when the task runs (a row outside the cache is an index error); the static rule
//! checks only that the new rows fit the cache at all.
//!
//! Params `n_off` and `N_tile` (both or neither; `[max_seq, …]` caches only) make the task
//! write only columns `[n_off, n_off + N_tile)` of each new row: a prompt chunk's append split
//! over several tasks on one counter, each its slice of every row, where one task on one SM
//! took 22 µs of every 1B layer (docs/perf-notes.md round 42). Such a task overwrites its
//! columns without reading the cache ([`WriteRegion::OverwrittenColumns`]), so the validator
//! takes slices with disjoint columns as one append.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`kv-append.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    ErrorKind, Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference,
    TaskContext, WriteRegion,
};
use std::borrow::Cow;

pub mod reference;

/// Shared memory a block needs at least: the device function copies many rows at once (a
/// prefill chunk's) through a ring of stages in whatever the launch has, at least this much (a
/// prompt program's tiles give it 96 KB). Through registers alone (16 KB of loads in flight a
/// block) a 1B model's 512-row append took 45 µs (docs/perf-notes.md round 37).
pub const SHARED_BYTES: u32 = 32 << 10;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::KV_APPEND,
    name: Cow::Borrowed("KV_APPEND"),
    min_inputs: 2,
    max_inputs: Some(3),
    n_outputs: Some(1),
    // Required without the position input, refused with it: the rule below says which.
    params: Cow::Borrowed(&[
        ParamDecl::optional("pos", ParamType::Int),
        ParamDecl::optional("n_off", ParamType::Int),
        ParamDecl::optional("N_tile", ParamType::Int),
    ]),
    write_region: WriteRegion::OverwrittenColumns,
    check: Some(check),
    summary: Cow::Borrowed(
        "Writes new K or V rows into the cache at pos (param, or element 0 of a 3rd input), in place.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[(1, 0)] }),
        cuda: Some(
            amk_core::CudaSource::builtin(include_str!("kv-append.cu"), "amk_op_kv_append")
                .with_shared(SHARED_BYTES),
        ),
    }
}

/// The columns `[n_off, n_off + N_tile)` a task writes of each row, `None` for whole rows;
/// `Err` when the params are there but wrong (the finding recorded in `c`).
fn column_slice(c: &mut Checker<'_, '_>, ctx: &TaskContext<'_>) -> Result<Option<(u64, u64)>, ()> {
    let has = |k: &str| ctx.task.params.contains_key(k);
    match (has("n_off"), has("N_tile")) {
        (false, false) => return Ok(None),
        (true, true) => {}
        (off, _) => {
            let missing = if off { "N_tile" } else { "n_off" };
            c.push(
                ErrorKind::MissingParam,
                format!(
                    "KV_APPEND's column slice lacks '{missing}': give n_off and N_tile together"
                ),
            );
            return Err(());
        }
    }
    let off = c.non_negative("n_off").ok_or(())?;
    let tile = c.positive("N_tile").ok_or(())?;
    Ok(Some((off as u64, (off as u64).saturating_add(tile as u64))))
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(new), Some(cache), Some(out)) = (c.input(0), c.input(1), c.output(0)) else {
        return Vec::new();
    };
    if out.id != cache.id {
        c.mismatch(format!(
            "KV_APPEND writes the cache in place: its output must be the cache input {}, not {}",
            desc(cache),
            desc(out)
        ));
    }
    let has_param = ctx.task.params.contains_key("pos");
    let pos = match (c.input(2), has_param) {
        (Some(b), true) => {
            c.mismatch(format!(
                "param pos and the position input {} both give the row: give one",
                desc(b)
            ));
            return c.finish();
        }
        (Some(b), false) => {
            c.integer(b, "position buffer");
            if b.numel() == 0 {
                c.mismatch(format!("the position buffer {} is empty", desc(b)));
            }
            None
        }
        (None, false) => {
            c.push(
                ErrorKind::MissingParam,
                "KV_APPEND lacks the param 'pos' (or a position input) that says where the rows go",
            );
            return c.finish();
        }
        (None, true) => match c.non_negative("pos") {
            Some(p) => Some(p as u64),
            None => return c.finish(),
        },
    };
    // With a position input the row is data: only rows that fit at position 0 can fit at all.
    let at = pos.unwrap_or(0);
    let Ok(columns) = column_slice(&mut c, ctx) else {
        return c.finish();
    };
    if columns.is_some() && cache.rank() == 4 {
        c.mismatch(format!(
            "a column slice (n_off, N_tile) of the batched cache {}: slices take [max_seq, n_kv, head_dim] caches",
            desc(cache)
        ));
        return c.finish();
    }
    match cache.rank() {
        2 | 3 => {
            let max_seq = cache.shape[0];
            let row = cache.numel() / max_seq;
            if let Some((off, end)) = columns
                && end > row
            {
                c.oob(format!(
                    "columns [{off}, {end}) exceed the rows of {row} elements of the cache {}",
                    desc(cache)
                ));
            }
            if new.numel() % row != 0 {
                c.mismatch(format!(
                    "new rows {} are not a whole number of cache rows of {row} elements ({})",
                    desc(new),
                    desc(cache)
                ));
                return c.finish();
            }
            let rows = new.numel() / row;
            if at.saturating_add(rows) > max_seq {
                c.oob(format!(
                    "rows [{at}, {}) exceed the {max_seq} rows of the cache {}",
                    at.saturating_add(rows),
                    desc(cache)
                ));
            }
        }
        4 => {
            let (b, max_seq) = (cache.shape[0], cache.shape[1]);
            let per = cache.shape[2].saturating_mul(cache.shape[3]);
            c.numel_is(new, b.saturating_mul(per), "new rows");
            if at >= max_seq {
                c.oob(format!(
                    "pos = {at} is beyond the {max_seq} positions of the cache {}",
                    desc(cache)
                ));
            }
        }
        _ => c.mismatch(format!(
            "the cache {} must be [max_seq, n_kv, head_dim] or [B, max_seq, n_kv, head_dim]",
            desc(cache)
        )),
    }
    c.finish()
}
