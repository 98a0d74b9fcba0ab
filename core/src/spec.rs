//! What an opcode is, as the validator and the CPU reference see it: its spec (arity, params,
//! write region, shape rule), the device param fields, and the lookup of other ops' specs a
//! rule or a reference needs ([`SpecTable`]). Below the registry and the CPU call contract,
//! which both build on it.

use crate::ir::{Buffer, Opcode, Task};
use crate::json::value::key_eq;
use crate::kinds::ErrorKind;
use std::borrow::Cow;

/// Looking up other ops' specs: what a FUSED recipe's rule and reference need of the registry
/// ([`crate::Registry`] implements it).
pub trait SpecTable {
    /// The spec of `op`, if registered.
    fn get(&self, op: Opcode) -> Option<&OpSpec>;
    /// The opcode registered under `name`.
    fn resolve_name(&self, name: &str) -> Option<Opcode>;
    /// The canonical name of `op`, if registered.
    fn name_of(&self, op: Opcode) -> Option<Cow<'static, str>>;
}

/// How a param value must be typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    /// A JSON integer within int32 (marshalled into `amk_params_t`).
    Int,
    /// A JSON number (marshalled as float32).
    Real,
    /// A JSON object (e.g. a FUSED recipe; host-side only).
    Object,
}

impl ParamType {
    /// Short name for listings.
    pub fn name(self) -> &'static str {
        match self {
            ParamType::Int => "int",
            ParamType::Real => "real",
            ParamType::Object => "object",
        }
    }
}

/// The device param block's fields and their types (`amk_params_t`). A key outside this table
/// (and outside the op's own declarations) cannot reach the device.
pub const PARAM_FIELDS: &[(&str, ParamType)] = &[
    ("K", ParamType::Int),
    ("N", ParamType::Int),
    ("M", ParamType::Int),
    ("N_tile", ParamType::Int),
    ("M_tile", ParamType::Int),
    ("n_off", ParamType::Int),
    ("m_off", ParamType::Int),
    ("hidden", ParamType::Int),
    ("vocab", ParamType::Int),
    ("head_dim", ParamType::Int),
    ("n_heads", ParamType::Int),
    ("n_kv_heads", ParamType::Int),
    ("kv_start", ParamType::Int),
    ("kv_len", ParamType::Int),
    ("pos", ParamType::Int),
    ("qdtype", ParamType::Int),
    ("flags", ParamType::Int),
    ("dim", ParamType::Int),
    ("group", ParamType::Int),
    ("eps", ParamType::Real),
    ("scale", ParamType::Real),
    ("theta", ParamType::Real),
];

/// Type of a device param field.
pub fn param_field_type(key: &str) -> Option<ParamType> {
    param_field_index(key).map(|i| PARAM_FIELDS[i].1)
}

/// Index of a device param field in [`PARAM_FIELDS`]. A `match` compiles to a length and
/// byte decision tree, much cheaper than scanning the table on the validator's hot path.
pub fn param_field_index(key: &str) -> Option<usize> {
    Some(match key {
        "K" => 0,
        "N" => 1,
        "M" => 2,
        "N_tile" => 3,
        "M_tile" => 4,
        "n_off" => 5,
        "m_off" => 6,
        "hidden" => 7,
        "vocab" => 8,
        "head_dim" => 9,
        "n_heads" => 10,
        "n_kv_heads" => 11,
        "kv_start" => 12,
        "kv_len" => 13,
        "pos" => 14,
        "qdtype" => 15,
        "flags" => 16,
        "dim" => 17,
        "group" => 18,
        "eps" => 19,
        "scale" => 20,
        "theta" => 21,
        _ => return None,
    })
}

/// A param an op declares.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamDecl {
    /// Key.
    pub name: Cow<'static, str>,
    /// Type.
    pub ty: ParamType,
    /// Whether a task must carry it.
    pub required: bool,
}

impl ParamDecl {
    /// A required param (const-friendly).
    pub const fn required(name: &'static str, ty: ParamType) -> Self {
        ParamDecl {
            name: Cow::Borrowed(name),
            ty,
            required: true,
        }
    }
    /// An optional param (const-friendly).
    pub const fn optional(name: &'static str, ty: ParamType) -> Self {
        ParamDecl {
            name: Cow::Borrowed(name),
            ty,
            required: false,
        }
    }
}

/// What an op's static check sees: the task and the program's buffers (every id the task
/// names exists when the check runs).
pub struct TaskContext<'a> {
    /// The task.
    pub task: &'a Task,
    /// All buffers of the program, indexed by id.
    pub buffers: &'a [Buffer],
    /// The registry (FUSED recipes refer to other ops).
    pub registry: &'a dyn SpecTable,
}

impl<'a> TaskContext<'a> {
    /// Input `i`.
    pub fn input(&self, i: usize) -> Option<&'a Buffer> {
        self.task
            .inputs
            .get(i)
            .and_then(|&b| self.buffers.get(b as usize))
    }
    /// Output `i`.
    pub fn output(&self, i: usize) -> Option<&'a Buffer> {
        self.task
            .outputs
            .get(i)
            .and_then(|&b| self.buffers.get(b as usize))
    }
    /// Number of inputs.
    pub fn n_inputs(&self) -> usize {
        self.task.inputs.len()
    }
    /// Number of outputs.
    pub fn n_outputs(&self) -> usize {
        self.task.outputs.len()
    }
}

/// One problem an op's check found.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// `TileOutOfBounds`, `ShapeMismatch`, `FusedRecipe` or `ParamType`.
    pub kind: ErrorKind,
    /// Our own wording, without the task prefix (the validator adds it).
    pub message: String,
}

impl Finding {
    /// A finding of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Finding {
            kind,
            message: message.into(),
        }
    }
}

/// An op's static shape/parameter rule, run by the validator once arity and param types hold.
pub type CheckFn = fn(&TaskContext<'_>) -> Vec<Finding>;

/// Everything the validator and tools know about one opcode.
#[derive(Debug, Clone)]
pub struct OpSpec {
    /// Code.
    pub code: Opcode,
    /// Canonical name (`GEMV_TILE`; plugins use a namespace, `acme.GELU_TANH`).
    pub name: Cow<'static, str>,
    /// Fewest inputs.
    pub min_inputs: u8,
    /// Most inputs (`None` = no upper bound besides the ABI cap).
    pub max_inputs: Option<u8>,
    /// Exact output count (`None` = variable).
    pub n_outputs: Option<u8>,
    /// Declared params (required and optional).
    pub params: Cow<'static, [ParamDecl]>,
    /// Which part of its output a task writes; disjoint tiles may share a counter.
    pub write_region: WriteRegion,
    /// Shape and parameter rule.
    pub check: Option<CheckFn>,
    /// One line for listings.
    pub summary: Cow<'static, str>,
}

impl OpSpec {
    /// Required param keys, in declaration order.
    pub fn required_params(&self) -> impl Iterator<Item = &ParamDecl> {
        self.params.iter().filter(|p| p.required)
    }
    /// The declared type of `key`: the op's own declaration, else the device param table.
    pub fn param_type(&self, key: &str) -> Option<ParamType> {
        // Device fields first (a `match`, cheap on the validator's hot path); registration
        // guarantees an op's declaration of a device field has the field's type.
        param_field_type(key).or_else(|| {
            self.params
                .iter()
                .find(|p| key_eq(&p.name, key))
                .map(|p| p.ty)
        })
    }
    /// `"2..4"`-style rendering of the input arity.
    pub fn arity_text(&self) -> String {
        match self.max_inputs {
            Some(m) if m == self.min_inputs => format!("{m}"),
            Some(m) => format!("{}..{}", self.min_inputs, m),
            None => format!("{}..", self.min_inputs),
        }
    }
}

/// Which part of its output buffer one task of an op writes (for the write-after-write rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteRegion {
    /// The whole buffer.
    Whole,
    /// Columns `[n_off, n_off + N_tile)` of every row (GEMV tiles).
    Columns,
    /// Those columns, and rows `[m_off, m_off + M_tile)` when both are given (GEMM tiles).
    ColumnsAndRows,
    /// Columns `[n_off, n_off + N_tile)` of every row of an output that is also an input of
    /// the task, which it overwrites without reading (a slice of a KV_APPEND): with both
    /// params the validator takes that input as no read, so slices with disjoint columns on
    /// one counter are one write; without them, the whole buffer, read in place.
    OverwrittenColumns,
}
