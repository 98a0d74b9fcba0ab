//! GATE_UP_SILU's CPU reference equals the unfused program it replaces — (RMSNORM →) gate and
//! up GEMV_TILEs into activations of the output's dtype, then SILU_MUL — bit for bit (those
//! references are checked against f64 formulas in their own crates), touches nothing outside
//! its tile, and refuses bad calls with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use rstest::rstest;

fn tile(k: usize, n_tile: usize, n_off: usize, norm: bool) -> Vec<(&'static str, Value)> {
    let mut p = vec![
        ("K", Value::Int(k as i64)),
        ("N_tile", Value::Int(n_tile as i64)),
        ("n_off", Value::Int(n_off as i64)),
    ];
    if norm {
        p.push(("eps", Value::Float(1e-6)));
    }
    p
}

#[rstest]
#[case::f32(16, 10, 2, 6, DType::F32, false)]
#[case::f32_norm(16, 10, 0, 10, DType::F32, true)]
#[case::bf16_norm(64, 12, 4, 8, DType::BF16, true)]
#[case::f16_odd_k(9, 5, 1, 3, DType::F16, false)]
fn equals_gate_up_then_silu_mul(
    #[case] k: usize,
    #[case] n: usize,
    #[case] n_off: usize,
    #[case] n_tile: usize,
    #[case] dt: DType,
    #[case] norm: bool,
) {
    let mut r = rng((k * 31 + n) as u64);
    let x = random_nonzero(dt, &[1, k as u64], &mut r, -2.0, 2.0);
    let nw = random_nonzero(dt, &[k as u64], &mut r, 0.5, 1.5);
    let wg = random_nonzero(dt, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    let wu = random_nonzero(dt, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    // Unfused: (RMSNORM,) gate and up GEMV tiles, SILU_MUL; every intermediate in `dt`.
    let xs = if norm {
        let t = task(
            Opcode::RMSNORM,
            2,
            1,
            &[
                ("eps", Value::Float(1e-6)),
                ("hidden", Value::Int(k as i64)),
            ],
        );
        let mut o = [Tensor::poisoned(dt, &[1, k as u64])];
        call(op_rmsnorm::reference::run, &t, &[&x, &nw], &mut o).unwrap();
        let [o] = o;
        o
    } else {
        x.clone()
    };
    let gemv = task(Opcode::GEMV_TILE, 2, 1, &tile(k, n_tile, n_off, false));
    let mut g = [Tensor::poisoned(dt, &[1, n as u64])];
    let mut u = [Tensor::poisoned(dt, &[1, n as u64])];
    call(op_gemv_tile::reference::run, &gemv, &[&xs, &wg], &mut g).unwrap();
    call(op_gemv_tile::reference::run, &gemv, &[&xs, &wu], &mut u).unwrap();
    let mut want = [Tensor::poisoned(dt, &[1, n as u64])];
    let silu = task(Opcode::SILU_MUL, 2, 1, &[]);
    call(
        op_silu_mul::reference::run,
        &silu,
        &[&g[0], &u[0]],
        &mut want,
    )
    .unwrap();

    let mut ins = vec![&x, &wg, &wu];
    if norm {
        ins.push(&nw);
    }
    let t = task(
        Opcode::GATE_UP_SILU,
        ins.len(),
        1,
        &tile(k, n_tile, n_off, norm),
    );
    let mut got = [Tensor::poisoned(dt, &[1, n as u64])];
    call(op_gate_up_silu::reference::run, &t, &ins, &mut got).unwrap();
    for i in 0..n {
        let (a, b) = (got[0].get_f32(i), want[0].get_f32(i));
        if (n_off..n_off + n_tile).contains(&i) {
            assert_eq!(a.to_bits(), b.to_bits(), "column {i}: {a} vs {b}");
        } else {
            assert!(a.is_nan(), "column {i} outside the tile was written");
        }
    }
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut r = rng(6);
    let x = random_nonzero(DType::F32, &[1, 8], &mut r, -1.0, 1.0);
    let nw = random_nonzero(DType::F32, &[8], &mut r, 0.5, 1.5);
    let w = random_nonzero(DType::F32, &[4, 8], &mut r, -1.0, 1.0);
    let w5 = random_nonzero(DType::F32, &[5, 8], &mut r, -1.0, 1.0);
    let run = |ins: &[&Tensor], p: &[(&str, Value)]| {
        let mut out = [Tensor::poisoned(DType::F32, &[1, 4])];
        let t = task(Opcode::GATE_UP_SILU, ins.len(), 1, p);
        call(op_gate_up_silu::reference::run, &t, ins, &mut out)
    };
    assert!(matches!(
        run(&[&x, &w], &tile(8, 4, 0, false)),
        Err(OpError::Arity { .. })
    ));
    assert!(matches!(
        run(&[&x, &w, &w5], &tile(8, 4, 0, false)),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run(&[&x, &w, &w], &tile(8, 2, 3, false)),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run(&[&x, &w, &w, &nw], &tile(8, 4, 0, false)),
        Err(OpError::MissingParam(_))
    ));
    assert!(run(&[&x, &w, &w, &nw], &tile(8, 4, 0, true)).is_ok());
    assert!(run(&[&x, &w, &w], &tile(8, 4, 0, false)).is_ok());
}
