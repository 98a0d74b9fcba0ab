//! CPU reference of ROPE: rotary position embedding at the positions held in an integer
//! buffer.
//!
//! `x` is viewed as heads of `head_dim` (even). With `half = head_dim / 2`, frequency `i`
//! (`0 ≤ i < half`) is `inv_freq[i] = 1 / theta^(i / half)` and its angle `ang = pos ·
//! inv_freq[i]`, both rounded to fp32 step by step (the power is taken in f64 and rounded to
//! fp32, see [`inv_freq`]); `cos`/`sin` of that fp32 angle
//! are rounded to fp32 from f64, and the rotation itself is fp32, cast on store. Which dims
//! form the rotated pair depends on `pairing`:
//! - `0` (default), rotate-half (Llama / NeoX): dims `i` and `i + half`,
//!   `out = cat(x1·cos − x2·sin, x2·cos + x1·sin)`;
//! - `1`, adjacent pairs (GGUF / GPT-J layout): dims `2i` and `2i + 1`, rotated the same way.
//!
//! Frequency factors (optional third input, Llama 3's `rope_type: "llama3"` scaling, GGUF's
//! `rope_freqs.weight`): `head_dim / 2` float divisors, frequency `i` becoming
//! `inv_freq[i] / factors[i]` (one fp32 division) before the angle is taken.
//!
//! Positions: a rank ≤ 2 `x` (`[n_heads, head_dim]`, or flat) uses `positions[0]` for every
//! head; a rank ≥ 3 `x` (`[S, heads, head_dim]`, or `[B, S, heads, head_dim]`) has one
//! position per row of its leading dims (`S`, or `B · S`), and the positions buffer must hold
//! exactly that many. Positions must be non-negative integers below 2^31.

use amk_core::{CpuCall, OpError, Tensor};

/// `pairing` value of the rotate-half (Llama / NeoX) layout, the default.
pub const PAIRING_ROTATE_HALF: i64 = 0;
/// `pairing` value of the adjacent-pairs (GGUF) layout.
pub const PAIRING_ADJACENT: i64 = 1;

/// Exclusive upper bound of a position (they are int32 on the device).
const POSITION_LIMIT: u64 = 1 << 31;

/// `inv_freq[i] = 1 / theta^(i / half)` for `i < half`, every step rounded to fp32 as the
/// reference (and HuggingFace) compute it: `arange(half) / half` in fp32, the power, then the
/// reciprocal in fp32. The power itself is taken in f64 and rounded to fp32 (a correctly
/// rounded fp32 power in practice), so the CUDA device function, which does the same with
/// CUDA's f64 `pow`, gets the same fp32 value; a libm `powf` is not guaranteed to round the
/// same way on every platform.
pub fn inv_freq(theta: f32, half: usize) -> Vec<f32> {
    (0..half)
        .map(|i| {
            let e = i as f32 / half as f32;
            1.0f32 / ((theta as f64).powf(e as f64) as f32)
        })
        .collect()
}

/// [`inv_freq`] divided by the per-pair frequency factors when there are any (`half` float
/// elements; one fp32 division each).
pub fn scaled_inv_freq(
    theta: f32,
    half: usize,
    factors: Option<&Tensor>,
) -> Result<Vec<f32>, OpError> {
    let mut f = inv_freq(theta, half);
    if let Some(t) = factors {
        check_factors(t, half)?;
        for (i, v) in f.iter_mut().enumerate() {
            *v /= t.get_f32(i);
        }
    }
    Ok(f)
}

/// The frequency factors operand: floating point, `half` elements.
pub fn check_factors(t: &Tensor, half: usize) -> Result<(), OpError> {
    if t.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "the RoPE frequency factors must be floating point, got {}",
            t.dtype()
        )));
    }
    if t.numel() != half {
        return Err(OpError::Shape(format!(
            "the RoPE frequency factors {:?} must hold head_dim / 2 = {half} elements",
            t.shape()
        )));
    }
    Ok(())
}

/// Runs one ROPE task.
pub fn run(call: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
    call.expect_arity(2, 3, 1)?;
    let (x, positions) = (call.input(0)?, call.input(1)?);
    let factors = if call.n_inputs() == 3 {
        Some(call.input(2)?)
    } else {
        None
    };
    let hd = call.int("head_dim")?;
    if hd <= 0 || hd % 2 != 0 {
        return Err(OpError::BadParam {
            key: "head_dim".into(),
            why: format!("{hd} must be positive and even (dims are rotated in pairs)"),
        });
    }
    let hd = usize::try_from(hd).map_err(|_| OpError::BadParam {
        key: "head_dim".into(),
        why: format!("{hd} does not fit this host's address space"),
    })?;
    let theta = call.real("theta")? as f32;
    if !(theta.is_finite() && theta > 0.0) {
        return Err(OpError::BadParam {
            key: "theta".into(),
            why: format!("{theta} must be a positive finite fp32 number"),
        });
    }
    let pairing = call.int_opt("pairing")?.unwrap_or(PAIRING_ROTATE_HALF);
    if pairing != PAIRING_ROTATE_HALF && pairing != PAIRING_ADJACENT {
        return Err(OpError::BadParam {
            key: "pairing".into(),
            why: format!(
                "{pairing} is neither {PAIRING_ROTATE_HALF} (rotate-half) nor \
                 {PAIRING_ADJACENT} (adjacent pairs)"
            ),
        });
    }
    if x.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "ROPE's input must be floating point, got {}",
            x.dtype()
        )));
    }
    if !positions.dtype().is_integer() {
        return Err(OpError::DType(format!(
            "ROPE's positions must be an integer buffer, got {}",
            positions.dtype()
        )));
    }
    let n = x.numel();
    if n % hd != 0 {
        return Err(OpError::Shape(format!(
            "the input {:?} is not a whole number of heads of head_dim = {hd}",
            x.shape()
        )));
    }
    // Rows that share a position, and how many elements each holds.
    let rows = match x.shape() {
        [] | [_] | [_, _] => 1,
        s => s[..s.len() - 2]
            .iter()
            .fold(1usize, |a, &d| a.saturating_mul(d as usize)),
    };
    let row_len = n.checked_div(rows).unwrap_or(0);
    if rows > 1 || x.shape().len() >= 3 {
        if positions.numel() != rows {
            return Err(OpError::Shape(format!(
                "the input {:?} has {rows} rows, each needing its own position; the positions \
                 buffer {:?} holds {}",
                x.shape(),
                positions.shape(),
                positions.numel()
            )));
        }
        if row_len % hd != 0 {
            return Err(OpError::Shape(format!(
                "rows of the input {:?} ({row_len} elements) are not whole heads of \
                 head_dim = {hd}",
                x.shape()
            )));
        }
    } else if n > 0 && positions.numel() == 0 {
        return Err(OpError::Shape(
            "the positions buffer is empty; ROPE needs at least one position".into(),
        ));
    }
    let n_pos = if n == 0 { 0 } else { rows };
    let mut pos = Vec::with_capacity(n_pos);
    for at in 0..n_pos {
        let p = positions.get_i64(at);
        if p < 0 || p as u64 >= POSITION_LIMIT {
            return Err(OpError::IndexOutOfRange {
                at,
                value: p,
                limit: POSITION_LIMIT,
            });
        }
        pos.push(p as f32);
    }
    let out = call.output(0)?;
    if out.numel() != n {
        return Err(OpError::Shape(format!(
            "the output {:?} must hold as many elements as the input {:?} ({n})",
            out.shape(),
            x.shape()
        )));
    }

    let half = hd / 2;
    let freqs = scaled_inv_freq(theta, half, factors)?;
    let xv = x.to_f32_vec();
    let mut cos = vec![0f32; half];
    let mut sin = vec![0f32; half];
    for (r, &p) in pos.iter().enumerate() {
        for i in 0..half {
            let ang = (p * freqs[i]) as f64;
            cos[i] = ang.cos() as f32;
            sin[i] = ang.sin() as f32;
        }
        for head in 0..row_len / hd {
            let base = r * row_len + head * hd;
            for i in 0..half {
                let (a, b) = if pairing == PAIRING_ADJACENT {
                    (base + 2 * i, base + 2 * i + 1)
                } else {
                    (base + i, base + i + half)
                };
                let (x1, x2) = (xv[a], xv[b]);
                out.set_f32(a, x1 * cos[i] - x2 * sin[i]);
                out.set_f32(b, x2 * cos[i] + x1 * sin[i]);
            }
        }
    }
    Ok(())
}
