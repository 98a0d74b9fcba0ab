//! The backend proper (`cuda` feature): the device, the compiled megakernel, sessions.
#![allow(unsafe_code)]

mod driver;
pub mod nvrtc;
mod session;

pub use session::CudaSession;

use crate::assemble::{Knobs, Megakernel, megakernel_source};
use crate::{CudaError, CudaOptions, DeviceInfo, arch_for};
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
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "cuDeviceGetAttribute")?;
        let coop = attr(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, "cuDeviceGetAttribute")?;
        let map = attr(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, "cuDeviceGetAttribute")?;
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
            return Err(unsuitable("cannot map host memory (needed for the abort flag)"));
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

    /// The megakernel of `registry` for this device: assembled, compiled (or read from the
    /// cache) and loaded once per distinct source.
    pub(crate) fn module_for(
        &self,
        registry: &Registry,
    ) -> Result<(Arc<Module>, Megakernel), CudaError> {
        let mk = megakernel_source(
            registry,
            Knobs {
                threads: self.inner.options.threads,
            },
        )
        .map_err(CudaError::Layout)?;
        let key = nvrtc::cache_key(&mk.source, &nvrtc::options(&self.inner.info.arch))?;
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
            Some(&self.inner.cache_dir),
        )?;
        let module = match Module::load(&self.inner.ctx, &cubin) {
            Ok(m) => m,
            Err(_) => {
                // A stale or damaged cache entry: compile afresh.
                let cubin = nvrtc::compile_cached(&mk.source, &self.inner.info.arch, None)?;
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
        CudaSession::load(self, program.program(), program.id(), weights, registry)
    }
}

/// Compiles the megakernel of `registry` for `arch` (e.g. `sm_80`) with no device: what
/// NVRTC alone can check. Bypasses the cache.
pub fn compile_for_arch(
    registry: &Registry,
    arch: &str,
    knobs: Knobs,
) -> Result<Vec<u8>, CudaError> {
    let mk = megakernel_source(registry, knobs).map_err(CudaError::Layout)?;
    nvrtc::compile_cached(&mk.source, arch, None)
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
