//! The backend in a build without the `cuda` feature: same API, every entry point answers
//! [`CudaError::NotCompiled`].

use crate::{CudaError, CudaOptions, DeviceInfo};
use amk_core::{Backend, BackendError, Registry, Session, ValidatedProgram, WeightStore};

/// The CUDA backend (not compiled into this build).
#[derive(Debug)]
pub struct CudaBackend {
    _never: std::convert::Infallible,
}

/// A loaded program on the device (not compiled into this build).
#[derive(Debug)]
pub struct CudaSession {
    _never: std::convert::Infallible,
}

impl CudaBackend {
    /// Always [`CudaError::NotCompiled`] in this build.
    pub fn new(_options: CudaOptions) -> Result<Self, CudaError> {
        Err(CudaError::NotCompiled)
    }
    /// Always [`CudaError::NotCompiled`] in this build.
    pub fn probe() -> Result<DeviceInfo, CudaError> {
        Err(CudaError::NotCompiled)
    }
    /// The device (unreachable in this build).
    pub fn info(&self) -> &DeviceInfo {
        match self._never {}
    }
    /// Unreachable in this build (no backend can be opened).
    pub fn load_session(
        &self,
        _program: &ValidatedProgram,
        _weights: &WeightStore,
        _registry: &Registry,
    ) -> Result<CudaSession, CudaError> {
        match self._never {}
    }
    /// Unreachable in this build (no backend can be opened).
    pub fn load_session_synthetic(
        &self,
        _program: &ValidatedProgram,
        _synth: &amk_core::synth::SyntheticWeights,
        _registry: &Registry,
    ) -> Result<CudaSession, CudaError> {
        match self._never {}
    }
    /// Unreachable in this build (no backend can be opened).
    pub fn read_bandwidth(&self, _bytes: usize, _reps: usize) -> Result<f64, CudaError> {
        match self._never {}
    }
}

/// The session API, unreachable in this build (no session can be created).
impl CudaSession {
    /// Unreachable in this build.
    pub fn run(
        &mut self,
        _inputs: &[(&str, amk_core::Tensor)],
    ) -> Result<amk_core::Outputs, CudaError> {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn last_kernel_ms(&self) -> Option<f32> {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn grid(&self) -> u32 {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn program(&self) -> &amk_core::Program {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn fill_synthetic(
        &mut self,
        _buffer: usize,
        _seed: u64,
        _init: amk_core::synth::Init,
    ) -> Result<(), CudaError> {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn poison_outputs(&mut self) -> Result<(), CudaError> {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn enable_trace(&mut self, _registry: &Registry) -> Result<(), CudaError> {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn trace_summary(&self) -> Result<String, CudaError> {
        match self._never {}
    }
    /// Unreachable in this build.
    pub fn trace(&self) -> Result<Vec<crate::TaskTrace>, CudaError> {
        match self._never {}
    }
}

/// Always [`CudaError::NotCompiled`] in this build.
pub fn precompile(
    _options: &CudaOptions,
    _registry: &Registry,
    _arch: &str,
    _cache_dir: Option<&std::path::Path>,
    _program: Option<&amk_core::ir::Program>,
    _trace: bool,
) -> Result<(std::path::PathBuf, usize, bool), CudaError> {
    Err(CudaError::NotCompiled)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn load(
        &self,
        _program: &ValidatedProgram,
        _weights: &WeightStore,
        _registry: &Registry,
    ) -> Result<Box<dyn Session>, BackendError> {
        match self._never {}
    }
}
