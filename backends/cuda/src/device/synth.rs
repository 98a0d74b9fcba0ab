//! Synthetic weights generated on the device (`amk_core::synth`'s formula, bit for bit), so a
//! benchmark of an 8B shape needs no host tensors and no upload; and output poisoning.

use super::CudaBackend;
use super::driver::{Kernel, drv};
use crate::CudaError;
use crate::device::nvrtc;
use amk_core::DType;
use amk_core::synth::Init;

/// Grid-stride fill with `amk_core::synth::value`: SplitMix64 finaliser, 24-bit uniform,
/// `center + scale·u` with two explicit roundings (no FMA), round to bf16 (ties to even), then
/// stored as F32 (exact), BF16 (exact) or F16 (`cvt.rn`).
const SOURCE: &str = r#"
extern "C" __global__ void amk_synth_fill(void* out, long long n, int dtype,
                                          unsigned long long ts, float center, float scale) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    unsigned long long z = ts + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = (float)((int)(z >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
    const float v = __fadd_rn(center, __fmul_rn(scale, u));
    unsigned int b = __float_as_uint(v);
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    if (dtype == 0) {
      ((unsigned int*)out)[i] = b;
    } else if (dtype == 2) {
      ((unsigned short*)out)[i] = (unsigned short)(b >> 16);
    } else {
      unsigned short h;
      asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(__uint_as_float(b)));
      ((unsigned short*)out)[i] = h;
    }
  }
}
"#;

/// The ABI dtype code the fill kernel takes (0 F32, 1 F16, 2 BF16).
fn code(dtype: DType) -> Result<i32, CudaError> {
    match dtype {
        DType::F32 => Ok(0),
        DType::F16 => Ok(1),
        DType::BF16 => Ok(2),
        other => Err(CudaError::Layout(format!(
            "synthetic values are float; a {other} buffer cannot hold them"
        ))),
    }
}

impl CudaBackend {
    fn synth_kernel(&self) -> Result<Kernel, CudaError> {
        let inner = &self.inner;
        let cubin = nvrtc::compile_cached(
            SOURCE,
            &inner.info.arch,
            nvrtc::Linkage::WholeProgram,
            Some(&inner.cache_dir),
        )?;
        Kernel::load(&inner.ctx, &cubin, "amk_synth_fill")
    }

    /// Fills `n` elements of `dtype` at device address `ptr` with the synthetic tensor whose
    /// seed is `ts` (`amk_core::synth::tensor_seed`), and waits for it.
    pub(crate) fn synth_fill(
        &self,
        ptr: u64,
        n: u64,
        dtype: DType,
        ts: u64,
        init: Init,
    ) -> Result<(), CudaError> {
        let k = self.synth_kernel()?;
        let (mut p, mut n, mut dt, mut ts, mut c, mut s) =
            (ptr, n as i64, code(dtype)?, ts, init.center, init.scale);
        let mut params = [
            &mut p as *mut _ as *mut std::ffi::c_void,
            &mut n as *mut _ as *mut std::ffi::c_void,
            &mut dt as *mut _ as *mut std::ffi::c_void,
            &mut ts as *mut _ as *mut std::ffi::c_void,
            &mut c as *mut _ as *mut std::ffi::c_void,
            &mut s as *mut _ as *mut std::ffi::c_void,
        ];
        let grid = (self.inner.info.sms * 8) as u32;
        // SAFETY: (void*, long long, int, unsigned long long, float, float); `ptr` holds `n`
        // elements of `dtype` (the callers size it from the buffer).
        unsafe { k.launch(grid, 256, &mut params)? };
        self.inner
            .ctx
            .synchronize()
            .map_err(drv("cuCtxSynchronize"))
    }
}
