//! CPU reference of SOFTMAX along one dimension of the input.
//!
//! Param `dim` (optional, default −1; negative values count from the end) picks the axis of
//! the input's shape; a rank-0 input is treated as a single element along `dim` 0 or −1. Each
//! slice along that axis becomes `exp(x − max) / Σ exp(x − max)`, computed in fp32 (the max
//! subtraction keeps it stable), cast on store. The output is viewed with the input's shape
//! (equal element counts are required, dims may differ).

use amk_core::{CpuCall, OpError};

/// Runs one SOFTMAX task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(1, 1, 1)?;
    let x = call.input(0)?;
    let dim = call.int_opt("dim")?.unwrap_or(-1);
    let shape: Vec<usize> = x.shape().iter().map(|&d| d as usize).collect();
    let rank = shape.len().max(1) as i64;
    if dim < -rank || dim >= rank {
        return Err(OpError::BadParam {
            key: "dim".into(),
            why: format!(
                "{dim} is outside [-{rank}, {rank}) for an input of shape {:?}",
                x.shape()
            ),
        });
    }
    let axis = if dim < 0 { dim + rank } else { dim } as usize;
    // View the input as [outer, n, inner] around the axis.
    let (outer, n, inner) = if shape.is_empty() {
        (1, 1, 1)
    } else if x.numel() == 0 {
        (0, 0, 0)
    } else {
        (
            shape[..axis].iter().product::<usize>(),
            shape[axis],
            shape[axis + 1..].iter().product::<usize>(),
        )
    };
    let out = call.output(0)?;
    if out.numel() != x.numel() {
        return Err(OpError::Shape(format!(
            "the output {:?} must hold as many elements as the input {:?} ({})",
            out.shape(),
            x.shape(),
            x.numel()
        )));
    }
    let xv = x.to_f32_vec();
    let mut e = vec![0f32; n];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let m = (0..n).map(|j| xv[at(j)]).fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for (j, ej) in e.iter_mut().enumerate() {
                *ej = (xv[at(j)] - m).exp();
                sum += *ej;
            }
            for (j, &ej) in e.iter().enumerate() {
                out.set_f32(at(j), ej / sum);
            }
        }
    }
    Ok(())
}
