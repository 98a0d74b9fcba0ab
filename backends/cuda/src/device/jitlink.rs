//! nvJitLink: NVRTC's relocatable cubin (`--relocatable-device-code=true`) → the executable
//! cubin the driver loads, with no device (so `amk ops compile` can link too).
//!
//! Why a kernel is ever compiled so: ptxas in whole-program mode (NVRTC's default) optimises
//! across the calls between device functions, and on the every-op kernel — where every op is an
//! out-of-line function, reached by calls either way — that took it 180 s of a core for sm_80
//! and about an hour for sm_90a; compiled as separate code, 18 s for either, and the link a
//! fraction of a second (docs/decisions.md "A FUSED kernel is compiled as separate code and
//! linked"). The library is looked up by the same names as NVRTC's (libnvJitLink.so.13 from the
//! CUDA toolkit, or PyPI's `nvidia-nvjitlink`, on the loader's path).
#![allow(unsafe_code)]

use crate::CudaError;
use libloading::Library;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::OnceLock;

type Handle = *mut c_void;
type Create = unsafe extern "C" fn(*mut Handle, u32, *const *const c_char) -> c_int;
type Destroy = unsafe extern "C" fn(*mut Handle) -> c_int;
type AddData = unsafe extern "C" fn(Handle, c_int, *const c_void, usize, *const c_char) -> c_int;
type Complete = unsafe extern "C" fn(Handle) -> c_int;
type GetSize = unsafe extern "C" fn(Handle, *mut usize) -> c_int;
type GetBytes = unsafe extern "C" fn(Handle, *mut c_void) -> c_int;

/// `NVJITLINK_SUCCESS`.
const SUCCESS: c_int = 0;
/// `NVJITLINK_INPUT_CUBIN`: a (relocatable) CUDA binary.
const INPUT_CUBIN: c_int = 1;

/// The loaded library, once a process (None: not found).
fn library() -> Result<&'static Library, CudaError> {
    static LIB: OnceLock<Option<Library>> = OnceLock::new();
    LIB.get_or_init(|| {
        cudarc::get_lib_name_candidates("nvJitLink")
            .iter()
            // SAFETY: loading the CUDA toolkit's library runs no initialisers of ours.
            .find_map(|name| unsafe { Library::new(name) }.ok())
    })
    .as_ref()
    .ok_or(CudaError::JitLinkMissing)
}

/// One entry point of the library, by its ABI-versioned name (what `nvJitLink.h` calls).
fn entry<T: Copy>(lib: &'static Library, name: &str) -> Result<T, CudaError> {
    let missing = |e: libloading::Error| CudaError::Driver {
        call: "nvJitLink",
        message: format!("{name}: {e}"),
    };
    // SAFETY: each name is declared with the signature `T` in nvJitLink.h (CUDA 13.0).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(missing)
}

/// A link in progress; destroyed on drop.
struct Link {
    handle: Handle,
    destroy: Destroy,
}

impl Drop for Link {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            // SAFETY: `handle` came from nvJitLinkCreate and is destroyed once.
            unsafe { (self.destroy)(&mut self.handle) };
        }
    }
}

/// Links the relocatable `object` (one NVRTC compilation for `arch`) into an executable cubin.
pub fn link(object: &[u8], arch: &str) -> Result<Vec<u8>, CudaError> {
    let lib = library()?;
    let create: Create = entry(lib, "__nvJitLinkCreate_13_0")?;
    let add: AddData = entry(lib, "__nvJitLinkAddData_13_0")?;
    let complete: Complete = entry(lib, "__nvJitLinkComplete_13_0")?;
    let cubin_size: GetSize = entry(lib, "__nvJitLinkGetLinkedCubinSize_13_0")?;
    let cubin: GetBytes = entry(lib, "__nvJitLinkGetLinkedCubin_13_0")?;
    let arch_opt = CString::new(format!("-arch={arch}")).unwrap_or_default();
    let opts = [arch_opt.as_ptr()];
    let mut link = Link {
        handle: std::ptr::null_mut(),
        destroy: entry(lib, "__nvJitLinkDestroy_13_0")?,
    };
    // SAFETY: one valid option string, alive for the call; valid out-pointer.
    let r = unsafe { create(&mut link.handle, 1, opts.as_ptr()) };
    if r != SUCCESS || link.handle.is_null() {
        link.handle = std::ptr::null_mut();
        return Err(failed("nvJitLinkCreate", r, String::new()));
    }
    let name = CString::new("amk_megakernel").unwrap_or_default();
    // SAFETY: `object` is alive for the call, its length as given.
    let r = unsafe {
        add(
            link.handle,
            INPUT_CUBIN,
            object.as_ptr().cast(),
            object.len(),
            name.as_ptr(),
        )
    };
    if r != SUCCESS {
        return Err(failed("nvJitLinkAddData", r, error_log(lib, &link)));
    }
    // SAFETY: a live handle holding one input.
    let r = unsafe { complete(link.handle) };
    if r != SUCCESS {
        return Err(failed("nvJitLinkComplete", r, error_log(lib, &link)));
    }
    let mut size = 0usize;
    // SAFETY: a completed link; valid out-pointer.
    let r = unsafe { cubin_size(link.handle, &mut size) };
    if r != SUCCESS {
        return Err(failed("nvJitLinkGetLinkedCubinSize", r, String::new()));
    }
    let mut out = vec![0u8; size];
    // SAFETY: `out` holds the `size` bytes the library reported.
    let r = unsafe { cubin(link.handle, out.as_mut_ptr().cast()) };
    if r != SUCCESS {
        return Err(failed("nvJitLinkGetLinkedCubin", r, String::new()));
    }
    Ok(out)
}

/// The link's error log ("" when it has none or cannot be read).
fn error_log(lib: &'static Library, link: &Link) -> String {
    let (Ok(size_of), Ok(log_of)) = (
        entry::<GetSize>(lib, "__nvJitLinkGetErrorLogSize_13_0"),
        entry::<GetBytes>(lib, "__nvJitLinkGetErrorLog_13_0"),
    ) else {
        return String::new();
    };
    let mut size = 0usize;
    // SAFETY: a live handle; valid out-pointer.
    if unsafe { size_of(link.handle, &mut size) } != SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes the library reported.
    if unsafe { log_of(link.handle, buf.as_mut_ptr().cast()) } != SUCCESS {
        return String::new();
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string()
}

fn failed(call: &'static str, code: c_int, log: String) -> CudaError {
    CudaError::Driver {
        call,
        message: if log.is_empty() {
            format!("nvJitLinkResult {code}")
        } else {
            format!("nvJitLinkResult {code}: {log}")
        },
    }
}
