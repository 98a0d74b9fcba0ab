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
