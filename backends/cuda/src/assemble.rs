//! The megakernel's source text: the knobs, the ABI header, the device helpers, the registry's
//! device libraries (code several ops share, from their crates under `ops/`), every registered
//! op's device function (built-ins and plugins, each in a namespace of its own), a generated
//! dispatcher and the scheduler loop. Pure and deterministic: the same registry and options
//! give the same text, which is what the cubin cache keys on.

use crate::loops::FusedLoops;
use amk_core::{Opcode, Registry};

/// The C ABI header (mirrored by [`crate::abi`]).
pub const ABI_HEADER: &str = include_str!("../include/amk_abi.h");
/// Every compile-time knob of the device code with its default (the source's first part).
pub const KNOBS: &str = include_str!("../include/amk_knobs.cuh");
/// Device helpers every op may use.
pub const DEVICE_HELPERS: &str = include_str!("../include/amk_device.cuh");
/// The persistent scheduler loop (the `amk_megakernel` entry).
pub const SCHEDULER: &str = include_str!("../include/amk_scheduler.cuh");
/// Name of the kernel entry.
pub const KERNEL_NAME: &str = "amk_megakernel";
/// Name of the param-patch scatter kernel.
pub const PATCH_KERNEL_NAME: &str = "amk_apply_patches";
/// Threads per block unless configured otherwise.
pub const DEFAULT_THREADS: u32 = 256;

/// Knobs baked into the source (and so into the cache key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knobs {
    /// Threads per block (a multiple of 32, at most 1024).
    pub threads: u32,
    /// Preprocessor definitions put before the device code (name, value): the device code's
    /// compile-time knobs (`AMK_FUSED_PAIR`, `AMK_FUSED_VECS`, ...), so that one binary can
    /// compare variants of the kernel ([`crate::CudaOptions::defines`]).
    pub defines: Vec<(String, String)>,
    /// The fused tiles' vector loops compiled in (`AMK_FUSED_LOOPS`, [`FusedLoops`]); a
    /// `defines` entry of that name wins over it.
    pub fused_loops: FusedLoops,
    /// Only these ops compiled in (`None`: every registered op;
    /// [`crate::CudaOptions::program_ops`]).
    pub ops: Option<Vec<Opcode>>,
    /// GEMV/GEMM tiles' quantised-weight loops compiled in (else `AMK_TILE_QUANT_OFF`, and
    /// such a tile runs the generic loop): only for a program holding quantised buffers.
    pub quant: bool,
    /// The per-task trace points compiled in (else `AMK_TRACE_OFF`): only for a traced
    /// session (`CudaSession::enable_trace` loads that kernel).
    pub trace: bool,
    /// A lane's weight vectors a pass of the fused loop (`AMK_FUSED_VECS`,
    /// [`crate::loops::fused_vecs`]); the device default (8) adds no define.
    pub fused_vecs: u32,
    /// Every row of the fused loop is whole passes (`AMK_FUSED_EXACT`,
    /// [`crate::loops::fused_exact`]): the loop has no bounds tests.
    pub fused_exact: bool,
    /// Every unit of each warp loaded before the task's wait (`AMK_ROW_PRE`,
    /// [`crate::loops::row_pre`]).
    pub row_pre: bool,
    /// The fused tiles stream two units a warp at once (`AMK_FUSED_PAIR`,
    /// `AMK_FUSED_PAIR_MIN`: [`crate::loops::PAIR_DEFINES`], [`crate::loops::pairs`]).
    pub pairs: bool,
    /// The float dtypes (F32, F16, BF16) whose branches are compiled in (else `AMK_NO_F32`,
    /// `AMK_NO_F16`, `AMK_NO_BF16`): a program's kernel keeps those its buffers hold.
    pub floats: FloatDtypes,
    /// Defines the program's tasks ask for through their ops (`CudaSource::task_defines`),
    /// sorted and without repeats; a `defines` entry of the same name wins.
    pub task_defines: Vec<(String, String)>,
}

/// Which of F32, F16 and BF16 a kernel's code handles inline ([`Knobs::floats`]); a buffer of
/// another float dtype still computes right, through the out-of-line and generic paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloatDtypes {
    /// F32 buffers.
    pub f32: bool,
    /// F16 buffers.
    pub f16: bool,
    /// BF16 buffers.
    pub bf16: bool,
}

impl FloatDtypes {
    /// All three: the kernel of every op and of a program that cannot tell.
    pub const ALL: FloatDtypes = FloatDtypes {
        f32: true,
        f16: true,
        bf16: true,
    };

    /// The float dtypes `program`'s buffers hold, leaving out buffers that only ops with
    /// [`amk_core::CudaSource::f32_direct`] touch (an untouched buffer counts: the host may
    /// still hand it to a task through a plugin it does not know).
    pub fn of_program(program: &amk_core::ir::Program, registry: &Registry) -> FloatDtypes {
        let direct = |op| registry.cuda(op).is_some_and(|c| c.f32_direct);
        let n = program.buffers.len();
        // Per buffer: some task touches it; some task of an op without f32_direct does.
        let (mut used, mut branched) = (vec![false; n], vec![false; n]);
        for t in &program.tasks {
            for &b in t.inputs.iter().chain(&t.outputs) {
                if let (Some(u), Some(br)) =
                    (used.get_mut(b as usize), branched.get_mut(b as usize))
                {
                    *u = true;
                    *br |= !direct(t.op);
                }
            }
        }
        let has = |d: amk_core::ir::DType| {
            (program.buffers.iter().enumerate())
                .any(|(i, b)| b.dtype == d && (branched[i] || !used[i]))
        };
        FloatDtypes {
            f32: has(amk_core::ir::DType::F32),
            f16: has(amk_core::ir::DType::F16),
            bf16: has(amk_core::ir::DType::BF16),
        }
    }
}

impl Knobs {
    /// Whether the task dispatcher inlines into the kernel's entry (`AMK_DISPATCH_INLINE`,
    /// amk_knobs.cuh): yes unless `defines` sets it to what the preprocessor reads as 0 (an
    /// integer 0 or `false`), as the device default is 1.
    pub fn dispatch_inline(&self) -> bool {
        let zero = |v: &str| v.parse::<i64>().map_or(v == "false", |x| x == 0);
        !self
            .defines
            .iter()
            .any(|(n, v)| n == "AMK_DISPATCH_INLINE" && zero(v.trim()))
    }
    /// The defines the knobs imply beyond `defines` (fused loops, quantised loops, trace points,
    /// the fused loop's pass and bounds, the loads before the wait, the float dtypes, the ops'
    /// task defines), each left out when `defines` names it: a user's value wins.
    fn derived(&self) -> Vec<(String, String)> {
        let mut d: Vec<(String, String)> = self.fused_loops.define().into_iter().collect();
        if !self.quant {
            d.push(("AMK_TILE_QUANT_OFF".into(), "1".into()));
        }
        if !self.trace {
            d.push(("AMK_TRACE_OFF".into(), "1".into()));
        }
        for (has, name) in [
            (self.floats.f32, "AMK_NO_F32"),
            (self.floats.f16, "AMK_NO_F16"),
            (self.floats.bf16, "AMK_NO_BF16"),
        ] {
            if !has {
                d.push((name.into(), "1".into()));
            }
        }
        if self.fused_exact {
            d.push((crate::loops::EXACT_DEFINE.into(), "1".into()));
        }
        if self.row_pre {
            d.push((crate::loops::ROW_PRE_DEFINE.into(), "1".into()));
        }
        if self.pairs {
            d.extend(
                (crate::loops::PAIR_DEFINES.iter()).map(|&(n, v)| (n.to_string(), v.to_string())),
            );
        }
        if self.fused_vecs != crate::loops::DEFAULT_VECS {
            d.push((
                crate::loops::VECS_DEFINE.into(),
                self.fused_vecs.to_string(),
            ));
        }
        d.extend(self.task_defines.iter().cloned());
        d.retain(|(n, _)| !self.defines.iter().any(|(u, _)| u == n));
        d
    }
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            threads: DEFAULT_THREADS,
            defines: Vec::new(),
            fused_loops: FusedLoops::ALL,
            ops: None,
            quant: true,
            trace: true,
            fused_vecs: crate::loops::DEFAULT_VECS,
            fused_exact: false,
            row_pre: false,
            pairs: false,
            floats: FloatDtypes::ALL,
            task_defines: Vec::new(),
        }
    }
}

/// One op compiled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledOp {
    /// Opcode.
    pub code: Opcode,
    /// Device function name.
    pub entry: String,
    /// Dynamic shared memory it needs.
    pub shared_bytes: u32,
    /// It calls `amk_task_wait` itself (`CudaSource::own_wait`).
    pub own_wait: bool,
}

/// The assembled source and what went into it.
#[derive(Debug, Clone)]
pub struct Megakernel {
    /// CUDA C++ source for NVRTC.
    pub source: String,
    /// The ops compiled in, by code.
    pub ops: Vec<CompiledOp>,
}

/// How a kernel's device functions are compiled: as one program, which ptxas optimises across
/// the calls (every shipped kernel: its ops inline into the dispatcher), or as separate code
/// linked by nvJitLink afterwards (a kernel with the FUSED op, whose ops are all out-of-line
/// calls: whole-program ptxas took about an hour on the every-op kernel for sm_90a; see
/// `device::jitlink`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linkage {
    /// NVRTC's default: one program, a loadable cubin straight away.
    WholeProgram,
    /// `--relocatable-device-code=true`, then linked.
    Separate,
}

impl Megakernel {
    /// How NVRTC compiles this kernel: a kernel with the FUSED op (every op an out-of-line
    /// call, `op_calls`) as separate code, linked afterwards; any other as one program.
    pub fn linkage(&self) -> Linkage {
        if self.ops.iter().any(|o| o.code == Opcode::FUSED) {
            Linkage::Separate
        } else {
            Linkage::WholeProgram
        }
    }
    /// Largest dynamic shared memory any op asks for.
    pub fn max_shared_bytes(&self) -> u32 {
        self.ops.iter().map(|o| o.shared_bytes).max().unwrap_or(0)
    }
    /// Largest dynamic shared memory the ops of `program` ask for (with a FUSED task, every op's
    /// in this kernel: its steps' ops are among them, [`crate::kernel_ops`]). Shared memory a
    /// launch reserves comes out of the L1 cache, so a program that uses no op needing it
    /// reserves none.
    pub fn shared_bytes_for(&self, program: &amk_core::Program) -> u32 {
        if program.tasks.iter().any(|t| t.op == Opcode::FUSED) {
            return self.max_shared_bytes();
        }
        self.ops
            .iter()
            .filter(|o| program.tasks.iter().any(|t| t.op == o.code))
            .map(|o| o.shared_bytes)
            .max()
            .unwrap_or(0)
    }
    /// Whether `op` has a device function in this kernel.
    pub fn has(&self, op: Opcode) -> bool {
        self.ops.binary_search_by_key(&op, |o| o.code).is_ok()
    }
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch == '_' || ch.is_ascii_alphabetic())
        && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
}

/// Assembles the megakernel for every op of `registry` that has a CUDA device function.
/// Refuses entry names that are not C identifiers and sources holding NUL bytes (both would
/// break the generated text, and plugin sources come from outside).
pub fn megakernel_source(registry: &Registry, knobs: Knobs) -> Result<Megakernel, String> {
    if knobs.threads == 0 || !knobs.threads.is_multiple_of(32) || knobs.threads > 1024 {
        return Err(format!(
            "threads per block must be a multiple of 32 in 32..=1024, got {}",
            knobs.threads
        ));
    }
    let mut src = String::with_capacity(256 << 10);
    src.push_str("// amk megakernel — generated; do not edit.\n");
    src.push_str(&format!("#define AMK_THREADS {}\n", knobs.threads));
    let derived = knobs.derived();
    for (name, value) in knobs.defines.iter().chain(derived.iter()) {
        // A name and a plain token only: the text goes into the source verbatim.
        let token = !value.is_empty()
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '+'));
        if !is_identifier(name) || !token || name == "AMK_THREADS" {
            return Err(format!(
                "device define '{name}={value}' must be NAME=VALUE with a C identifier other \
                 than AMK_THREADS and a value of letters, digits, '_', '.', '-' or '+'"
            ));
        }
        src.push_str(&format!("#define {name} {value}\n"));
    }
    // `#line` names each part's own file, so that line info (profilers, compiler messages)
    // points into the repository's files rather than into the generated source.
    for (file, part) in [
        ("amk_knobs.cuh", KNOBS),
        ("amk_abi.h", ABI_HEADER),
        ("amk_device.cuh", DEVICE_HELPERS),
    ] {
        src.push_str(&format!("#line 1 \"backends/cuda/include/{file}\"\n"));
        src.push_str(part);
        src.push('\n');
    }
    for lib in registry.device_libraries() {
        if lib.cuda.contains('\0') || lib.file.contains(['"', '\\', '\n']) {
            return Err(format!(
                "device library {}: its source holds a NUL byte or its file name a quote, \
                 backslash or newline",
                lib.name
            ));
        }
        src.push_str(&format!("#line 1 \"{}\"\n", lib.file));
        src.push_str(lib.cuda);
        src.push('\n');
    }
    src.push_str("__device__ void amk_dispatch_step(const amk_task_ctx& c);\n");
    let mut ops = Vec::new();
    for (spec, _) in registry.iter() {
        let Some(cuda) = registry.cuda(spec.code) else {
            continue;
        };
        if knobs.ops.as_ref().is_some_and(|o| !o.contains(&spec.code)) {
            continue;
        }
        if !is_identifier(&cuda.entry) {
            return Err(format!(
                "op {}: CUDA entry '{}' is not a C identifier",
                spec.name, cuda.entry
            ));
        }
        if cuda.source.contains('\0') {
            return Err(format!("op {}: CUDA source holds a NUL byte", spec.name));
        }
        let file = spec.name.replace(['"', '\\'], "_");
        src.push_str(&format!(
            "namespace amk_op_{code} {{\n#line 1 \"op {file}\"\n{body}\n}} // namespace amk_op_{code}\n",
            code = spec.code.0,
            body = cuda.source,
        ));
        ops.push(CompiledOp {
            code: spec.code,
            entry: cuda.entry.to_string(),
            shared_bytes: cuda.shared_bytes,
            own_wait: cuda.own_wait,
        });
    }
    src.push_str("#line 1 \"amk generated dispatcher\"\n");
    let calls = op_calls(&ops, &mut src);
    let inline = knobs.dispatch_inline();
    for (name, with_fused) in [("amk_dispatch", true), ("amk_dispatch_step", false)] {
        let attr = if with_fused && inline {
            "__forceinline__"
        } else {
            "__noinline__"
        };
        let cases = (ops.iter().zip(&calls))
            .filter(|(o, _)| with_fused || o.code != Opcode::FUSED)
            .map(|(o, call)| {
                // An op that does not wait itself runs once the scheduler's wait for it is met
                // (a FUSED step's wait returns at once: its task waited before its first step).
                let wait = if o.own_wait {
                    ""
                } else {
                    "if (amk_task_wait(c)) "
                };
                (o.code, format!("{wait}amk_op_{}::{call}(c); ", o.code.0))
            });
        switch_function(name, attr, cases, &mut src);
    }
    if inline {
        verify_dispatcher(&ops, &calls, &mut src);
    }
    src.push_str("#line 1 \"backends/cuda/include/amk_scheduler.cuh\"\n");
    src.push_str(SCHEDULER);
    src.push('\n');
    Ok(Megakernel { source: src, ops })
}

/// With AMK_DISPATCH_INLINE (the task dispatcher inlined into the kernel's entry), the
/// dispatcher `amk_verify_tasks` calls: out of line, holding only the ops that wait themselves
/// (in verify mode an op the scheduler waits for runs nothing: `amk_task_wait` answers false),
/// so the code of the others — wgmma's above all, which ptxas serializes in any function that
/// is called — lives only in the entry. Without the knob the verify pass calls `amk_dispatch`.
fn verify_dispatcher(ops: &[CompiledOp], calls: &[String], src: &mut String) {
    let cases = (ops.iter().zip(calls)).map(|(o, call)| match o.own_wait {
        true => (o.code, format!("amk_op_{}::{call}(c); ", o.code.0)),
        false => (o.code, String::new()),
    });
    switch_function("amk_dispatch_verify", "__noinline__", cases, src);
    src.push_str("#define AMK_VERIFY_DISPATCH amk_dispatch_verify\n");
}

/// A generated dispatcher `name`: a `switch` on the task's opcode with one case a (code,
/// statements) pair, each ending in `break`, and an unknown opcode failing the task.
fn switch_function(
    name: &str,
    attr: &str,
    cases: impl Iterator<Item = (Opcode, String)>,
    src: &mut String,
) {
    src.push_str(&format!(
        "__device__ {attr} void {name}(const amk_task_ctx& c) {{\n  switch (c.inst->op) {{\n"
    ));
    for (code, body) in cases {
        src.push_str(&format!("    case {}: {body}break;\n", code.0));
    }
    src.push_str("    default: amk_fail(c, AMK_ERR_UNKNOWN_OPCODE, c.inst->op);\n  }\n}\n");
}

/// The name each dispatcher calls for each of `ops`, in its namespace: the op's entry itself,
/// or, in a kernel with the FUSED op, an out-of-line wrapper (`OUT_OF_LINE`) that this writes
/// into `src`. Why: with FUSED, two dispatchers call every op (the task's and a FUSED step's,
/// `amk_dispatch_step`), and NVRTC inlined each op's body into both — the every-op kernel held
/// every op twice and compiled for over half an hour on one core. Through one out-of-line copy
/// each body is compiled once; kernels without FUSED (every shipped decode and prefill
/// program) keep their source, and so their machine code, as it was.
fn op_calls(ops: &[CompiledOp], src: &mut String) -> Vec<String> {
    if !ops.iter().any(|o| o.code == Opcode::FUSED) {
        return ops.iter().map(|o| o.entry.clone()).collect();
    }
    ops.iter()
        .map(|o| {
            if o.code == Opcode::FUSED {
                return o.entry.clone();
            }
            src.push_str(&format!(
                "namespace amk_op_{code} {{ __device__ __noinline__ void {OUT_OF_LINE}(const \
                 amk_task_ctx& c) {{ {entry}(c); }} }}\n",
                code = o.code.0,
                entry = o.entry
            ));
            OUT_OF_LINE.to_string()
        })
        .collect()
}

/// The out-of-line wrapper's name inside an op's namespace ([`op_calls`]).
pub const OUT_OF_LINE: &str = "amk_entry_out_of_line";
