//! NVRTC: megakernel source → cubin for one architecture, with an on-disk cache.
//!
//! cudarc's safe NVRTC API yields PTX only and panics on interior NULs, so this calls the
//! result/sys layers directly. Every call first checks that libnvrtc can be loaded: cudarc
//! panics instead of erroring when it cannot.
#![allow(unsafe_code)]

use crate::CudaError;
pub use crate::assemble::Linkage;
use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};
use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};

/// Whether libnvrtc can be loaded (never panics).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

fn require() -> Result<(), CudaError> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(CudaError::NvrtcMissing)
    }
}

/// NVRTC's version.
pub fn version() -> Result<(i32, i32), CudaError> {
    require()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two valid out-pointers.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    nvrtc_ok(r, "nvrtcVersion")?;
    Ok((major, minor))
}

/// The architectures this NVRTC can target, as `sm_XY` numbers (e.g. 90).
pub fn supported_archs() -> Result<Vec<i32>, CudaError> {
    require()?;
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    nvrtc_ok(
        unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) },
        "nvrtcGetNumSupportedArchs",
    )?;
    let mut v = vec![0 as c_int; n.max(0) as usize];
    // SAFETY: `v` holds exactly `n` ints, as NVRTC requires.
    nvrtc_ok(
        unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) },
        "nvrtcGetSupportedArchs",
    )?;
    Ok(v)
}

fn nvrtc_ok(r: sys::nvrtcResult, call: &'static str) -> Result<(), CudaError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            call,
            message: format!("{r:?}"),
        })
    }
}

/// The compile options: the numerics contract is explicit (IEEE division and square root,
/// no flush-to-zero, no fast math), the architecture comes from the live device.
pub fn options(arch: &str, linkage: Linkage) -> Vec<String> {
    let mut o: Vec<String> = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--fmad=true".into(),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "-lineinfo".into(),
    ];
    if linkage == Linkage::Separate {
        o.push("--relocatable-device-code=true".into());
    }
    o
}

/// Where cubins are cached: `$AMK_CUDA_CACHE`, else `$XDG_CACHE_HOME/amk/cubin`, else
/// `$HOME/.cache/amk/cubin`, else a temp directory.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AMK_CUDA_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("amk").join("cubin");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("amk").join("cubin");
    }
    std::env::temp_dir().join("amk-cubin")
}

/// The cache key of a compilation.
pub fn cache_key(source: &str, opts: &[String]) -> Result<String, CudaError> {
    let (major, minor) = version()?;
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in opts {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    h.update(format!("nvrtc {major}.{minor} amk {}", env!("CARGO_PKG_VERSION")).as_bytes());
    Ok(h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Compiles `source` for `arch`, or returns the cached cubin of an identical compilation.
/// `cache_dir = None` bypasses the cache.
pub fn compile_cached(
    source: &str,
    arch: &str,
    linkage: Linkage,
    cache_dir: Option<&Path>,
) -> Result<Vec<u8>, CudaError> {
    let opts = options(arch, linkage);
    let key = cache_key(source, &opts)?;
    let path = cache_dir.map(|d| d.join(format!("{key}.{arch}.cubin")));
    if let Some(p) = &path
        && let Ok(bytes) = std::fs::read(p)
        && bytes.starts_with(b"\x7fELF")
    {
        return Ok(bytes);
    }
    let mut cubin = compile(source, arch, &opts, cache_dir, &key)?;
    if linkage == Linkage::Separate {
        cubin = super::jitlink::link(&cubin, arch)?;
    }
    if let (Some(dir), Some(p)) = (cache_dir, &path) {
        let cache_err = |source| CudaError::Cache {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(cache_err)?;
        // Write then rename: parallel processes never read a half-written cubin.
        let tmp = dir.join(format!("{key}.{arch}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &cubin).map_err(cache_err)?;
        std::fs::rename(&tmp, p).map_err(cache_err)?;
    }
    Ok(cubin)
}

/// Compiles `source` for `arch` without the cache. On failure the source is written next to
/// the cache (or to the temp directory) and the error names that file.
pub fn compile(
    source: &str,
    arch: &str,
    opts: &[String],
    dump_dir: Option<&Path>,
    key: &str,
) -> Result<Vec<u8>, CudaError> {
    require()?;
    check_arch(arch)?;
    let src = CString::new(source).map_err(|_| CudaError::Compile {
        arch: arch.into(),
        log: "the source holds a NUL byte".into(),
        source_path: PathBuf::new(),
    })?;
    let name = CString::new("amk_megakernel.cu").unwrap_or_default();
    let prog = result::create_program(&src, Some(&name)).map_err(|e| CudaError::Driver {
        call: "nvrtcCreateProgram",
        message: format!("{e:?}"),
    })?;
    // SAFETY: `prog` is a live program until destroyed below; options are plain ASCII.
    let compiled = unsafe { result::compile_program(prog, opts) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }
        .map(|l| c_chars_to_string(&l))
        .unwrap_or_default();
    let out = match compiled {
        Ok(()) => cubin_of(prog),
        Err(_) => {
            let dir = dump_dir
                .map(Path::to_path_buf)
                .unwrap_or_else(std::env::temp_dir);
            let source_path = dir.join(format!("failed-{key}.{arch}.cu"));
            let _ = std::fs::create_dir_all(&dir);
            let source_path = match std::fs::write(&source_path, source) {
                Ok(()) => source_path,
                Err(_) => {
                    let p = std::env::temp_dir().join(format!("amk-failed-{key}.{arch}.cu"));
                    let _ = std::fs::write(&p, source);
                    p
                }
            };
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            Err(CudaError::Compile {
                arch: arch.into(),
                log: tail,
                source_path,
            })
        }
    };
    // SAFETY: destroyed once; the program is not used afterwards.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn cubin_of(prog: sys::nvrtcProgram) -> Result<Vec<u8>, CudaError> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; valid out-pointer.
    nvrtc_ok(
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) },
        "nvrtcGetCUBINSize",
    )?;
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes NVRTC reported.
    nvrtc_ok(
        unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) },
        "nvrtcGetCUBIN",
    )?;
    Ok(buf)
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Refuses an architecture this NVRTC cannot target (with the list it can).
fn check_arch(arch: &str) -> Result<(), CudaError> {
    let num: Option<i32> = arch
        .strip_prefix("sm_")
        .map(|s| s.trim_end_matches(['a', 'f']))
        .and_then(|s| s.parse().ok());
    let supported = supported_archs()?;
    match num {
        Some(n) if supported.contains(&n) => Ok(()),
        _ => Err(CudaError::NvrtcArch {
            arch: arch.into(),
            supported: supported
                .iter()
                .map(|a| format!("sm_{a}"))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}
