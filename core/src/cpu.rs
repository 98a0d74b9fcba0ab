//! The CPU reference call contract: what an op's reference implementation receives and may
//! fail with. `OpError` is shared by every op crate (they have no error enum of their own).

use crate::ir::{Opcode, Task};
use crate::json::Value;
use crate::spec::SpecTable;
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::sync::Arc;

pub use crate::op_error::OpError;

/// Looking up other ops' specs and CPU references: what an op that runs other ops (a FUSED
/// recipe) needs of the registry ([`crate::Registry`] implements it). A trait, so that the call
/// contract sits below the registry that holds the references.
pub trait OpTable: SpecTable {
    /// The CPU reference of `op`, if it has one.
    fn reference(&self, op: Opcode) -> Option<&CpuReference>;
}

/// One input operand of a call.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// A tensor the op only reads.
    Tensor(&'a Tensor),
    /// The same buffer as output `j`, for ops that declared the in-place pair.
    InPlace(usize),
}

/// Everything one reference call sees: the task (params), its inputs and its outputs. The
/// caller owns the tensors; outputs are handed over mutably for the duration of the call.
pub struct CpuCall<'a, 'b> {
    /// The task (only `params` and the operand counts matter to the op).
    pub task: &'a Task,
    /// The registry, for ops that run other ops (FUSED recipes); `None` in isolated calls.
    pub registry: Option<&'a dyn OpTable>,
    /// Inputs, in task order.
    pub inputs: &'b [Input<'a>],
    /// Outputs, in task order.
    pub outputs: &'b mut [Tensor],
}

impl<'a> CpuCall<'a, '_> {
    /// Number of inputs.
    pub fn n_inputs(&self) -> usize {
        self.inputs.len()
    }
    /// Input `i` for reading.
    pub fn input(&self, i: usize) -> Result<&'a Tensor, OpError> {
        match self.inputs.get(i) {
            Some(Input::Tensor(t)) => Ok(t),
            Some(Input::InPlace(_)) => Err(OpError::InPlaceInput(i)),
            None => Err(OpError::Arity {
                what: "inputs",
                expected: format!("at least {}", i + 1),
                got: self.inputs.len(),
            }),
        }
    }
    /// Output `j` for writing.
    pub fn output(&mut self, j: usize) -> Result<&mut Tensor, OpError> {
        let n = self.outputs.len();
        self.outputs.get_mut(j).ok_or(OpError::Arity {
            what: "outputs",
            expected: format!("at least {}", j + 1),
            got: n,
        })
    }
    /// Requires `lo..=hi` inputs and exactly `outs` outputs.
    pub fn expect_arity(&self, lo: usize, hi: usize, outs: usize) -> Result<(), OpError> {
        let n = self.inputs.len();
        if n < lo || n > hi {
            return Err(OpError::Arity {
                what: "inputs",
                expected: if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}..{hi}")
                },
                got: n,
            });
        }
        if self.outputs.len() != outs {
            return Err(OpError::Arity {
                what: "outputs",
                expected: outs.to_string(),
                got: self.outputs.len(),
            });
        }
        Ok(())
    }
    /// An integer param, if present (an error if present but not an integer).
    pub fn int_opt(&self, key: &str) -> Result<Option<i64>, OpError> {
        match self.task.params.get(key) {
            None => Ok(None),
            Some(Value::Int(i)) => Ok(Some(*i)),
            Some(other) => Err(OpError::BadParam {
                key: key.into(),
                why: format!("expected an integer, found {}", other.type_name()),
            }),
        }
    }
    /// A required integer param.
    pub fn int(&self, key: &str) -> Result<i64, OpError> {
        self.int_opt(key)?
            .ok_or_else(|| OpError::MissingParam(key.into()))
    }
    /// A real param, if present (integers accepted).
    pub fn real_opt(&self, key: &str) -> Result<Option<f64>, OpError> {
        match self.task.params.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| OpError::BadParam {
                key: key.into(),
                why: format!("expected a number, found {}", v.type_name()),
            }),
        }
    }
    /// A required real param.
    pub fn real(&self, key: &str) -> Result<f64, OpError> {
        self.real_opt(key)?
            .ok_or_else(|| OpError::MissingParam(key.into()))
    }
}

/// An op's CPU reference implementation.
pub type ReferenceFn = fn(&mut CpuCall<'_, '_>) -> Result<(), OpError>;

/// How a backend calls an op's reference.
#[derive(Debug, Clone, Copy)]
pub struct Reference {
    /// The implementation.
    pub run: ReferenceFn,
    /// `(input, output)` pairs the op reads and writes in place (KV_APPEND's cache): the
    /// caller passes such an input as [`Input::InPlace`]. Any other aliasing between an input
    /// and an output is resolved by the caller with a snapshot copy of the input.
    pub in_place: &'static [(usize, usize)],
}

/// A reference implementation that carries state (a plugin's C function and the library it
/// lives in): what [`CpuReference::dynamic`] wraps.
pub type DynReferenceFn = dyn Fn(&mut CpuCall<'_, '_>) -> Result<(), OpError> + Send + Sync;

/// The callable part of a [`CpuReference`].
#[derive(Clone)]
pub enum RunFn {
    /// A plain function linked into this binary (every built-in op).
    Static(ReferenceFn),
    /// A closure with state (ops loaded from plugins).
    Dynamic(Arc<DynReferenceFn>),
}

impl std::fmt::Debug for RunFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunFn::Static(_) => f.write_str("Static(fn)"),
            RunFn::Dynamic(_) => f.write_str("Dynamic(closure)"),
        }
    }
}

/// How the registry holds an op's CPU reference: a static [`Reference`] from an op crate, or a
/// dynamic one registered at run time (plugins).
#[derive(Debug, Clone)]
pub struct CpuReference {
    /// The implementation.
    pub run: RunFn,
    /// `(input, output)` pairs read and written in place (see [`Reference::in_place`]).
    pub in_place: Cow<'static, [(usize, usize)]>,
}

impl CpuReference {
    /// A dynamic reference with no in-place pairs.
    pub fn dynamic(run: Arc<DynReferenceFn>) -> Self {
        CpuReference {
            run: RunFn::Dynamic(run),
            in_place: Cow::Borrowed(&[]),
        }
    }

    /// Calls the implementation.
    pub fn call(&self, call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
        match &self.run {
            RunFn::Static(f) => f(call),
            RunFn::Dynamic(f) => f(call),
        }
    }
}

impl From<Reference> for CpuReference {
    fn from(r: Reference) -> Self {
        CpuReference {
            run: RunFn::Static(r.run),
            in_place: Cow::Borrowed(r.in_place),
        }
    }
}
