//! The decode-loop buffers of a program, found by name (`amk_core::decode`) and checked, so
//! that a program lowered for something else is refused with a reason before it is loaded.

use crate::EngineError;
use amk_core::{BufferKind, DType, Program, decode};

/// The sizes an engine needs from a decode-loop program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interface {
    /// KV-cache length: the sequence's positions run `0..max_seq`.
    pub max_seq: u64,
    /// The logits' width.
    pub vocab: usize,
    /// Stop-token slots.
    pub stop_slots: usize,
}

/// The one buffer named `name`, which must be of `kind` and `dtype`; returns its shape.
fn buffer<'p>(
    p: &'p Program,
    name: &str,
    kind: BufferKind,
    dtype: Option<DType>,
) -> Result<&'p [u64], EngineError> {
    let mut found = p.buffers.iter().filter(|b| b.name == name);
    let b = match (found.next(), found.next()) {
        (Some(b), None) => b,
        (None, _) => return Err(EngineError::Interface(format!("no buffer named '{name}'"))),
        (Some(_), Some(_)) => {
            return Err(EngineError::Interface(format!(
                "several buffers are named '{name}'"
            )));
        }
    };
    if b.kind != kind || dtype.is_some_and(|d| d != b.dtype) {
        return Err(EngineError::Interface(format!(
            "buffer '{name}' is {} {}, expected {kind}{}",
            b.kind,
            b.dtype,
            dtype.map_or(String::new(), |d| format!(" {d}"))
        )));
    }
    Ok(&b.shape)
}

impl Interface {
    /// Finds and checks every decode-loop buffer of `p` (and its step loop).
    pub fn of(p: &Program) -> Result<Interface, EngineError> {
        if p.step_loop.is_none() {
            return Err(EngineError::Interface(
                "the program has no step loop (lower it with a decode loop)".into(),
            ));
        }
        let i32s = Some(DType::I32);
        let state = BufferKind::STATE;
        let input = BufferKind::IO_INPUT;
        let one = |name: &str, shape: &[u64]| -> Result<(), EngineError> {
            match shape.iter().product::<u64>() {
                1 => Ok(()),
                n => Err(EngineError::Interface(format!(
                    "buffer '{name}' holds {n} elements, expected 1"
                ))),
            }
        };
        one(decode::TOKEN, buffer(p, decode::TOKEN, state, i32s)?)?;
        one(decode::POS, buffer(p, decode::POS, state, i32s)?)?;
        one(decode::HALT, buffer(p, decode::HALT, state, i32s)?)?;
        let max_seq = buffer(p, decode::PROMPT, input, i32s)?
            .iter()
            .product::<u64>();
        let emitted = buffer(p, decode::EMITTED, state, i32s)?;
        if emitted != [max_seq, 2] {
            return Err(EngineError::Interface(format!(
                "buffer '{}' is {emitted:?}, expected [{max_seq}, 2]",
                decode::EMITTED
            )));
        }
        let stop_slots = buffer(p, decode::STOP, input, i32s)?
            .iter()
            .product::<u64>();
        let limits = buffer(p, decode::LIMITS, input, i32s)?
            .iter()
            .product::<u64>();
        let sampling = buffer(p, decode::SAMPLING, input, Some(DType::F32))?
            .iter()
            .product::<u64>();
        if limits != decode::LIMITS_LEN || sampling != decode::SAMPLING_LEN {
            return Err(EngineError::Interface(format!(
                "'{}' and '{}' hold {limits} and {sampling} elements, expected {} and {}",
                decode::LIMITS,
                decode::SAMPLING,
                decode::LIMITS_LEN,
                decode::SAMPLING_LEN
            )));
        }
        let logits = buffer(p, decode::LOGITS, BufferKind::IO_OUTPUT, None)?;
        let vocab = logits.last().copied().unwrap_or(0);
        if vocab == 0 || logits.iter().product::<u64>() != vocab {
            return Err(EngineError::Interface(format!(
                "buffer '{}' is {logits:?}, expected one row",
                decode::LOGITS
            )));
        }
        Ok(Interface {
            max_seq,
            vocab: vocab as usize,
            stop_slots: stop_slots as usize,
        })
    }
}

/// Checks that every KV cache of `p` (a program loaded beside `main`, named `what` in the
/// error) is one of `main`'s, by name, dtype and shape: the two then share those caches.
pub(crate) fn caches_shared(p: &Program, main: &Program, what: &str) -> Result<(), EngineError> {
    let caches = p.buffers.iter().filter(|b| b.kind == BufferKind::KV_CACHE);
    for b in caches {
        if !main.buffers.iter().any(|d| d.same_slot(b)) {
            return Err(EngineError::Interface(format!(
                "the {what}'s KV cache '{}' is not one of the decode program's",
                b.name
            )));
        }
    }
    Ok(())
}
