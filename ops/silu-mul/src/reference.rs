//! CPU reference of SILU_MUL `[gate, up] -> out`: `out[i] = silu(g) · u` with
//! `silu(g) = g / (1 + exp(−g))`, computed in `f32` and cast on store. Operands are viewed:
//! only the element counts must agree.

use amk_core::{CpuCall, OpError};

/// Runs one SILU_MUL task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 2, 1)?;
    let (gate, up) = (call.input(0)?, call.input(1)?);
    let out = call.output(0)?;
    let n = out.numel();
    if gate.numel() != n || up.numel() != n {
        return Err(OpError::Shape(format!(
            "SILU_MUL needs equal element counts, got gate {} and up {} -> {n}",
            gate.numel(),
            up.numel()
        )));
    }
    for i in 0..n {
        let g = gate.get_f32(i);
        out.set_f32(i, g / (1.0 + (-g).exp()) * up.get_f32(i));
    }
    Ok(())
}
