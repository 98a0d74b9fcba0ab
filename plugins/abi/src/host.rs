//! The host's side: loading a plugin library, checking its descriptor, copying it into owned
//! data and registering its ops with a dynamic CPU reference.

use crate::{
    ABI_VERSION, AmkStr, CpuArgsV1, CpuReferenceFnV1, ENTRY_SYMBOL, EntryFnV1, FIRST_PLUGIN_CODE,
    OpDescriptorV1, PARAM_INT, PARAM_REAL, ParamDeclV1, ParamV1, PluginDescriptorV1, PluginError,
    STATUS_OK, TensorV1,
};
use amk_core::abi::{MAX_INPUTS, MAX_OUTPUTS};
use amk_core::json::Value;
use amk_core::{
    CpuCall, CpuReference, OpError, OpSpec, Opcode, Origin, ParamDecl, ParamType, Registry, Tensor,
    WriteRegion,
};
use libloading::Library;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most ops one plugin may declare.
const MAX_OPS: usize = 4096;
/// Most params one op may declare.
const MAX_PARAMS: usize = 64;
/// Longest name, version or summary, in bytes.
const MAX_NAME: usize = 1024;
/// Longest CUDA source, in bytes.
const MAX_SOURCE: usize = 16 << 20;
/// Size of the error buffer handed to references.
const ERR_CAP: usize = 1024;

/// A plugin op's CUDA device function, copied from the descriptor into owned strings and
/// registered with the op, so the CUDA backend compiles it into the megakernel.
pub use amk_core::CudaSource;

/// One op a loaded plugin registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedOp {
    /// Namespaced name.
    pub name: String,
    /// Its code.
    pub code: Opcode,
    /// Whether it has a CPU reference.
    pub has_cpu: bool,
    /// Its CUDA device function, if it has one.
    pub cuda: Option<CudaSource>,
}

/// What [`PluginRegistry::load_plugin`] registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedPlugin {
    /// The library's path (as given).
    pub path: PathBuf,
    /// The plugin's name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// Its ops, in descriptor order.
    pub ops: Vec<LoadedOp>,
}

/// Loading plugins into a registry.
pub trait PluginRegistry {
    /// Loads the shared library at `path`, checks its ABI version-1 descriptor and registers
    /// every op it declares (all or none). The library stays loaded for the rest of the
    /// process.
    fn load_plugin(&mut self, path: impl AsRef<Path>) -> Result<LoadedPlugin, PluginError>;
}

impl PluginRegistry for Registry {
    fn load_plugin(&mut self, path: impl AsRef<Path>) -> Result<LoadedPlugin, PluginError> {
        load_plugin_with_entry(self, path.as_ref(), ENTRY_SYMBOL)
    }
}

/// [`PluginRegistry::load_plugin`] looking up `symbol` instead of [`ENTRY_SYMBOL`] (the
/// symbol must still have the version-1 entry type). Meant for tests of the refusal paths.
pub fn load_plugin_with_entry(
    registry: &mut Registry,
    path: &Path,
    symbol: &str,
) -> Result<LoadedPlugin, PluginError> {
    let p = path.to_path_buf();
    if !path.exists() {
        return Err(PluginError::NotFound { path: p });
    }
    // A FIFO or a device would hang or feed the loader without end: regular files only.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Err(PluginError::Load {
            path: p,
            reason: "not a regular file".into(),
        });
    }
    // A bare file name would make the dynamic loader search its library path: name the file.
    let load_path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        Path::new(".").join(path)
    };
    #[allow(unsafe_code)]
    // SAFETY: loading runs the library's initialisers. Loading a plugin is an explicit request
    // of the user, who trusts the file as they trust the amk binary (documented in
    // docs/plugins.md); nothing else can be checked before its code runs.
    let lib = unsafe { Library::new(&load_path) }.map_err(|e| PluginError::Load {
        path: p.clone(),
        reason: with_causes(&e),
    })?;
    #[allow(unsafe_code)]
    // SAFETY: the symbol is looked up with the version-1 entry type, the type every amk
    // plugin exports under this name (the descriptor's version and sizes are checked below
    // before anything else is read).
    let entry: Option<EntryFnV1> = unsafe { lib.get::<EntryFnV1>(symbol) }.ok().map(|s| *s);
    let Some(entry) = entry else {
        return Err(missing_entry(&lib, p, symbol));
    };
    #[allow(unsafe_code)]
    // SAFETY: `entry` is the plugin's version-1 entry function; it takes no arguments.
    let desc_ptr = unsafe { entry() };
    #[allow(unsafe_code)]
    // SAFETY: the entry's result is a descriptor pointer (or null) into `lib`, which the
    // registered references keep loaded.
    unsafe {
        register_descriptor(registry, path, desc_ptr, Some(Arc::new(lib)))
    }
}

/// Checks the descriptor at `desc_ptr`, copies it and registers its ops (all or none);
/// `lib` (the library holding the pointers) is kept alive by every registered reference and
/// never unloaded. Public for descriptors built in this process (the fuzz targets'), which
/// pass `lib == None`.
///
/// # Safety
/// `desc_ptr` is null or points to a descriptor whose first two `u32`s are its ABI version
/// and size, and, when those match ours, to a valid [`PluginDescriptorV1`] whose pointers
/// designate valid data for as long as `lib` is loaded (for `lib == None`: for as long as
/// `registry` or anything taken from it is used).
#[allow(unsafe_code)]
pub unsafe fn register_descriptor(
    registry: &mut Registry,
    path: &Path,
    desc_ptr: *const PluginDescriptorV1,
    lib: Option<Arc<Library>>,
) -> Result<LoadedPlugin, PluginError> {
    let p = path.to_path_buf();
    if desc_ptr.is_null() {
        return Err(malformed(&p, "the entry returned a null descriptor"));
    }
    // Read the version and size before the rest: a descriptor of another version may be
    // smaller than ours, so only the two leading u32s (common to every version) are read first.
    #[allow(unsafe_code)]
    // SAFETY: every ABI version starts with `abi_version: u32, struct_size: u32`; the pointer
    // is non-null and points into the loaded library, which stays loaded.
    let (abi_version, struct_size) = unsafe {
        let head = desc_ptr.cast::<u32>();
        (head.read_unaligned(), head.add(1).read_unaligned())
    };
    if abi_version != ABI_VERSION {
        return Err(PluginError::AbiVersion {
            path: p,
            found: abi_version,
            expected: ABI_VERSION,
        });
    }
    let expected = std::mem::size_of::<PluginDescriptorV1>() as u32;
    if struct_size != expected {
        return Err(PluginError::StructSize {
            path: p,
            what: "PluginDescriptorV1",
            found: struct_size,
            expected,
        });
    }
    #[allow(unsafe_code)]
    // SAFETY: version and size match ours, so the pointer designates a `PluginDescriptorV1`
    // that stays valid while the library is loaded (plugin contract).
    let desc: PluginDescriptorV1 = unsafe { desc_ptr.read_unaligned() };
    let expected = std::mem::size_of::<OpDescriptorV1>() as u32;
    if desc.op_struct_size != expected {
        return Err(PluginError::StructSize {
            path: p,
            what: "OpDescriptorV1",
            found: desc.op_struct_size,
            expected,
        });
    }
    let name = copy_str(&p, desc.name, "the plugin name", MAX_NAME)?;
    let version = copy_str(&p, desc.version, "the plugin version", MAX_NAME)?;
    if name.is_empty() {
        return Err(malformed(&p, "empty plugin name"));
    }
    if desc.n_ops > MAX_OPS {
        return Err(malformed(
            &p,
            &format!("{} ops (at most {MAX_OPS})", desc.n_ops),
        ));
    }
    let op_descs = copy_slice(&p, desc.ops, desc.n_ops, "the op table")?;

    let mut staged = registry.clone();
    let mut ops = Vec::with_capacity(op_descs.len());
    for (i, od) in op_descs.iter().enumerate() {
        let (spec, loaded, reference) = read_op(&p, i, od)?;
        let cpu = reference.map(|f| dynamic_reference(f, lib.clone(), &spec));
        staged
            .register_full(spec, Origin::Plugin(p.clone()), cpu, loaded.cuda.clone())
            .map_err(|source| PluginError::Registry {
                path: p.clone(),
                source,
            })?;
        ops.push(loaded);
    }
    *registry = staged;
    // Never unloaded: the registry's references hold the library, and any clone of the
    // registry may outlive this one; leaking one handle keeps it mapped for the process.
    std::mem::forget(lib);
    Ok(LoadedPlugin {
        path: p,
        name,
        version,
        ops,
    })
}

/// `e` and every error under it, joined (the dynamic loader's own message is the cause of
/// libloading's "dlopen failed").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn malformed(p: &Path, why: &str) -> PluginError {
    PluginError::Malformed {
        path: p.to_path_buf(),
        why: why.to_string(),
    }
}

/// The error for a library without `symbol`, naming another ABI version's entry if present.
fn missing_entry(lib: &Library, p: PathBuf, symbol: &str) -> PluginError {
    for v in (1..=16u32).filter(|&v| v != ABI_VERSION) {
        let other = format!("amk_plugin_entry_v{v}");
        #[allow(unsafe_code)]
        // SAFETY: only the symbol's presence is tested; it is never called or read.
        let found = unsafe { lib.get::<*const u8>(other.as_str()) }.is_ok();
        if found && symbol == ENTRY_SYMBOL {
            return PluginError::AbiVersion {
                path: p,
                found: v,
                expected: ABI_VERSION,
            };
        }
    }
    PluginError::MissingEntry {
        path: p,
        symbol: symbol.to_string(),
    }
}

/// Copies `n` elements from a descriptor pointer (null only for `n == 0`).
fn copy_slice<T: Copy>(
    p: &Path,
    ptr: *const T,
    n: usize,
    what: &str,
) -> Result<Vec<T>, PluginError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(malformed(
            p,
            &format!("{what} is a null pointer with {n} entries"),
        ));
    }
    #[allow(unsafe_code)]
    // SAFETY: non-null; the plugin contract is that descriptor pointers designate `n` valid
    // elements in the loaded library (counts are bounded by the callers).
    let s = unsafe { std::slice::from_raw_parts(ptr, n) };
    Ok(s.to_vec())
}

/// Copies a descriptor string into an owned `String`.
fn copy_str(p: &Path, s: AmkStr, what: &str, max: usize) -> Result<String, PluginError> {
    if s.len > max {
        return Err(malformed(
            p,
            &format!("{what} is {} bytes long (at most {max})", s.len),
        ));
    }
    let bytes = copy_slice(p, s.ptr, s.len, what)?;
    String::from_utf8(bytes).map_err(|_| PluginError::NonUtf8 {
        path: p.to_path_buf(),
        what: what.to_string(),
    })
}

/// Whether `name` is `namespace.op` with identifier-like parts.
fn namespaced(name: &str) -> bool {
    let ok_part = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    match name.split_once('.') {
        Some((ns, rest)) => ok_part(ns) && rest.split('.').all(ok_part),
        None => false,
    }
}

type ReadOp = (OpSpec, LoadedOp, Option<CpuReferenceFnV1>);

/// Checks and copies one op descriptor.
fn read_op(p: &Path, i: usize, od: &OpDescriptorV1) -> Result<ReadOp, PluginError> {
    let name = copy_str(p, od.name, &format!("the name of op #{i}"), MAX_NAME)?;
    if !namespaced(&name) {
        return Err(malformed(
            p,
            &format!(
                "op #{i} name '{name}' is not namespaced ('namespace.op', letters, digits, '_', '-')"
            ),
        ));
    }
    let summary = copy_str(p, od.summary, &format!("the summary of '{name}'"), MAX_NAME)?;
    if od.code < FIRST_PLUGIN_CODE {
        return Err(PluginError::CodeTooLow {
            path: p.to_path_buf(),
            op: name,
            code: od.code,
            min: FIRST_PLUGIN_CODE,
        });
    }
    let code = u16::try_from(od.code)
        .map_err(|_| malformed(p, &format!("op '{name}': code {} exceeds 65535", od.code)))?;
    if od.min_inputs > od.max_inputs || od.max_inputs as usize > MAX_INPUTS {
        return Err(malformed(
            p,
            &format!(
                "op '{name}': inputs {}..{} (at most {MAX_INPUTS}, min ≤ max)",
                od.min_inputs, od.max_inputs
            ),
        ));
    }
    if od.n_outputs == 0 || od.n_outputs as usize > MAX_OUTPUTS {
        return Err(malformed(
            p,
            &format!("op '{name}': {} outputs (1..={MAX_OUTPUTS})", od.n_outputs),
        ));
    }
    if od.n_params > MAX_PARAMS {
        return Err(malformed(
            p,
            &format!("op '{name}': {} params (at most {MAX_PARAMS})", od.n_params),
        ));
    }
    let raw_params: Vec<ParamDeclV1> = copy_slice(
        p,
        od.params,
        od.n_params,
        &format!("the params of '{name}'"),
    )?;
    let mut params = Vec::with_capacity(raw_params.len());
    for (k, d) in raw_params.iter().enumerate() {
        let pname = copy_str(p, d.name, &format!("param #{k} of '{name}'"), MAX_NAME)?;
        if pname.is_empty() {
            return Err(malformed(
                p,
                &format!("op '{name}': param #{k} has no name"),
            ));
        }
        let ty = match d.ty {
            PARAM_INT => ParamType::Int,
            PARAM_REAL => ParamType::Real,
            other => {
                return Err(malformed(
                    p,
                    &format!("op '{name}': param '{pname}' has unknown type {other}"),
                ));
            }
        };
        if params.iter().any(|q: &ParamDecl| q.name == pname) {
            return Err(malformed(
                p,
                &format!("op '{name}': param '{pname}' declared twice"),
            ));
        }
        params.push(ParamDecl {
            name: Cow::Owned(pname),
            ty,
            required: d.required != 0,
        });
    }
    let cuda_source = copy_str(
        p,
        od.cuda_source,
        &format!("the CUDA source of '{name}'"),
        MAX_SOURCE,
    )?;
    let cuda_entry = copy_str(
        p,
        od.cuda_entry,
        &format!("the CUDA entry of '{name}'"),
        MAX_NAME,
    )?;
    let cuda = match (cuda_source.is_empty(), cuda_entry.is_empty()) {
        (true, true) => None,
        (false, false) => Some(CudaSource {
            source: cuda_source.into(),
            entry: cuda_entry.into(),
            shared_bytes: od.cuda_shared_bytes,
            own_wait: false,
            row_loop: None,
            f32_direct: false,
            task_defines: None,
        }),
        _ => {
            return Err(malformed(
                p,
                &format!("op '{name}': CUDA source and entry name come together"),
            ));
        }
    };
    // Bounded above by MAX_INPUTS / MAX_OUTPUTS (both < 256).
    let (min_in, max_in, n_out) = (od.min_inputs as u8, od.max_inputs as u8, od.n_outputs as u8);
    let spec = OpSpec {
        code: Opcode(code),
        name: Cow::Owned(name.clone()),
        min_inputs: min_in,
        max_inputs: Some(max_in),
        n_outputs: Some(n_out),
        params: Cow::Owned(params),
        write_region: WriteRegion::Whole,
        check: None,
        summary: Cow::Owned(summary),
    };
    let loaded = LoadedOp {
        name,
        code: Opcode(code),
        has_cpu: od.cpu_reference.is_some(),
        cuda,
    };
    Ok((spec, loaded, od.cpu_reference))
}

/// Wraps a plugin's C reference into a registry reference: operands are copied into
/// little-endian byte buffers, the function is called, and outputs are decoded back.
fn dynamic_reference(
    f: CpuReferenceFnV1,
    lib: Option<Arc<Library>>,
    spec: &OpSpec,
) -> CpuReference {
    let (lo, hi) = (
        usize::from(spec.min_inputs),
        usize::from(spec.max_inputs.unwrap_or(spec.min_inputs)),
    );
    let outs = usize::from(spec.n_outputs.unwrap_or(1));
    CpuReference::dynamic(Arc::new(move |call: &mut CpuCall<'_, '_>| {
        // The closure owns the library: the function pointer cannot dangle.
        let _keep = &lib;
        call.expect_arity(lo, hi, outs)?;
        call_plugin(f, call)
    }))
}

/// One call of a plugin reference.
fn call_plugin(f: CpuReferenceFnV1, call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    let mut in_data: Vec<Vec<u8>> = Vec::with_capacity(call.n_inputs());
    let mut in_shapes: Vec<Vec<u64>> = Vec::with_capacity(call.n_inputs());
    let mut in_dtypes = Vec::with_capacity(call.n_inputs());
    for i in 0..call.n_inputs() {
        let t = call.input(i)?;
        in_data.push(t.to_le_bytes());
        in_shapes.push(t.shape().to_vec());
        in_dtypes.push(t.dtype());
    }
    let mut out_data: Vec<Vec<u8>> = call.outputs.iter().map(Tensor::to_le_bytes).collect();
    let out_meta: Vec<(amk_core::DType, Vec<u64>)> = call
        .outputs
        .iter()
        .map(|t| (t.dtype(), t.shape().to_vec()))
        .collect();
    let view = |dtype: amk_core::DType, shape: &[u64], data: &mut Vec<u8>| TensorV1 {
        dtype: u32::from(dtype.code()),
        rank: shape.len() as u32,
        shape: shape.as_ptr(),
        data: data.as_mut_ptr(),
        nbytes: data.len(),
    };
    let inputs: Vec<TensorV1> = in_data
        .iter_mut()
        .zip(&in_shapes)
        .zip(&in_dtypes)
        .map(|((d, s), &t)| view(t, s, d))
        .collect();
    let outputs: Vec<TensorV1> = out_data
        .iter_mut()
        .zip(&out_meta)
        .map(|(d, (t, s))| view(*t, s, d))
        .collect();
    let params: Vec<ParamV1> = call
        .task
        .params
        .iter()
        .filter_map(|(k, v)| {
            let name = AmkStr {
                ptr: k.as_ptr(),
                len: k.len(),
            };
            match v {
                Value::Int(i) => Some(ParamV1 {
                    name,
                    ty: PARAM_INT,
                    int_value: *i,
                    real_value: *i as f64,
                }),
                other => other.as_f64().map(|r| ParamV1 {
                    name,
                    ty: PARAM_REAL,
                    int_value: r as i64,
                    real_value: r,
                }),
            }
        })
        .collect();
    let args = CpuArgsV1 {
        struct_size: std::mem::size_of::<CpuArgsV1>() as u32,
        inputs: inputs.as_ptr(),
        n_inputs: inputs.len(),
        outputs: outputs.as_ptr(),
        n_outputs: outputs.len(),
        params: params.as_ptr(),
        n_params: params.len(),
    };
    let mut err = vec![0u8; ERR_CAP];
    #[allow(unsafe_code)]
    // SAFETY: `args` and everything it points to (shapes, byte buffers, param names borrowed
    // from the task) live until after the call; each output buffer is distinct and written
    // only by the callee; `err` is a writable buffer of `ERR_CAP` bytes. The library holding
    // `f` is kept loaded by the caller's closure.
    let status = unsafe { f(&args, err.as_mut_ptr(), err.len()) };
    if status != STATUS_OK {
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        return Err(OpError::Plugin {
            status,
            message: String::from_utf8_lossy(&err[..end]).into_owned(),
        });
    }
    for (out, (bytes, (dtype, shape))) in
        call.outputs.iter_mut().zip(out_data.iter().zip(&out_meta))
    {
        *out = Tensor::from_le_bytes(*dtype, shape, bytes)?;
    }
    Ok(())
}

/// Where cargo put the shared library of the workspace crate whose library is named
/// `lib_name` (e.g. `amk_plugin_example_gelu_tanh`), seen from the running executable: tests
/// of a crate that dev-depends on a `cdylib` crate find it in `target/<profile>/deps/` (next
/// to the test binary) or one level up. `None` when it is in neither place.
pub fn find_built_cdylib(lib_name: &str) -> Option<std::path::PathBuf> {
    let name = format!(
        "{}{lib_name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [Some(deps.join(&name)), deps.parent().map(|p| p.join(&name))]
        .into_iter()
        .flatten()
        .find(|p| p.exists())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, unsafe_code)]
mod tests {
    use super::*;
    use crate::plugin::PluginCall;
    use crate::{STATUS_PANIC, cpu_reference};
    use amk_core::json::Map;
    use amk_core::{DType, Input, Task};

    fn sevens(c: &mut PluginCall<'_>) -> Result<(), String> {
        let v = 7.0 + c.real("bias").unwrap_or(0.0) as f32;
        for y in &mut c.outputs {
            for i in 0..y.numel().unwrap() {
                y.set_f32(i, v);
            }
        }
        Ok(())
    }
    fn panics(_: &mut PluginCall<'_>) -> Result<(), String> {
        panic!("boom")
    }
    fn refuses(_: &mut PluginCall<'_>) -> Result<(), String> {
        Err("not today".into())
    }
    cpu_reference!(sevens_c => sevens);
    cpu_reference!(panics_c => panics);
    cpu_reference!(refuses_c => refuses);

    fn leak<T>(v: Vec<T>) -> &'static [T] {
        Box::leak(v.into_boxed_slice())
    }
    fn op(name: &'static str, code: u32) -> OpDescriptorV1 {
        OpDescriptorV1::new(name, code, 1, 1, 1, Some(sevens_c))
    }
    fn plugin(ops: Vec<OpDescriptorV1>) -> PluginDescriptorV1 {
        PluginDescriptorV1::new("t", "1.0", leak(ops))
    }
    fn load_into(reg: &mut Registry, d: PluginDescriptorV1) -> Result<LoadedPlugin, PluginError> {
        let d: &'static PluginDescriptorV1 = Box::leak(Box::new(d));
        unsafe { register_descriptor(reg, Path::new("test.so"), d, None) }
    }
    fn load(d: PluginDescriptorV1) -> Result<LoadedPlugin, PluginError> {
        load_into(&mut Registry::empty(), d)
    }
    fn run(reg: &Registry, code: u16, params: Map) -> Result<Tensor, OpError> {
        let mut task = Task::new(0, Opcode(code), vec![0], vec![1], 0);
        task.params = params;
        let x = Tensor::from_f32(DType::F32, &[2], &[1.0, 2.0]).unwrap();
        let mut outs = [Tensor::zeros(DType::BF16, &[2])];
        reg.reference(Opcode(code)).unwrap().call(&mut CpuCall {
            task: &task,
            registry: Some(reg),
            inputs: &[Input::Tensor(&x)],
            outputs: &mut outs,
        })?;
        let [y] = outs;
        Ok(y)
    }

    #[test]
    fn a_valid_descriptor_registers_and_runs() {
        let mut reg = Registry::empty();
        let decls = leak(vec![ParamDeclV1::optional("bias", PARAM_REAL)]);
        let loaded = load_into(
            &mut reg,
            plugin(vec![op("t.a", 1000).with_params(decls).with_cuda(
                "__device__ void f() {}",
                "f",
                128,
            )]),
        )
        .unwrap();
        assert_eq!(loaded.name, "t");
        assert_eq!(loaded.version, "1.0");
        assert_eq!(loaded.ops.len(), 1);
        let cuda = loaded.ops[0].cuda.as_ref().unwrap();
        assert_eq!((cuda.entry.as_ref(), cuda.shared_bytes), ("f", 128));
        assert_eq!(reg.resolve_name("t.a"), Some(Opcode(1000)));
        assert_eq!(
            reg.origin(Opcode(1000)),
            Some(&Origin::Plugin("test.so".into()))
        );
        assert_eq!(
            reg.get(Opcode(1000)).unwrap().param_type("bias"),
            Some(ParamType::Real)
        );
        let y = run(&reg, 1000, Map::new()).unwrap();
        assert_eq!(y.to_f32_vec(), vec![7.0, 7.0]);
        let mut m = Map::new();
        m.insert("bias", Value::Float(0.5));
        assert_eq!(run(&reg, 1000, m).unwrap().to_f32_vec(), vec![7.5, 7.5]);
    }

    #[test]
    fn panics_and_errors_become_op_errors() {
        let mut reg = Registry::empty();
        load_into(
            &mut reg,
            plugin(vec![
                OpDescriptorV1::new("t.p", 1000, 1, 1, 1, Some(panics_c)),
                OpDescriptorV1::new("t.e", 1001, 1, 1, 1, Some(refuses_c)),
            ]),
        )
        .unwrap();
        match run(&reg, 1000, Map::new()) {
            Err(OpError::Plugin { status, message }) => {
                assert_eq!(status, STATUS_PANIC);
                assert!(message.contains("boom"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        match run(&reg, 1001, Map::new()) {
            Err(OpError::Plugin { status, message }) => {
                assert_ne!(status, STATUS_OK);
                assert_eq!(message, "not today");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn version_and_sizes_are_checked() {
        let mut d = plugin(vec![op("t.a", 1000)]);
        d.abi_version = 2;
        assert!(matches!(
            load(d),
            Err(PluginError::AbiVersion {
                found: 2,
                expected: 1,
                ..
            })
        ));
        let mut d = plugin(vec![op("t.a", 1000)]);
        d.struct_size += 8;
        assert!(matches!(
            load(d),
            Err(PluginError::StructSize {
                what: "PluginDescriptorV1",
                ..
            })
        ));
        let mut d = plugin(vec![op("t.a", 1000)]);
        d.op_struct_size -= 8;
        assert!(matches!(
            load(d),
            Err(PluginError::StructSize {
                what: "OpDescriptorV1",
                ..
            })
        ));
        let r = unsafe {
            register_descriptor(
                &mut Registry::empty(),
                Path::new("x.so"),
                std::ptr::null(),
                None,
            )
        };
        assert!(matches!(r, Err(PluginError::Malformed { .. })));
    }

    #[test]
    fn malformed_descriptors_are_refused() {
        let malformed = |d: PluginDescriptorV1| match load(d) {
            Err(e @ PluginError::Malformed { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        let mut d = plugin(vec![]);
        d.ops = std::ptr::null();
        d.n_ops = 3;
        assert!(malformed(d).contains("null pointer"));
        let mut d = plugin(vec![op("t.a", 1000)]);
        d.n_ops = 1 << 40;
        assert!(malformed(d).contains("ops"));
        let mut d = plugin(vec![]);
        d.name = AmkStr {
            ptr: std::ptr::null(),
            len: 5,
        };
        malformed(d);
        let mut d = plugin(vec![]);
        d.version = AmkStr {
            ptr: b"x".as_ptr(),
            len: usize::MAX,
        };
        malformed(d);
        assert!(malformed(plugin(vec![op("gelu", 1000)])).contains("namespaced"));
        assert!(malformed(plugin(vec![op("t.", 1000)])).contains("namespaced"));
        let mut o = op("t.a", 1000);
        o.min_inputs = 2;
        malformed(plugin(vec![o]));
        let mut o = op("t.a", 1000);
        o.max_inputs = 200;
        malformed(plugin(vec![o]));
        let mut o = op("t.a", 1000);
        o.n_outputs = 0;
        malformed(plugin(vec![o]));
        let mut o = op("t.a", 1000);
        o.n_params = 1 << 30;
        malformed(plugin(vec![o]));
        let o = op("t.a", 1000).with_params(leak(vec![ParamDeclV1::required("k", 7)]));
        assert!(malformed(plugin(vec![o])).contains("unknown type"));
        let o = op("t.a", 70_000);
        assert!(malformed(plugin(vec![o])).contains("65535"));
        let mut o = op("t.a", 1000);
        o.cuda_entry = AmkStr::new("f");
        assert!(malformed(plugin(vec![o])).contains("CUDA"));
    }

    #[test]
    fn non_utf8_strings_are_refused() {
        let bad = AmkStr {
            ptr: leak(vec![0x66u8, 0xff, 0xfe]).as_ptr(),
            len: 3,
        };
        let mut d = plugin(vec![]);
        d.name = bad;
        assert!(matches!(load(d), Err(PluginError::NonUtf8 { .. })));
        let mut o = op("t.a", 1000);
        o.name = bad;
        assert!(matches!(
            load(plugin(vec![o])),
            Err(PluginError::NonUtf8 { .. })
        ));
        let mut o = op("t.a", 1000);
        o.cuda_source = bad;
        o.cuda_entry = AmkStr::new("f");
        let e = load(plugin(vec![o])).unwrap_err();
        assert!(e.to_string().contains("CUDA source"), "{e}");
    }

    #[test]
    fn low_codes_and_duplicates_are_refused_atomically() {
        assert!(matches!(
            load(plugin(vec![op("t.a", 999)])),
            Err(PluginError::CodeTooLow { code: 999, .. })
        ));
        let mut reg = Registry::empty();
        load_into(&mut reg, plugin(vec![op("t.a", 1000)])).unwrap();
        // Same name, other code; same code, other name; a duplicate inside one plugin: each
        // refused with the registry's message, and nothing of the failed plugin registered.
        for ops in [
            vec![op("t.b", 1001), op("t.a", 1002)],
            vec![op("t.b", 1001), op("t.c", 1000)],
            vec![op("t.b", 1001), op("t.b", 1003)],
        ] {
            let e = load_into(&mut reg, plugin(ops)).unwrap_err();
            assert!(matches!(e, PluginError::Registry { .. }), "{e}");
            assert!(e.to_string().contains("already registered"), "{e}");
            assert_eq!(reg.len(), 1);
            assert_eq!(reg.resolve_name("t.b"), None);
        }
        // A device param field declared with the wrong type.
        let o = op("t.z", 1005).with_params(leak(vec![ParamDeclV1::required("eps", PARAM_INT)]));
        let e = load_into(&mut reg, plugin(vec![o])).unwrap_err();
        assert!(e.to_string().contains("device field"), "{e}");
    }
}
