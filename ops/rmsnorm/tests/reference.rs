//! RMSNORM's CPU reference against an independent f64 formula: random non-zero inputs,
//! poisoned outputs, every float dtype for x, w and y, ranks 0–4 (rows = all leading dims),
//! viewed weights/outputs, several eps, and typed errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Task, Tensor};
use op_rmsnorm::reference::run;
use rstest::rstest;

fn norm_task(eps: f64, hidden: i64) -> Task {
    task(
        Opcode::RMSNORM,
        2,
        1,
        &[("eps", Value::Float(eps)), ("hidden", Value::Int(hidden))],
    )
}

/// f16's subnormal spacing: tiny values round to a multiple of 2^-24.
fn atol(d: DType) -> f64 {
    if d == DType::F16 { 2f64.powi(-24) } else { 0.0 }
}

/// `y = x / sqrt(mean(x^2) + eps) * w` row by row, in f64 (eps as the f32 the device sees).
fn rmsnorm_f64(x: &Tensor, w: &Tensor, eps: f64) -> Vec<f64> {
    let h = w.numel();
    let eps = eps as f32 as f64;
    let xs: Vec<f64> = x.to_f32_vec().into_iter().map(f64::from).collect();
    let mut y = Vec::with_capacity(xs.len());
    for row in xs.chunks(h) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let denom = (ms + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            y.push(v / denom * w.get_f32(j) as f64);
        }
    }
    y
}

#[rstest]
// x shape, w shape, y shape, x dtype, w dtype, y dtype, eps
#[case(&[], &[1], &[], DType::F32, DType::F32, DType::F32, 1e-6)]
#[case(&[1], &[1], &[1], DType::F32, DType::F32, DType::F32, 1e-5)]
#[case(&[7], &[7], &[7], DType::F16, DType::F32, DType::F32, 1e-6)]
#[case(&[3, 5], &[5], &[3, 5], DType::F32, DType::BF16, DType::F16, 1e-6)]
#[case(&[2, 3, 4], &[1, 4], &[24], DType::BF16, DType::BF16, DType::BF16, 1e-5)]
#[case(&[1, 2, 3, 5], &[5], &[1, 2, 3, 5], DType::F32, DType::F16, DType::F32, 0.1)]
#[case(&[4, 33], &[33], &[4, 33], DType::F32, DType::F32, DType::F16, 1e-6)]
#[case(&[1, 576], &[576], &[1, 576], DType::BF16, DType::F32, DType::F32, 1e-5)]
#[case(&[2, 2048], &[2048], &[2, 2048], DType::F32, DType::F32, DType::F32, 1e-6)]
#[case(&[3, 1, 1, 9], &[9], &[27], DType::F16, DType::F16, DType::F16, 0.0)]
fn matches_f64_formula(
    #[case] sx: &[u64],
    #[case] sw: &[u64],
    #[case] sy: &[u64],
    #[case] dx: DType,
    #[case] dw: DType,
    #[case] dy: DType,
    #[case] eps: f64,
) {
    let mut r = rng(sx.iter().sum::<u64>() * 3 + dx as u64 * 31 + dy as u64 + dw as u64 * 7);
    let x = random_nonzero(dx, sx, &mut r, -4.0, 4.0);
    let w = random_nonzero(dw, sw, &mut r, -2.0, 2.0);
    let mut out = [Tensor::poisoned(dy, sy)];
    let hidden = w.numel() as i64;
    call(run, &norm_task(eps, hidden), &[&x, &w], &mut out).unwrap();
    assert_close(&out[0], &rmsnorm_f64(&x, &w, eps), 1e-6, atol(dy));
}

#[test]
fn constant_rows_normalise_to_the_weight() {
    // A row of all c has rms |c|: y = sign(c) * w (eps = 0).
    let x = Tensor::from_f32(DType::F32, &[2, 3], &[5.0, 5.0, 5.0, -0.25, -0.25, -0.25]).unwrap();
    let w = Tensor::from_f32(DType::F32, &[3], &[1.0, 2.0, -3.0]).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[2, 3])];
    call(run, &norm_task(0.0, 3), &[&x, &w], &mut out).unwrap();
    assert_eq!(out[0].to_f32_vec(), [1.0, 2.0, -3.0, -1.0, -2.0, 3.0]);
}

#[test]
fn bad_calls_are_typed_errors() {
    let x = Tensor::zeros(DType::F32, &[2, 4]);
    let w = Tensor::zeros(DType::F32, &[4]);
    let t = norm_task(1e-6, 4);
    let mut out = [Tensor::poisoned(DType::F32, &[2, 4])];
    let run_with = |t: &Task, ins: &[&Tensor], out: &mut [Tensor]| call(run, t, ins, out);
    // Missing params.
    let no_eps = task(Opcode::RMSNORM, 2, 1, &[("hidden", Value::Int(4))]);
    assert_eq!(
        run_with(&no_eps, &[&x, &w], &mut out),
        Err(OpError::MissingParam("eps".into()))
    );
    let no_hidden = task(Opcode::RMSNORM, 2, 1, &[("eps", Value::Float(1e-6))]);
    assert_eq!(
        run_with(&no_hidden, &[&x, &w], &mut out),
        Err(OpError::MissingParam("hidden".into()))
    );
    // Mistyped / unusable params.
    let str_eps = task(
        Opcode::RMSNORM,
        2,
        1,
        &[
            ("eps", Value::Str("small".into())),
            ("hidden", Value::Int(4)),
        ],
    );
    assert!(matches!(
        run_with(&str_eps, &[&x, &w], &mut out),
        Err(OpError::BadParam { .. })
    ));
    assert!(matches!(
        run_with(&norm_task(1e-6, 0), &[&x, &w], &mut out),
        Err(OpError::BadParam { .. })
    ));
    // hidden is not x's last dim.
    let w8 = Tensor::zeros(DType::F32, &[8]);
    assert!(matches!(
        run_with(&norm_task(1e-6, 8), &[&x, &w8], &mut out),
        Err(OpError::Shape(_))
    ));
    // Weight of the wrong size.
    let w3 = Tensor::zeros(DType::F32, &[3]);
    assert!(matches!(
        run_with(&t, &[&x, &w3], &mut out),
        Err(OpError::Shape(_))
    ));
    // Output of the wrong size.
    let mut small = [Tensor::poisoned(DType::F32, &[4])];
    assert!(matches!(
        run_with(&t, &[&x, &w], &mut small),
        Err(OpError::Shape(_))
    ));
    // Arity.
    assert!(matches!(
        run_with(&t, &[&x], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        run_with(&t, &[&x, &w, &w], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        run_with(&t, &[&x, &w], &mut []),
        Err(OpError::Arity {
            what: "outputs",
            ..
        })
    ));
    assert!(out[0].to_f32_vec().iter().all(|v| v.is_nan()));
}

#[test]
fn registered_with_its_reference() {
    let reg = Registry::builtin().unwrap();
    let r = reg
        .reference(Opcode::RMSNORM)
        .expect("RMSNORM has a CPU reference");
    assert!(r.in_place.is_empty());
}
