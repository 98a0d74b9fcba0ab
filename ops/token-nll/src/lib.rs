//! Opcode `TOKEN_NLL` (code 29): each row's negative log-likelihood of its target token,
//! `-log softmax(logits[r])[targets[r]]`, as F32.
//!
//! Why an op: scoring a text (perplexity) needs one number a row, while the logits it comes
//! from are `[rows, vocab]` — 50 MB a 512-row chunk of a 49,152-token vocabulary in bf16. On the
//! host that was a read-back and a log-softmax per row (≈ 1 s for 4,096 tokens,
//! docs/perf-notes.md round 37); here the rows are reduced where the logits are, and 2 KB
//! come back.
//!
//! Inputs `[logits, targets]`: logits any float dtype, rows over the last dim (all leading
//! dims); targets an integer buffer of one id a row. Output: F32, one value a row. With the row
//! tile params (`m_off`, `M_tile`, `n_off` = 0, `N_tile` = 1, as RMSNORM's
//! [`op_rmsnorm::RowTile`] with rows of one output) a task writes rows `[m_off, m_off +
//! M_tile)` only, so a chunk's rows spread over many SMs. A target outside `[0, vocab)` is data,
//! an index error when the task runs.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference ([`reference`](mod@reference)) and its CUDA device
//! function (`token-nll.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{DType, Finding, OpRegistration, OpSpec, Opcode, Reference, TaskContext};
use op_rmsnorm::{ROW_TILE_KEYS, RowTile};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::TOKEN_NLL,
    name: Cow::Borrowed("TOKEN_NLL"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&op_rmsnorm::ROW_TILE_PARAMS),
    write_region: amk_core::WriteRegion::ColumnsAndRows,
    check: Some(check),
    summary: Cow::Borrowed(
        "Each row's negative log-likelihood of its target token, -log softmax(logits)[target], as F32.",
    ),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("token-nll.cu"), "amk_op_token_nll")),
    }
}

/// The rows a task writes (`None`: every row), from its params: a [`RowTile`] over rows of one
/// output element. `Err` says why the params are unusable.
pub fn row_tile(keys: [Option<i64>; 4]) -> Result<Option<RowTile>, String> {
    RowTile::from_params(keys, 1)
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    let (Some(x), Some(t), Some(out)) = (c.input(0), c.input(1), c.output(0)) else {
        return c.finish();
    };
    c.float(x, "logits");
    c.integer(t, "targets");
    if out.dtype != DType::F32 {
        c.mismatch(format!("the output {} must be F32", desc(out)));
    }
    let vocab = x.last_dim();
    if vocab == 0 {
        c.mismatch(format!("the logits {} have no vocabulary", desc(x)));
        return c.finish();
    }
    let rows = x.numel() / vocab;
    c.numel_is(t, rows, "targets");
    c.numel_is(out, rows, "output");
    match row_tile(ROW_TILE_KEYS.map(|k| c.int(k))) {
        Err(why) => c.oob(why),
        Ok(Some(tile)) if tile.end() as u64 > rows => c.oob(format!(
            "rows [{}, {}) exceed the logits' {rows} rows",
            tile.m_off,
            tile.end()
        )),
        Ok(_) => {}
    }
    c.finish()
}
