//! CPU reference of GEMM_TILE: the same linear tile as GEMV_TILE (`_gemv_gemm` in the notes),
//! over a row range. Columns `[n_off, n_off + N_tile)` of `out[m, n] = Σ_k x[m,k]·W[n,k]
//! (+ bias[n])`, for rows `[m_off, m_off + M_tile)` when `m_off` is given and for every row of
//! `x` otherwise (`M_tile` is required and must fit the rows either way, as the validator's
//! rule says: with both `m_off` and `M_tile` the row range is a disjoint write region).
//! Float and weight-only quantised modes, errors and numerics are GEMV_TILE's: see
//! [`op_gemv_tile::reference`].

use amk_core::{CpuCall, OpError};
use op_gemv_tile::reference::{Linear, linear};

/// Runs one GEMM_TILE task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    linear(call, Linear::Gemm)
}
