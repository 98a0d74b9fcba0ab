//! CPU reference of ALLREDUCE_SHARD (the single-node all-reduce): `out[i] = Σ_k in_k[i]` over
//! the 1..=8 inputs, summed in `f32` in input order (`((in_0 + in_1) + in_2) + …`, so two
//! shards give exactly ADD's result) and cast on store. Operands are viewed: only the element
//! counts must agree.

use amk_core::{CpuCall, OpError, Tensor};

/// Most shards one task sums (the spec's `max_inputs`).
pub const MAX_SHARDS: usize = 8;

/// Runs one ALLREDUCE_SHARD task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(1, MAX_SHARDS, 1)?;
    let shards: Vec<&Tensor> = (0..call.n_inputs())
        .map(|k| call.input(k))
        .collect::<Result<_, _>>()?;
    let out = call.output(0)?;
    let n = out.numel();
    if let Some((k, s)) = shards.iter().enumerate().find(|(_, s)| s.numel() != n) {
        return Err(OpError::Shape(format!(
            "ALLREDUCE_SHARD input {k} has {} elements, the output {n}",
            s.numel()
        )));
    }
    for i in 0..n {
        let mut acc = shards[0].get_f32(i);
        for s in &shards[1..] {
            acc += s.get_f32(i);
        }
        out.set_f32(i, acc);
    }
    Ok(())
}
