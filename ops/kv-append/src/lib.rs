//! Opcode `KV_APPEND` (code 16): Writes new K or V rows into the cache at pos, in place.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`kv-append.cu`).

use amk_core::opcheck::{Checker, desc};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::KV_APPEND,
    name: Cow::Borrowed("KV_APPEND"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[ParamDecl::required("pos", ParamType::Int)]),
    write_region: amk_core::WriteRegion::Whole,
    check: Some(check),
    summary: Cow::Borrowed("Writes new K or V rows into the cache at pos, in place."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[(1, 0)] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("kv-append.cu"), "amk_op_kv_append")),
    }
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
    let Some(pos) = c.non_negative("pos") else {
        return c.finish();
    };
    match cache.rank() {
        2 | 3 => {
            let max_seq = cache.shape[0];
            let row = cache.numel() / max_seq;
            if new.numel() % row != 0 {
                c.mismatch(format!(
                    "new rows {} are not a whole number of cache rows of {row} elements ({})",
                    desc(new),
                    desc(cache)
                ));
                return c.finish();
            }
            let rows = new.numel() / row;
            if (pos as u64).saturating_add(rows) > max_seq {
                c.oob(format!(
                    "rows [{pos}, {}) exceed the {max_seq} rows of the cache {}",
                    (pos as u64).saturating_add(rows),
                    desc(cache)
                ));
            }
        }
        4 => {
            let (b, max_seq) = (cache.shape[0], cache.shape[1]);
            let per = cache.shape[2].saturating_mul(cache.shape[3]);
            c.numel_is(new, b.saturating_mul(per), "new rows");
            if pos as u64 >= max_seq {
                c.oob(format!(
                    "pos = {pos} is beyond the {max_seq} positions of the cache {}",
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
