//! The plugin author's side: safe views of a reference call, and the panic guard behind
//! [`crate::cpu_reference!`].

use crate::{AmkStr, CpuArgsV1, PARAM_INT, ParamV1, STATUS_ERROR, STATUS_OK, STATUS_PANIC};
use crate::{PARAM_REAL, TensorV1};
pub use amk_core::DType;
use half::{bf16, f16};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A read-only input tensor.
#[derive(Debug, Clone, Copy)]
pub struct PluginTensor<'a> {
    /// Element type (`None` for a code this build does not know).
    pub dtype: Option<DType>,
    /// Extents, outermost first.
    pub shape: &'a [u64],
    /// Little-endian element bytes.
    pub data: &'a [u8],
}

/// A writable output tensor.
#[derive(Debug)]
pub struct PluginTensorMut<'a> {
    /// Element type (`None` for a code this build does not know).
    pub dtype: Option<DType>,
    /// Extents, outermost first.
    pub shape: &'a [u64],
    /// Little-endian element bytes.
    pub data: &'a mut [u8],
}

/// A float element type the helpers below read and write (fp32 math, cast on store).
fn float_width(dtype: Option<DType>) -> Option<usize> {
    match dtype? {
        DType::F32 => Some(4),
        DType::F16 | DType::BF16 => Some(2),
        _ => None,
    }
}

/// Number of elements of `shape` (`None` on overflow).
fn numel(shape: &[u64]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

impl PluginTensor<'_> {
    /// Number of elements (`None` on overflow).
    pub fn numel(&self) -> Option<usize> {
        numel(self.shape)
    }
    /// Element `i` as f32, for F32/F16/BF16 tensors (`None` for other dtypes or out of range).
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        let w = float_width(self.dtype)?;
        let b = self
            .data
            .get(i.checked_mul(w)?..i.checked_mul(w)?.checked_add(w)?)?;
        Some(match (self.dtype?, b) {
            (DType::F32, &[a, b, c, d]) => f32::from_le_bytes([a, b, c, d]),
            (DType::F16, &[a, b]) => f16::from_le_bytes([a, b]).to_f32(),
            (DType::BF16, &[a, b]) => bf16::from_le_bytes([a, b]).to_f32(),
            _ => return None,
        })
    }
}

impl PluginTensorMut<'_> {
    /// Number of elements (`None` on overflow).
    pub fn numel(&self) -> Option<usize> {
        numel(self.shape)
    }
    /// Stores `x` into element `i` (round to nearest even for F16/BF16); `false` for other
    /// dtypes or out of range.
    pub fn set_f32(&mut self, i: usize, x: f32) -> bool {
        let Some(w) = float_width(self.dtype) else {
            return false;
        };
        let Some(range) = i.checked_mul(w).and_then(|s| Some(s..s.checked_add(w)?)) else {
            return false;
        };
        let Some(slot) = self.data.get_mut(range) else {
            return false;
        };
        match self.dtype {
            Some(DType::F32) => slot.copy_from_slice(&x.to_le_bytes()),
            Some(DType::F16) => slot.copy_from_slice(&f16::from_f32(x).to_le_bytes()),
            Some(DType::BF16) => slot.copy_from_slice(&bf16::from_f32(x).to_le_bytes()),
            _ => return false,
        }
        true
    }
}

/// A task param as the plugin sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamValue {
    /// An integer.
    Int(i64),
    /// A real.
    Real(f64),
}

/// One reference call, as safe slices.
#[derive(Debug)]
pub struct PluginCall<'a> {
    /// Inputs, in task order.
    pub inputs: Vec<PluginTensor<'a>>,
    /// Outputs, in task order.
    pub outputs: Vec<PluginTensorMut<'a>>,
    /// The task's integer and real params.
    pub params: Vec<(&'a str, ParamValue)>,
}

impl PluginCall<'_> {
    /// The param `key`, if the task carries it.
    pub fn param(&self, key: &str) -> Option<ParamValue> {
        self.params.iter().find(|(k, _)| *k == key).map(|&(_, v)| v)
    }
    /// A real param (integers accepted).
    pub fn real(&self, key: &str) -> Option<f64> {
        match self.param(key)? {
            ParamValue::Int(i) => Some(i as f64),
            ParamValue::Real(r) => Some(r),
        }
    }
    /// An integer param.
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.param(key)? {
            ParamValue::Int(i) => Some(i),
            ParamValue::Real(_) => None,
        }
    }
}

/// A plugin op's reference in safe Rust; an `Err` message reaches the host's error.
pub type PluginFn = fn(&mut PluginCall<'_>) -> Result<(), String>;

/// Writes `msg` into the host's error buffer (truncated at a char boundary, NUL-terminated
/// when there is room).
fn write_error(err: *mut u8, err_cap: usize, msg: &str) {
    if err.is_null() || err_cap == 0 {
        return;
    }
    let mut n = msg.len().min(err_cap);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    #[allow(unsafe_code)]
    // SAFETY: the host passes a writable buffer of `err_cap` bytes (checked non-null above);
    // `n <= err_cap` and the NUL is written only when `n < err_cap`.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err, n);
        if n < err_cap {
            *err.add(n) = 0;
        }
    }
}

/// A slice from a raw pointer and count; a null pointer is only accepted for zero elements.
///
/// # Safety
/// A non-null `ptr` must point to `n` valid, initialised `T`s that stay valid for `'a`.
#[allow(unsafe_code)]
unsafe fn raw_slice<'a, T>(ptr: *const T, n: usize) -> Result<&'a [T], String> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err("null pointer with a non-zero count".into());
    }
    // SAFETY: non-null, and the caller guarantees `n` valid elements for `'a`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// The name of a param.
///
/// # Safety
/// As [`raw_slice`] for the string's bytes.
#[allow(unsafe_code)]
unsafe fn raw_str<'a>(s: AmkStr) -> Result<&'a str, String> {
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { raw_slice(s.ptr, s.len)? };
    std::str::from_utf8(bytes).map_err(|_| "a param name is not UTF-8".into())
}

/// Builds the safe view of a call.
///
/// # Safety
/// `args` must satisfy the [`crate::CpuReferenceFnV1`] contract.
#[allow(unsafe_code)]
unsafe fn view<'a>(args: *const CpuArgsV1) -> Result<PluginCall<'a>, String> {
    if args.is_null() {
        return Err("null arguments".into());
    }
    // SAFETY: non-null and valid for the call (host contract).
    let a: &'a CpuArgsV1 = unsafe { &*args };
    if a.struct_size as usize != std::mem::size_of::<CpuArgsV1>() {
        return Err(format!(
            "argument struct is {} bytes, this plugin expects {}",
            a.struct_size,
            std::mem::size_of::<CpuArgsV1>()
        ));
    }
    // SAFETY: the host passes `n_inputs` / `n_outputs` / `n_params` valid entries.
    let (ins, outs, params): (&[TensorV1], &[TensorV1], &[ParamV1]) = unsafe {
        (
            raw_slice(a.inputs, a.n_inputs)?,
            raw_slice(a.outputs, a.n_outputs)?,
            raw_slice(a.params, a.n_params)?,
        )
    };
    let dtype = |t: &TensorV1| u8::try_from(t.dtype).ok().and_then(DType::from_code);
    let mut call = PluginCall {
        inputs: Vec::with_capacity(ins.len()),
        outputs: Vec::with_capacity(outs.len()),
        params: Vec::with_capacity(params.len()),
    };
    for t in ins {
        // SAFETY: each tensor's shape has `rank` entries and data `nbytes` bytes (host
        // contract); inputs are only read.
        let (shape, data) = unsafe {
            (
                raw_slice(t.shape, t.rank as usize)?,
                raw_slice(t.data.cast_const(), t.nbytes)?,
            )
        };
        call.inputs.push(PluginTensor {
            dtype: dtype(t),
            shape,
            data,
        });
    }
    for t in outs {
        // SAFETY: as for inputs; each output's data is a distinct writable buffer of `nbytes`
        // bytes that nothing else accesses during the call.
        let (shape, data) = unsafe {
            let shape = raw_slice(t.shape, t.rank as usize)?;
            let data: &mut [u8] = if t.nbytes == 0 {
                &mut []
            } else if t.data.is_null() {
                return Err("null output data".into());
            } else {
                std::slice::from_raw_parts_mut(t.data, t.nbytes)
            };
            (shape, data)
        };
        call.outputs.push(PluginTensorMut {
            dtype: dtype(t),
            shape,
            data,
        });
    }
    for p in params {
        // SAFETY: names are valid strings for the call (host contract).
        let name = unsafe { raw_str(p.name)? };
        let value = match p.ty {
            PARAM_INT => ParamValue::Int(p.int_value),
            PARAM_REAL => ParamValue::Real(p.real_value),
            _ => continue,
        };
        call.params.push((name, value));
    }
    Ok(call)
}

/// Runs `f` over the call `args` with every panic caught: returns [`STATUS_OK`],
/// [`STATUS_ERROR`] (with `f`'s message) or [`STATUS_PANIC`] (with the panic's message), and
/// never unwinds. This is what [`crate::cpu_reference!`] expands to.
///
/// # Safety
/// `args`, `err` and `err_cap` must satisfy the [`crate::CpuReferenceFnV1`] contract.
#[allow(unsafe_code)]
pub unsafe fn run_cpu_reference(
    args: *const CpuArgsV1,
    err: *mut u8,
    err_cap: usize,
    f: PluginFn,
) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded from the caller.
        let mut call = unsafe { view(args)? };
        f(&mut call)
    }));
    match outcome {
        Ok(Ok(())) => STATUS_OK,
        Ok(Err(msg)) => {
            write_error(err, err_cap, &msg);
            STATUS_ERROR
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown payload".into());
            write_error(err, err_cap, &format!("panic in plugin: {what}"));
            STATUS_PANIC
        }
    }
}

/// Wraps a [`PluginFn`] into an `unsafe extern "C"` function of type
/// [`crate::CpuReferenceFnV1`] that catches panics:
/// `amk_plugin_abi::cpu_reference!(gelu_tanh_c => gelu_tanh);`
#[macro_export]
macro_rules! cpu_reference {
    ($vis:vis $name:ident => $f:path) => {
        /// C entry of a CPU reference (generated by `amk_plugin_abi::cpu_reference!`).
        ///
        /// # Safety
        /// The host's `CpuReferenceFnV1` contract.
        #[allow(unsafe_code)]
        $vis unsafe extern "C" fn $name(
            args: *const $crate::CpuArgsV1,
            err: *mut u8,
            err_cap: usize,
        ) -> i32 {
            // SAFETY: the caller (the host) upholds the `CpuReferenceFnV1` contract.
            unsafe { $crate::plugin::run_cpu_reference(args, err, err_cap, $f) }
        }
    };
}

/// Exports the entry symbol `amk_plugin_entry_v1` returning the given descriptor (a constant
/// expression of type [`crate::PluginDescriptorV1`]): `amk_plugin_abi::export_plugin!(DESC);`
#[macro_export]
macro_rules! export_plugin {
    ($desc:expr) => {
        /// The amk plugin entry point, ABI version 1 (generated by
        /// `amk_plugin_abi::export_plugin!`).
        // `no_mangle` is what makes the symbol findable by the host.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub extern "C" fn amk_plugin_entry_v1() -> *const $crate::PluginDescriptorV1 {
            static DESCRIPTOR: $crate::PluginDescriptorV1 = $desc;
            &DESCRIPTOR
        }
    };
}
