//! The CUDA backend's one error type. It names no cudarc type, so it exists with and without
//! the `cuda` feature.

use amk_core::{BackendError, TaskId};
use std::path::PathBuf;
use std::time::Duration;

/// What can go wrong finding the device, compiling the megakernel, loading or running it.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A tuning variable of the environment holds a value it does not take
    /// (`CudaOptions::from_env`).
    #[error("{name}={value:?} is not a value it takes: {want}")]
    BadEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it takes.
        want: &'static str,
    },
    /// This build has no GPU backend.
    #[error("this amk was built without the `cuda` feature (rebuild with `--features cuda`)")]
    NotCompiled,
    /// The CUDA driver library (libcuda) cannot be loaded.
    #[error("the CUDA driver library (libcuda.so) was not found: no NVIDIA driver on this machine")]
    DriverMissing,
    /// The NVRTC library cannot be loaded.
    #[error(
        "the NVRTC library (libnvrtc.so) was not found: install the CUDA toolkit's NVRTC and put \
         its lib directory on LD_LIBRARY_PATH"
    )]
    NvrtcMissing,
    /// The nvJitLink library cannot be loaded (kernels compiled as separate code need it).
    #[error(
        "the nvJitLink library (libnvJitLink.so) was not found: install the CUDA toolkit's \
         nvJitLink (or PyPI's nvidia-nvjitlink) and put its lib directory on LD_LIBRARY_PATH"
    )]
    JitLinkMissing,
    /// The driver loaded but reports no device.
    #[error("no CUDA device is present")]
    NoDevice,
    /// The requested device ordinal does not exist.
    #[error("CUDA device {ordinal} does not exist ({count} present)")]
    DeviceOrdinal {
        /// Asked for.
        ordinal: usize,
        /// Present.
        count: usize,
    },
    /// The device cannot run a persistent megakernel.
    #[error("device {device}: {why}")]
    DeviceUnsuitable {
        /// Device name.
        device: String,
        /// What it lacks.
        why: String,
    },
    /// A driver call failed.
    #[error("CUDA driver: {call}: {message}")]
    Driver {
        /// The call.
        call: &'static str,
        /// The driver's error name and text.
        message: String,
    },
    /// NVRTC refused the megakernel.
    #[error(
        "NVRTC could not compile the megakernel for {arch}; the source is at {}\n{log}",
        source_path.display()
    )]
    Compile {
        /// Target architecture.
        arch: String,
        /// The compiler log (its last lines).
        log: String,
        /// Where the generated source was written.
        source_path: PathBuf,
    },
    /// NVRTC does not know the architecture.
    #[error("NVRTC cannot target {arch}; it supports {supported}")]
    NvrtcArch {
        /// Asked for.
        arch: String,
        /// What this NVRTC supports.
        supported: String,
    },
    /// The on-disk cubin cache failed.
    #[error("cubin cache {}: {source}", path.display())]
    Cache {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// An op of the program has no CUDA device function.
    #[error("task {task} ({label}): op {op} has no CUDA device function")]
    UnsupportedOp {
        /// Task.
        task: TaskId,
        /// Its label.
        label: String,
        /// The op's name.
        op: String,
    },
    /// The program does not fit the device tables (too many buffers, a param out of int32, …).
    #[error("cannot lay out the program for the device: {0}")]
    Layout(String),
    /// The program's queues need more co-resident blocks than the device holds.
    #[error(
        "the megakernel needs {needed} co-resident blocks, the device holds {resident} \
         ({per_sm} per SM × {sms} SMs at {threads} threads and {smem} B of shared memory)"
    )]
    Occupancy {
        /// Blocks needed.
        needed: usize,
        /// Blocks that fit.
        resident: usize,
        /// Blocks per SM.
        per_sm: usize,
        /// SMs.
        sms: usize,
        /// Threads per block.
        threads: u32,
        /// Dynamic shared memory per block.
        smem: usize,
    },
    /// The forward pass did not finish in time.
    #[error(
        "timeout: the forward pass did not finish within {} ms; {}",
        after.as_millis(),
        if *recovered { "the device stopped after the abort flag was raised and stays usable" }
        else { "the device did not stop; this session is unusable" }
    )]
    Timeout {
        /// The watchdog limit.
        after: Duration,
        /// Whether the kernel stopped after the abort flag was raised.
        recovered: bool,
    },
    /// A task failed on the device.
    #[error("task {task} ({label}){}: {reason} (detail {detail})",
        step.map(|s| format!(" step {s}")).unwrap_or_default())]
    Trap {
        /// Task.
        task: TaskId,
        /// Its label.
        label: String,
        /// FUSED step, if inside one.
        step: Option<u32>,
        /// What went wrong.
        reason: String,
        /// The op's detail value (the bad index, id, dtype, …).
        detail: i64,
    },
    /// An earlier failure left the device unusable for this session.
    #[error("the CUDA context is unusable after an earlier failure: {0}")]
    ContextLost(String),
    /// A backend-neutral error (inputs, weights).
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Backend(b) => b,
            CudaError::Timeout { after, .. } => BackendError::Timeout {
                after_ms: after.as_millis() as u64,
                detail: e.to_string(),
            },
            CudaError::Trap {
                task,
                label,
                step,
                reason,
                detail,
            } => BackendError::DeviceTrap {
                task,
                label,
                reason: match step {
                    Some(s) => format!("step {s}: {reason} (detail {detail})"),
                    None => format!("{reason} (detail {detail})"),
                },
            },
            CudaError::NotCompiled
            | CudaError::DriverMissing
            | CudaError::NvrtcMissing
            | CudaError::JitLinkMissing
            | CudaError::NoDevice
            | CudaError::DeviceOrdinal { .. }
            | CudaError::DeviceUnsuitable { .. }
            | CudaError::UnsupportedOp { .. } => BackendError::Unsupported(e.to_string()),
            other => BackendError::Device(other.to_string()),
        }
    }
}
