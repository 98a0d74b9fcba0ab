//! Opcode `NOP` (code 0): Does nothing: a pure synchronisation point.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`nop.cu`).

use amk_core::{OpRegistration, OpSpec, Opcode, Reference};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::NOP,
    name: Cow::Borrowed("NOP"),
    min_inputs: 0,
    max_inputs: Some(0),
    n_outputs: Some(0),
    params: Cow::Borrowed(&[]),
    write_region: amk_core::WriteRegion::Whole,
    check: None,
    summary: Cow::Borrowed("Does nothing: a pure synchronisation point."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("nop.cu"), "amk_op_nop")),
    }
}
