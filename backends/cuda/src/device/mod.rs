//! The backend proper (`cuda` feature): the device, the compiled megakernel, sessions.
#![allow(unsafe_code)]

mod driver;
pub mod jitlink;
mod load;
pub mod nvrtc;
mod report;
mod session;
mod synth;

pub use session::{CudaSession, WeightSource};

use crate::assemble::{Knobs, Megakernel, megakernel_source};
use crate::{CudaError, CudaOptions, DeviceInfo, arch_for};
use amk_core::ir::Program;
use amk_core::{Backend, BackendError, Registry, Session, ValidatedProgram, WeightStore};
use cudarc::driver::{CudaContext, sys};
use driver::{Module, drv};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Whether libcuda can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// The CUDA backend: one device context, and the megakernels compiled for it (one per
/// distinct registry, cached in memory and on disk).
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    options: CudaOptions,
    smem_optin: usize,
    cache_dir: PathBuf,
    modules: Mutex<HashMap<String, Arc<Module>>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.inner.info)
            .finish()
    }
}

impl CudaBackend {
    /// Opens device `options.device`. Checks, in order and without panicking: the driver
    /// library, NVRTC, a device, the ordinal, cooperative launch and mapped host memory.
    pub fn new(options: CudaOptions) -> Result<Self, CudaError> {
        if !driver_present() {
            return Err(CudaError::DriverMissing);
        }
        if !nvrtc::nvrtc_present() {
            return Err(CudaError::NvrtcMissing);
        }
        let count = std::panic::catch_unwind(CudaContext::device_count)
            .map_err(|_| CudaError::DriverMissing)?
            .map_err(drv("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(CudaError::NoDevice);
        }
        if options.device >= count as usize {
            return Err(CudaError::DeviceOrdinal {
                ordinal: options.device,
                count: count as usize,
            });
        }
        let ctx = std::panic::catch_unwind(|| CudaContext::new(options.device))
            .map_err(|_| CudaError::DriverMissing)?
            .map_err(drv("cuCtxCreate"))?;
        let attr = |a: sys::CUdevice_attribute, call| ctx.attribute(a).map_err(drv(call));
        use sys::CUdevice_attribute as A;
        let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        let cc = ctx
            .compute_capability()
            .map_err(drv("cuDeviceComputeCapability"))?;
        let sms = attr(
            A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "cuDeviceGetAttribute",
        )?;
        let coop = attr(
            A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            "cuDeviceGetAttribute",
        )?;
        let map = attr(
            A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
            "cuDeviceGetAttribute",
        )?;
        let smem_optin = attr(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "cuDeviceGetAttribute",
        )?;
        let memory = ctx.total_mem().map_err(drv("cuDeviceTotalMem"))?;
        let unsuitable = |why: &str| CudaError::DeviceUnsuitable {
            device: name.clone(),
            why: why.into(),
        };
        if coop != 1 {
            return Err(unsuitable("no cooperative launch"));
        }
        if map != 1 {
            return Err(unsuitable(
                "cannot map host memory (needed for the abort flag)",
            ));
        }
        let info = DeviceInfo {
            name: name.clone(),
            compute_capability: cc,
            sms: sms.max(1) as usize,
            arch: arch_for(cc),
            memory,
        };
        let cache_dir = options
            .cache_dir
            .clone()
            .unwrap_or_else(nvrtc::default_cache_dir);
        Ok(CudaBackend {
            inner: Arc::new(Inner {
                ctx,
                info,
                options,
                smem_optin: smem_optin.max(0) as usize,
                cache_dir,
                modules: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Opens the default device and says what it is.
    pub fn probe() -> Result<DeviceInfo, CudaError> {
        Ok(Self::new(CudaOptions::default())?.inner.info.clone())
    }

    /// The device.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The options this backend was opened with.
    pub fn options(&self) -> &CudaOptions {
        &self.inner.options
    }

    /// The megakernel of `registry` for this device and `program` (only the code it can run,
    /// [`CudaOptions::knobs`]; with the trace points when `trace`): assembled, compiled (or
    /// read from the cache) and loaded once per distinct source.
    pub(crate) fn module_for(
        &self,
        registry: &Registry,
        program: &Program,
        trace: bool,
    ) -> Result<(Arc<Module>, Megakernel), CudaError> {
        let mk = kernel_source(&self.inner.options, registry, Some(program), trace)?;
        let key = nvrtc::cache_key(
            &mk.source,
            &nvrtc::options(&self.inner.info.arch, mk.linkage()),
        )?;
        let mut modules = self
            .inner
            .modules
            .lock()
            .map_err(|_| CudaError::ContextLost("module cache lock poisoned".into()))?;
        if let Some(m) = modules.get(&key) {
            return Ok((m.clone(), mk));
        }
        let cubin = nvrtc::compile_cached(
            &mk.source,
            &self.inner.info.arch,
            mk.linkage(),
            Some(&self.inner.cache_dir),
        )?;
        let module = match Module::load(&self.inner.ctx, &cubin) {
            Ok(m) => m,
            Err(_) => {
                // A stale or damaged cache entry: compile afresh.
                let cubin =
                    nvrtc::compile_cached(&mk.source, &self.inner.info.arch, mk.linkage(), None)?;
                Module::load(&self.inner.ctx, &cubin)?
            }
        };
        let module = Arc::new(module);
        modules.insert(key, module.clone());
        Ok((module, mk))
    }

    /// Loads a validated program with its weights.
    pub fn load_session(
        &self,
        program: &ValidatedProgram,
        weights: &WeightStore,
        registry: &Registry,
    ) -> Result<CudaSession, CudaError> {
        CudaSession::load(
            self,
            program.program(),
            program.id(),
            WeightSource::Store(weights),
            registry,
            &program.result().carried_reads,
            None,
        )
    }

    /// Loads a validated program whose weights are generated on the device from `synth`
    /// (every WEIGHT/CONST buffer needs an init there): no host tensors, no upload.
    pub fn load_session_synthetic(
        &self,
        program: &ValidatedProgram,
        synth: &amk_core::synth::SyntheticWeights,
        registry: &Registry,
    ) -> Result<CudaSession, CudaError> {
        CudaSession::load(
            self,
            program.program(),
            program.id(),
            WeightSource::Synthetic(synth),
            registry,
            &program.result().carried_reads,
            None,
        )
    }
}

/// A read-only streaming kernel for [`CudaBackend::read_bandwidth`]: 16-byte loads, grid-stride,
/// an XOR the compiler cannot drop.
const READ_BW_SOURCE: &str = r#"
extern "C" __global__ void amk_read_bw(const uint4* __restrict__ p, long long n,
                                       unsigned int* sink) {
  unsigned int acc = 0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
"#;

impl CudaBackend {
    /// This device's read bandwidth in bytes/s: the median of `reps` passes of a streaming
    /// kernel over `bytes` of random (never zero) data, timed with device events. It is the
    /// floor's denominator for performance reports (bytes a forward pass must read / this).
    pub fn read_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64, CudaError> {
        let ctx = &self.inner.ctx;
        let cubin = nvrtc::compile_cached(
            READ_BW_SOURCE,
            &self.inner.info.arch,
            nvrtc::Linkage::WholeProgram,
            Some(&self.inner.cache_dir),
        )?;
        let k = driver::Kernel::load(ctx, &cubin, "amk_read_bw")?;
        let n16 = (bytes / 16).max(1);
        let mut host = vec![0u8; n16 * 16];
        let mut s = 0x243f_6a88_85a3_08d3u64;
        for c in host.chunks_mut(8) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            c.copy_from_slice(&(s | 1).to_le_bytes()[..c.len()]);
        }
        let data = driver::DeviceMem::from_slice(ctx, &host)?;
        drop(host);
        let sink = driver::DeviceMem::zeroed(ctx, 4)?;
        let (start, end) = (driver::Event::new(ctx)?, driver::Event::new(ctx)?);
        let grid = (self.inner.info.sms * 8) as u32;
        let mut times = Vec::with_capacity(reps);
        for i in 0..reps + 3 {
            let (mut p, mut n, mut q) = (data.ptr(), n16 as i64, sink.ptr());
            let mut params = [
                &mut p as *mut _ as *mut std::ffi::c_void,
                &mut n as *mut _ as *mut std::ffi::c_void,
                &mut q as *mut _ as *mut std::ffi::c_void,
            ];
            start.record()?;
            // SAFETY: (const uint4*, long long, unsigned int*) — two live device pointers.
            unsafe { k.launch(grid, 512, &mut params)? };
            end.record()?;
            end.wait()?;
            if i >= 3 {
                times.push(start.elapsed_ms(&end)? as f64);
            }
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        Ok((n16 * 16) as f64 / (ms * 1e-3))
    }
}

/// The megakernel source a session with `options` runs `program` on (`None`: the kernel of
/// every op), with its trace points when `trace`: one function for the session and for
/// [`precompile`], so that a precompiled cubin's cache key is the session's.
fn kernel_source(
    options: &CudaOptions,
    registry: &Registry,
    program: Option<&Program>,
    trace: bool,
) -> Result<Megakernel, CudaError> {
    let mut knobs = options.knobs(program, registry);
    knobs.trace = trace;
    megakernel_source(registry, knobs).map_err(CudaError::Layout)
}

/// Compiles the megakernel of `registry` for `arch` (e.g. `sm_90a`) into the cubin cache
/// (`cache_dir`, else [`nvrtc::default_cache_dir`]) with no device, exactly as a session on a
/// GPU of that architecture would with `options` (same source, same options, same key), so
/// that the first run there loads it instead of compiling for minutes. `program`: the program
/// it is for (a kernel holds only its ops and loops, [`CudaOptions::knobs`]); `None`, the
/// kernel of every op. `trace`: the kernel with its trace points, which a traced session loads
/// (`amk bench --trace`). Returns the cubin's path, its size, and whether it was already cached.
pub fn precompile(
    options: &CudaOptions,
    registry: &Registry,
    arch: &str,
    cache_dir: Option<&std::path::Path>,
    program: Option<&Program>,
    trace: bool,
) -> Result<(std::path::PathBuf, usize, bool), CudaError> {
    let dir = cache_dir.map_or_else(nvrtc::default_cache_dir, std::path::Path::to_path_buf);
    let mk = kernel_source(options, registry, program, trace)?;
    let key = nvrtc::cache_key(&mk.source, &nvrtc::options(arch, mk.linkage()))?;
    let path = dir.join(format!("{key}.{arch}.cubin"));
    let cached = path.is_file();
    let cubin = nvrtc::compile_cached(&mk.source, arch, mk.linkage(), Some(&dir))?;
    Ok((path, cubin.len(), cached))
}

/// Compiles the megakernel of `registry` for `arch` (e.g. `sm_80`) with no device: what
/// NVRTC alone can check. Bypasses the cache.
pub fn compile_for_arch(
    registry: &Registry,
    arch: &str,
    knobs: Knobs,
) -> Result<Vec<u8>, CudaError> {
    let mk = megakernel_source(registry, knobs).map_err(CudaError::Layout)?;
    nvrtc::compile_cached(&mk.source, arch, mk.linkage(), None)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn load(
        &self,
        program: &ValidatedProgram,
        weights: &WeightStore,
        registry: &Registry,
    ) -> Result<Box<dyn Session>, BackendError> {
        Ok(Box::new(self.load_session(program, weights, registry)?))
    }
}
