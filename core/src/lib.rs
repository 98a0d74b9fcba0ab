//! `amk-core`: the schedule IR, its JSON format, the opcode registry and the static validator.
//!
//! The flow every other crate builds on is **load → validate → run**: [`codec`] reads a
//! [`Program`], [`validate()`] proves it safe against a [`Registry`] of ops, and only a
//! [`ValidatedProgram`] can be handed to a backend.

pub mod abi;
pub mod backend;
pub mod codec;
pub mod cpu;
pub mod decode;
pub mod error;
pub mod graph;
pub mod import;
pub mod ir;
pub mod json;
pub mod kinds;
pub mod op_error;
pub mod opcheck;
pub mod registry;
pub mod safetensors;
pub mod sim;
pub mod spec;
pub mod steps;
pub mod synth;
pub mod tensor;
pub mod testkit;
pub mod validate;

pub use backend::{
    Backend, BackendError, BoundWeights, LoopRun, OnRow, Outputs, RowWatch, Session, TaskTrace,
    WeightStore,
};
pub use cpu::{
    CpuCall, CpuReference, DynReferenceFn, Input, OpError, OpTable, Reference, ReferenceFn, RunFn,
};
pub use error::IrError;
pub use import::Importer;
pub use ir::*;
pub use registry::{
    CudaSource, DeviceLibrary, ExpandFn, OpExpansion, OpRegistration, Origin, Registry, RowLoop,
    TaskDefines, TaskDefinesFn,
};
pub use spec::{
    CheckFn, Finding, OpSpec, PARAM_FIELDS, ParamDecl, ParamType, SpecTable, TaskContext,
    WriteRegion,
};
pub use tensor::{NonFinite, Storage, Tensor, round_to};
pub use validate::{
    ErrorKind, ParamPatch, ValidatedProgram, ValidationError, ValidationResult, ValidationWarning,
    WarningKind, validate, validate_owned,
};

/// Re-exported so op crates register without naming `inventory` themselves.
pub use inventory;
