//! The opcode registry: what each opcode is (arity, params, shape rules), collected from the
//! op crates with `inventory` and passed explicitly to whoever needs it.

use crate::cpu::{CpuReference, OpTable, Reference};
use crate::error::IrError;
use crate::ir::{Opcode, Task};
use crate::spec::{OpSpec, SpecTable, param_field_type};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;

/// One op crate's entry, collected by `inventory`.
pub struct OpRegistration {
    /// The spec.
    pub spec: OpSpec,
    /// The CPU reference implementation (the numeric oracle every backend is judged against).
    pub reference: Option<Reference>,
    /// The CUDA device function (compiled into the megakernel by the CUDA backend).
    pub cuda: Option<CudaSource>,
}

/// An op's CUDA device function: source text compiled into the megakernel, and its entry.
///
/// The source defines `__device__ void <entry>(const amk_task_ctx& ctx)`, which the whole
/// block calls once per task. It includes no headers, defines no `__global__` and never traps;
/// the backend wraps it in a namespace of its own, so helper names never collide across ops.
/// `docs/adding-an-op.md` states the full contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaSource {
    /// The device source text.
    pub source: Cow<'static, str>,
    /// The device function's name.
    pub entry: Cow<'static, str>,
    /// Dynamic shared memory the function needs per block, in bytes.
    pub shared_bytes: u32,
    /// The function waits for its task's counters itself (`amk_task_wait`, after the checks
    /// that read only its descriptors and params), instead of the scheduler waiting before it
    /// runs: the op's cold code then runs while the producers still work, off the critical
    /// path. docs/adding-an-op.md says how.
    pub own_wait: bool,
    /// The function streams weight rows against one row of activations through the fused
    /// tiles' vector loop (`amk_row_tile_run` / `amk_fused_run` in `amk_tile.cuh`): which of
    /// its inputs is that row and which are the weights. The backend compiles the loop only
    /// for the (weight, row) dtype pairs a program's tasks name (docs/perf-notes.md round 17);
    /// an op that runs the loop without saying so still computes right, on the generic path.
    pub row_loop: Option<RowLoop>,
    /// An F32 buffer that only such ops touch does not keep the kernel's inline F32 branches
    /// (`AMK_IS_F32`, folded away when no other buffer is F32): the op reads and writes such
    /// scratch (the split-KV partials of a bf16 program) through accesses that test the dtype
    /// themselves (`amk_ldf32`, `att_st8`), and every folded branch has a fallback that is
    /// right for any dtype, so a wrong declaration costs speed, never results.
    pub f32_direct: bool,
    /// Device defines a task of the op asks of its kernel (NAME, VALUE), beyond the device
    /// defaults: code the op compiles only into the kernels of programs that use it (a tile size
    /// most programs never take would otherwise cost every kernel its registers and code). The
    /// backend defines the union over a program's tasks. Speed only: without them every task
    /// still computes right, on the op's other code.
    pub task_defines: Option<TaskDefines>,
}

/// What a task asks of its kernel's device code ([`CudaSource::task_defines`]).
pub type TaskDefinesFn = fn(&Task) -> &'static [(&'static str, &'static str)];

/// A [`TaskDefinesFn`], compared by address (two sources are the same when they name the same
/// function).
#[derive(Clone, Copy)]
pub struct TaskDefines(pub TaskDefinesFn);

impl PartialEq for TaskDefines {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::fn_addr_eq(self.0, other.0)
    }
}

impl Eq for TaskDefines {}

impl std::fmt::Debug for TaskDefines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskDefines(fn)")
    }
}

/// The operands of an op's weight-streaming loop ([`CudaSource::row_loop`]), as input indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLoop {
    /// The input holding the row the weights multiply, or, for an op that makes its row in
    /// the tile (COMBINE_GEMV), an input of the row's dtype; the row's length is the task's
    /// `K` param.
    pub row: usize,
    /// The inputs holding weight rows.
    pub weights: &'static [usize],
    /// Weight rows one unit of the loop streams together (the device loop's `NR`): the lanes'
    /// vectors in flight are shared among them, which sets how many passes a row takes.
    pub unit_rows: usize,
}

impl CudaSource {
    /// A built-in op's source (const-friendly, for `inventory::submit!`).
    pub const fn builtin(source: &'static str, entry: &'static str) -> Self {
        CudaSource {
            source: Cow::Borrowed(source),
            entry: Cow::Borrowed(entry),
            shared_bytes: 0,
            own_wait: false,
            row_loop: None,
            f32_direct: false,
            task_defines: None,
        }
    }

    /// The same source, asking its kernel for `defines` per task ([`CudaSource::task_defines`]).
    pub const fn with_task_defines(mut self, defines: TaskDefinesFn) -> Self {
        self.task_defines = Some(TaskDefines(defines));
        self
    }

    /// The same source, touching F32 operands only through self-testing accesses
    /// ([`CudaSource::f32_direct`]).
    pub const fn with_f32_direct(mut self) -> Self {
        self.f32_direct = true;
        self
    }

    /// The same source with a shared-memory need.
    pub const fn with_shared(mut self, bytes: u32) -> Self {
        self.shared_bytes = bytes;
        self
    }

    /// The same source, its device function calling `amk_task_wait` itself.
    pub const fn with_own_wait(mut self) -> Self {
        self.own_wait = true;
        self
    }

    /// The same source, its function running the weight-streaming loop with input `row` as
    /// the row, `weights` as the weight rows and `unit_rows` rows a unit
    /// ([`CudaSource::row_loop`]).
    pub const fn with_row_loop(
        mut self,
        row: usize,
        weights: &'static [usize],
        unit_rows: usize,
    ) -> Self {
        self.row_loop = Some(RowLoop {
            row,
            weights,
            unit_rows,
        });
        self
    }
}

inventory::collect!(OpRegistration);

/// Device code several ops share (the weight-streaming tile, the decode attention, the logits
/// passes), collected by `inventory` from the crate under `ops/` that holds it. A backend puts
/// every library into each kernel, after its own runtime and before the ops' sources, so an
/// op's source calls a library's routines as it calls the runtime's. Like an op's source, a
/// library includes no headers and defines no `__global__`.
#[derive(Debug)]
pub struct DeviceLibrary {
    /// The library's name, for messages.
    pub name: &'static str,
    /// Its source's path in the repository, for the compiler's line info.
    pub file: &'static str,
    /// Where its text goes among the libraries (lower first): they name nothing of each other,
    /// so the order only keeps the generated source, and so each kernel's cache key, stable.
    pub order: u32,
    /// The CUDA source text.
    pub cuda: &'static str,
}

inventory::collect!(DeviceLibrary);

/// Expands a task of an op into its steps ([`crate::steps`]), checking the task's description
/// of them against the registry; `Err` says every problem found.
pub type ExpandFn = fn(&Task, &Registry) -> Result<Vec<crate::steps::Step>, String>;

/// An op's expansion into steps, collected by `inventory` from the op's crate (FUSED's).
pub struct OpExpansion {
    /// The op whose tasks expand.
    pub op: Opcode,
    /// How.
    pub expand: ExpandFn,
}

inventory::collect!(OpExpansion);

/// Where an op came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Linked into this binary.
    Builtin,
    /// Loaded from a plugin library.
    Plugin(PathBuf),
}

/// The registered ops, sorted by code, names and codes unique.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    ops: Vec<(OpSpec, Origin)>,
    references: Vec<Option<CpuReference>>,
    cuda: Vec<Option<CudaSource>>,
    by_name: HashMap<String, usize>,
    libraries: Vec<&'static DeviceLibrary>,
}

impl Registry {
    /// A registry with no ops (ABI opcode *names* still resolve when reading JSON).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every op and device library linked into this binary (via `inventory`), the ops sorted
    /// by code, the libraries by their order.
    pub fn builtin() -> Result<Self, IrError> {
        let mut regs: Vec<&OpRegistration> =
            inventory::iter::<OpRegistration>.into_iter().collect();
        regs.sort_by_key(|r| r.spec.code);
        let mut reg = Registry::empty();
        for r in regs {
            reg.register_full(
                r.spec.clone(),
                Origin::Builtin,
                r.reference.map(CpuReference::from),
                r.cuda.clone(),
            )?;
        }
        reg.libraries = inventory::iter::<DeviceLibrary>.into_iter().collect();
        reg.libraries.sort_by_key(|l| (l.order, l.name));
        Ok(reg)
    }

    /// The device libraries, in the order a kernel holds them ([`DeviceLibrary`]).
    pub fn device_libraries(&self) -> &[&'static DeviceLibrary] {
        &self.libraries
    }

    /// Adds one op; refuses duplicates, ABI codes under the wrong name, plugin codes
    /// below 1000 and malformed arities.
    pub fn register(&mut self, spec: OpSpec, origin: Origin) -> Result<(), IrError> {
        self.register_with(spec, origin, None)
    }

    /// [`Registry::register`] with the op's CPU reference implementation.
    pub fn register_with(
        &mut self,
        spec: OpSpec,
        origin: Origin,
        reference: Option<Reference>,
    ) -> Result<(), IrError> {
        self.register_cpu(spec, origin, reference.map(CpuReference::from))
    }

    /// [`Registry::register`] with a static or dynamic CPU reference (plugins register
    /// through this).
    pub fn register_cpu(
        &mut self,
        spec: OpSpec,
        origin: Origin,
        reference: Option<CpuReference>,
    ) -> Result<(), IrError> {
        self.register_full(spec, origin, reference, None)
    }

    /// [`Registry::register`] with every implementation an op can carry: a CPU reference
    /// and a CUDA device function.
    pub fn register_full(
        &mut self,
        spec: OpSpec,
        origin: Origin,
        reference: Option<CpuReference>,
        cuda: Option<CudaSource>,
    ) -> Result<(), IrError> {
        let bad = |why: String| IrError::Registry(format!("op '{}': {why}", spec.name));
        if spec.name.is_empty() {
            return Err(bad("empty name".into()));
        }
        if let Some(max) = spec.max_inputs
            && max < spec.min_inputs
        {
            return Err(bad(format!(
                "max inputs {max} < min inputs {}",
                spec.min_inputs
            )));
        }
        for decl in spec.params.iter() {
            if let Some(ty) = param_field_type(&decl.name)
                && ty != decl.ty
            {
                return Err(bad(format!(
                    "param '{}' is a device field of type {}, declared as {}",
                    decl.name,
                    ty.name(),
                    decl.ty.name()
                )));
            }
        }
        if let Some(abi) = spec.code.abi_name()
            && abi != spec.name
        {
            return Err(bad(format!(
                "code {} belongs to the ABI opcode {abi}",
                spec.code.0
            )));
        }
        if matches!(origin, Origin::Plugin(_)) && spec.code.0 < Opcode::FIRST_PLUGIN {
            return Err(bad(format!(
                "plugin codes must be ≥ {}, got {}",
                Opcode::FIRST_PLUGIN,
                spec.code.0
            )));
        }
        if let Some(existing) = self.get(spec.code) {
            return Err(bad(format!(
                "code {} is already registered by '{}'",
                spec.code.0, existing.name
            )));
        }
        if self.by_name.contains_key(spec.name.as_ref()) {
            return Err(bad("name is already registered".into()));
        }
        let pos = self.ops.partition_point(|(s, _)| s.code < spec.code);
        self.ops.insert(pos, (spec, origin));
        self.references.insert(pos, reference);
        self.cuda.insert(pos, cuda);
        self.by_name.clear();
        for (i, (s, _)) in self.ops.iter().enumerate() {
            self.by_name.insert(s.name.to_string(), i);
        }
        Ok(())
    }

    /// The spec of `op`.
    pub fn get(&self, op: Opcode) -> Option<&OpSpec> {
        // Sorted by code: a binary search beats hashing for a few dozen ops.
        self.ops
            .binary_search_by_key(&op, |(s, _)| s.code)
            .ok()
            .map(|i| &self.ops[i].0)
    }

    /// The CPU reference implementation of `op`, if it has one.
    pub fn reference(&self, op: Opcode) -> Option<&CpuReference> {
        self.ops
            .binary_search_by_key(&op, |(s, _)| s.code)
            .ok()
            .and_then(|i| self.references[i].as_ref())
    }

    /// How a task of `op` expands into steps ([`crate::steps`]), if `op` is registered here
    /// and its crate gave one.
    pub fn expansion(&self, op: Opcode) -> Option<ExpandFn> {
        self.get(op)?;
        inventory::iter::<OpExpansion>
            .into_iter()
            .find(|e| e.op == op)
            .map(|e| e.expand)
    }

    /// The CUDA device function of `op`, if it has one.
    pub fn cuda(&self, op: Opcode) -> Option<&CudaSource> {
        self.ops
            .binary_search_by_key(&op, |(s, _)| s.code)
            .ok()
            .and_then(|i| self.cuda[i].as_ref())
    }

    /// Where `op` came from.
    pub fn origin(&self, op: Opcode) -> Option<&Origin> {
        self.ops
            .binary_search_by_key(&op, |(s, _)| s.code)
            .ok()
            .map(|i| &self.ops[i].1)
    }

    /// Resolves a JSON opcode name: ABI names always, others through the registered ops.
    pub fn resolve_name(&self, name: &str) -> Option<Opcode> {
        Opcode::from_abi_name(name).or_else(|| self.by_name.get(name).map(|&i| self.ops[i].0.code))
    }

    /// The JSON name of `op`.
    pub fn name_of(&self, op: Opcode) -> Option<Cow<'static, str>> {
        op.abi_name()
            .map(Cow::Borrowed)
            .or_else(|| self.get(op).map(|s| s.name.clone()))
    }

    /// Every op, sorted by code.
    pub fn iter(&self) -> impl Iterator<Item = (&OpSpec, &Origin)> {
        self.ops.iter().map(|(s, o)| (s, o))
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no op is registered.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl SpecTable for Registry {
    fn get(&self, op: Opcode) -> Option<&OpSpec> {
        Registry::get(self, op)
    }
    fn resolve_name(&self, name: &str) -> Option<Opcode> {
        Registry::resolve_name(self, name)
    }
    fn name_of(&self, op: Opcode) -> Option<Cow<'static, str>> {
        Registry::name_of(self, op)
    }
}

impl OpTable for Registry {
    fn reference(&self, op: Opcode) -> Option<&CpuReference> {
        Registry::reference(self, op)
    }
}
