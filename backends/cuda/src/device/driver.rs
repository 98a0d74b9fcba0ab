//! Thin RAII wrappers over the CUDA driver calls the backend makes. cudarc's safe layer
//! tracks streams and events per allocation; the megakernel needs none of that (one launch
//! at a time, a handful of long-lived allocations), so it goes through the result layer.
#![allow(unsafe_code)]

use crate::CudaError;
use cudarc::driver::result::DriverError;
use cudarc::driver::{CudaContext, result, sys};
use std::ffi::c_void;
use std::sync::Arc;

/// Maps a driver error to ours, naming the call.
pub fn drv(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e: DriverError| CudaError::Driver {
        call,
        message: describe(&e),
    }
}

/// `NAME: text` of a driver error.
pub fn describe(e: &DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}: {text}")
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub struct DeviceMem {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceMem {
    /// `bytes` of device memory (at least 1), zeroed.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let bytes = bytes.max(1);
        // SAFETY: plain allocation in the bound context.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(drv("cuMemAlloc"))?;
        let m = DeviceMem {
            ctx: ctx.clone(),
            ptr,
            bytes,
        };
        // SAFETY: `ptr` owns `bytes` bytes.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(drv("cuMemsetD8"))?;
        Ok(m)
    }

    /// Device memory holding a copy of `data`.
    pub fn from_slice<T: bytemuck::Pod>(
        ctx: &Arc<CudaContext>,
        data: &[T],
    ) -> Result<Self, CudaError> {
        let m = Self::zeroed(ctx, std::mem::size_of_val(data))?;
        m.write(0, bytemuck::cast_slice(data))?;
        Ok(m)
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The context this memory belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies `data` to byte `offset` (synchronous).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), CudaError> {
        if data.is_empty() {
            return Ok(());
        }
        if offset
            .checked_add(data.len())
            .is_none_or(|e| e > self.bytes)
        {
            return Err(CudaError::Layout(format!(
                "write of {} bytes at {offset} overruns a {}-byte allocation",
                data.len(),
                self.bytes
            )));
        }
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the destination range lies inside this allocation (checked above).
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, data) }
            .map_err(drv("cuMemcpyHtoD"))
    }

    /// Copies `out.len()` bytes from byte `offset` (synchronous).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        if out.is_empty() {
            return Ok(());
        }
        if offset.checked_add(out.len()).is_none_or(|e| e > self.bytes) {
            return Err(CudaError::Layout(format!(
                "read of {} bytes at {offset} overruns a {}-byte allocation",
                out.len(),
                self.bytes
            )));
        }
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the source range lies inside this allocation (checked above).
        unsafe { result::memcpy_dtoh_sync(out, self.ptr + offset as u64) }
            .map_err(drv("cuMemcpyDtoH"))
    }

    /// Zeroes the whole allocation (synchronous).
    pub fn zero(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `ptr` owns `bytes` bytes.
        unsafe { result::memset_d8_sync(self.ptr, 0, self.bytes) }.map_err(drv("cuMemsetD8"))
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory mapped into the device's address space: what the host writes
/// while a kernel runs (the watchdog's abort flag, a loop's cancel word) the kernel sees, and
/// what the kernel writes (a loop's progress, streamed tokens) the host sees.
#[derive(Debug)]
pub struct MappedMem {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    dev: sys::CUdeviceptr,
    bytes: usize,
}

// SAFETY: the pointer is owned by this value and only accessed through volatile reads and
// writes inside its bounds; the driver allocation is process-wide.
unsafe impl Send for MappedMem {}

impl MappedMem {
    /// `bytes` (at least 64) of mapped memory, zeroed.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let bytes = bytes.max(64).next_multiple_of(64);
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: allocates `bytes` of pinned, mapped host memory.
        let host = unsafe { result::malloc_host(bytes, flags) }.map_err(drv("cuMemHostAlloc"))?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; valid out-pointer.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
        let m = MappedMem {
            ctx: ctx.clone(),
            host,
            dev,
            bytes,
        };
        r.result().map_err(drv("cuMemHostGetDevicePointer"))?;
        m.write(0, &vec![0u8; bytes])?;
        Ok(m)
    }
    /// The device address.
    pub fn dev_ptr(&self) -> u64 {
        self.dev
    }
    /// Writes the `i32` at word `i` (visible to a running kernel). Out of range: ignored.
    pub fn set(&self, i: usize, v: i32) {
        if (i + 1) * 4 <= self.bytes {
            // SAFETY: in bounds (checked), 4-byte aligned (the allocation is page-aligned).
            unsafe { std::ptr::write_volatile((self.host as *mut i32).add(i), v) };
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
    /// Reads the `i32` at word `i` (what a running kernel wrote). Out of range: 0.
    pub fn get(&self, i: usize) -> i32 {
        if (i + 1) * 4 > self.bytes {
            return 0;
        }
        // SAFETY: in bounds (checked), 4-byte aligned.
        let v = unsafe { std::ptr::read_volatile((self.host as *const i32).add(i)) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        v
    }
    /// Copies `data` to byte `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), CudaError> {
        let end = offset.checked_add(data.len()).filter(|&e| e <= self.bytes);
        if end.is_none() {
            return Err(CudaError::Layout(format!(
                "write of {} bytes at {offset} overruns {} bytes of mapped memory",
                data.len(),
                self.bytes
            )));
        }
        for (k, &b) in data.iter().enumerate() {
            // SAFETY: `offset + k` is inside the allocation (checked above).
            unsafe { std::ptr::write_volatile((self.host as *mut u8).add(offset + k), b) };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    /// Copies `out.len()` bytes from byte `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let end = offset.checked_add(out.len()).filter(|&e| e <= self.bytes);
        if end.is_none() {
            return Err(CudaError::Layout(format!(
                "read of {} bytes at {offset} overruns {} bytes of mapped memory",
                out.len(),
                self.bytes
            )));
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        for (k, b) in out.iter_mut().enumerate() {
            // SAFETY: `offset + k` is inside the allocation (checked above).
            *b = unsafe { std::ptr::read_volatile((self.host as *const u8).add(offset + k)) };
        }
        Ok(())
    }
}

impl Drop for MappedMem {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host, freed once.
            let _ = unsafe { result::free_host(self.host) };
        }
    }
}

/// A CUDA event, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<CudaContext>,
    ev: sys::CUevent,
}

// SAFETY: a driver handle owned by this value; the driver API is thread-safe.
unsafe impl Send for Event {}

impl Event {
    /// A timing event.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(drv("cuEventCreate"))?;
        Ok(Event {
            ctx: ctx.clone(),
            ev,
        })
    }
    /// Records the event on the null stream.
    pub fn record(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: a live event on the null stream.
        unsafe { result::event::record(self.ev, std::ptr::null_mut()) }
            .map_err(drv("cuEventRecord"))
    }
    /// `Ok(true)` once the work before the event finished, `Ok(false)` while it runs, an
    /// error if the device failed.
    pub fn done(&self) -> Result<bool, DriverError> {
        // SAFETY: a live event.
        match unsafe { result::event::query(self.ev) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }
    /// Blocks until the event completes.
    pub fn wait(&self) -> Result<(), CudaError> {
        // SAFETY: a live event.
        unsafe { result::event::synchronize(self.ev) }.map_err(drv("cuEventSynchronize"))
    }
    /// Milliseconds from `self` to `end` (both complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        // SAFETY: two live, completed events of one context.
        unsafe { result::event::elapsed(self.ev, end.ev) }.map_err(drv("cuEventElapsedTime"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by event::create, destroyed once.
            let _ = unsafe { result::event::destroy(self.ev) };
        }
    }
}

/// A loaded cubin and its two kernels.
#[derive(Debug)]
pub struct Module {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    /// The megakernel.
    pub kernel: sys::CUfunction,
    /// The param-patch scatter kernel.
    pub patch: sys::CUfunction,
    /// Registers per thread of the megakernel.
    pub regs: i32,
    /// Local memory (stack) per thread of the megakernel, bytes.
    pub local_bytes: i32,
    /// Static shared memory per block of the megakernel (bytes; -1 if the driver did not say).
    pub static_smem: i32,
}

// SAFETY: driver handles owned by this value; the driver API is thread-safe.
unsafe impl Send for Module {}
// SAFETY: as above; functions are only read after load.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `cubin` and looks up the kernels.
    pub fn load(ctx: &Arc<CudaContext>, cubin: &[u8]) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // The driver reads an ELF image through a bare pointer: hand it an owned, padded copy.
        let mut image = cubin.to_vec();
        image.extend_from_slice(&[0u8; 16]);
        // SAFETY: `image` is a complete cubin (NVRTC output) that outlives the call.
        let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(drv("cuModuleLoadData"))?;
        let mut m = Module {
            ctx: ctx.clone(),
            module,
            kernel: std::ptr::null_mut(),
            patch: std::ptr::null_mut(),
            regs: 0,
            local_bytes: 0,
            static_smem: 0,
        };
        let name = |s: &str| std::ffi::CString::new(s).unwrap_or_default();
        // SAFETY: live module; names are NUL-free literals.
        m.kernel =
            unsafe { result::module::get_function(module, name(crate::assemble::KERNEL_NAME)) }
                .map_err(drv("cuModuleGetFunction"))?;
        // SAFETY: as above.
        m.patch = unsafe {
            result::module::get_function(module, name(crate::assemble::PATCH_KERNEL_NAME))
        }
        .map_err(drv("cuModuleGetFunction"))?;
        // SAFETY: live function handle.
        unsafe {
            m.regs = result::function::get_function_attribute(
                m.kernel,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
            )
            .unwrap_or(-1);
            m.local_bytes = result::function::get_function_attribute(
                m.kernel,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            )
            .unwrap_or(-1);
            m.static_smem = result::function::get_function_attribute(
                m.kernel,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            )
            .unwrap_or(-1);
        }
        Ok(m)
    }

    /// Static shared memory per block; when the driver did not say, a generous guess (16 KiB),
    /// so that a launch whose static and dynamic shared memory pass 48 KiB still opts in.
    pub fn static_smem(&self) -> usize {
        usize::try_from(self.static_smem).unwrap_or(16 << 10)
    }

    /// Allows `bytes` of dynamic shared memory per block of the megakernel.
    pub fn set_max_dynamic_smem(&self, bytes: usize) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: live function handle.
        unsafe {
            result::function::set_function_attribute(
                self.kernel,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(drv("cuFuncSetAttribute"))
    }

    /// Co-resident megakernel blocks per SM at `threads` and `smem` bytes.
    pub fn occupancy(&self, threads: u32, smem: usize) -> Result<usize, CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: live function handle.
        let n = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                self.kernel,
                threads as i32,
                smem,
            )
        }
        .map_err(drv("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        Ok(n.max(0) as usize)
    }

    /// Cooperative launch of the megakernel with `prog` by value, on the null stream.
    pub fn launch(
        &self,
        prog: &crate::abi::AmkDeviceProgram,
        grid: u32,
        threads: u32,
        smem: u32,
    ) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut arg = *prog;
        let mut params = [&mut arg as *mut _ as *mut c_void];
        // SAFETY: the kernel takes exactly one by-value amk_device_program_t, whose layout
        // `AmkDeviceProgram` mirrors (asserted); the driver copies it at launch.
        unsafe {
            result::launch_cooperative_kernel(
                self.kernel,
                (grid, 1, 1),
                (threads, 1, 1),
                smem,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(drv("cuLaunchCooperativeKernel"))
    }

    /// Launches the patch scatter: `n` records from `recs` to the instruction table, each
    /// rewritten task marked unverified in `verified` (one i32 per task).
    pub fn launch_patch(
        &self,
        instructions: u64,
        ids: u64,
        recs: u64,
        n: i32,
        verified: u64,
    ) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let (mut a, mut b, mut c, mut d, mut e) = (instructions, ids, recs, n, verified);
        let mut params = [
            &mut a as *mut _ as *mut c_void,
            &mut b as *mut _ as *mut c_void,
            &mut c as *mut _ as *mut c_void,
            &mut d as *mut _ as *mut c_void,
            &mut e as *mut _ as *mut c_void,
        ];
        let words = n as u64 * (std::mem::size_of::<crate::abi::AmkInstruction>() as u64 / 4);
        let grid = words.div_ceil(256).clamp(1, 1024) as u32;
        // SAFETY: matches `amk_apply_patches(amk_instruction_t*, const int32_t*, const
        // amk_instruction_t*, int, int32_t*)`; the four pointers are live device allocations.
        unsafe {
            result::launch_kernel(
                self.patch,
                (grid, 1, 1),
                (256, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(drv("cuLaunchKernel"))
    }

    /// Launches the megakernel in its check mode (`PROG_VERIFY`: `amk_verify_tasks` over every
    /// task of `prog`, `grid` blocks of `threads`); `prog` must name a live `task_verified`
    /// table.
    pub fn launch_verify(
        &self,
        prog: &crate::abi::AmkDeviceProgram,
        grid: u32,
        threads: u32,
    ) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut arg = *prog;
        arg.flags |= crate::abi::PROG_VERIFY;
        let mut params = [&mut arg as *mut _ as *mut c_void];
        // SAFETY: the megakernel's one by-value amk_device_program_t; no dynamic shared memory
        // (the checks read descriptors and params only) and no block waits on another.
        unsafe {
            result::launch_kernel(
                self.kernel,
                (grid, 1, 1),
                (threads, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(drv("cuLaunchKernel"))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded once, unloaded once; no launch is in flight (sessions finish
            // every launch before returning).
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// A small standalone kernel (not the megakernel): loaded from its own cubin.
#[derive(Debug)]
pub struct Kernel {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    func: sys::CUfunction,
}

impl Kernel {
    /// Loads `name` from `cubin`.
    pub fn load(ctx: &Arc<CudaContext>, cubin: &[u8], name: &str) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut image = cubin.to_vec();
        image.extend_from_slice(&[0u8; 16]);
        // SAFETY: a complete cubin that outlives the call.
        let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(drv("cuModuleLoadData"))?;
        let mut k = Kernel {
            ctx: ctx.clone(),
            module,
            func: std::ptr::null_mut(),
        };
        let cname =
            std::ffi::CString::new(name).map_err(|_| CudaError::Layout("bad name".into()))?;
        // SAFETY: live module, NUL-free name.
        k.func = unsafe { result::module::get_function(module, cname) }
            .map_err(drv("cuModuleGetFunction"))?;
        Ok(k)
    }

    /// Launches with raw parameter pointers on the null stream.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list.
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the caller guarantees the parameter list.
        unsafe {
            result::launch_kernel(
                self.func,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                std::ptr::null_mut(),
                params,
            )
        }
        .map_err(drv("cuLaunchKernel"))
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded once, unloaded once, nothing in flight (callers synchronise).
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}
