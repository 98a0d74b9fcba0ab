//! LINEAR_TILE's CPU reference equals the unfused program it replaces — (RMSNORM →) GEMM_TILE
//! into an activation of the output's dtype (→ ADD or SILU_MUL) — bit for bit (those references
//! are checked against f64 formulas in their own crates), touches nothing outside its tile, and
//! refuses bad calls with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use op_linear_tile::Epilogue;
use rstest::rstest;

/// A tile's params: rows `[m_off, m_off + m_tile)`, columns `[n_off, n_off + n_tile)`.
#[derive(Clone, Copy)]
struct Tile {
    k: usize,
    rows: (usize, usize),
    cols: (usize, usize),
}

fn params(t: Tile, norm: bool, epi: Epilogue) -> Vec<(&'static str, Value)> {
    let int = |v: usize| Value::Int(v as i64);
    let mut p = vec![
        ("K", int(t.k)),
        ("m_off", int(t.rows.0)),
        ("M_tile", int(t.rows.1)),
        ("n_off", int(t.cols.0)),
        ("N_tile", int(t.cols.1)),
        ("epilogue", Value::Int(epi.code())),
    ];
    if norm {
        p.push(("norm", Value::Int(1)));
        p.push(("eps", Value::Float(1e-6)));
    }
    p
}

/// RMSNORM's output for every row of `x` with weight `nw` (eps 1e-6), or `x` itself.
fn normed(x: &Tensor, nw: &Tensor, norm: bool) -> Tensor {
    if !norm {
        return x.clone();
    }
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let p = [
        ("eps", Value::Float(1e-6)),
        ("hidden", Value::Int(k as i64)),
    ];
    let mut o = [Tensor::poisoned(x.dtype(), &[m, k])];
    call(
        op_rmsnorm::reference::run,
        &task(Opcode::RMSNORM, 2, 1, &p),
        &[x, nw],
        &mut o,
    )
    .unwrap();
    let [o] = o;
    o
}

/// GEMM_TILE over every row and column of `xs · w^T` (with `bias`), into `[rows, N]` of `dt`.
fn gemm(xs: &Tensor, w: &Tensor, bias: Option<&Tensor>, dt: DType) -> Tensor {
    let (m, k, n) = (xs.shape()[0], xs.shape()[1], w.shape()[0]);
    let p = [
        ("K", Value::Int(k as i64)),
        ("N_tile", Value::Int(n as i64)),
        ("n_off", Value::Int(0)),
        ("M_tile", Value::Int(m as i64)),
    ];
    let mut ins = vec![xs, w];
    ins.extend(bias);
    let mut o = [Tensor::poisoned(dt, &[m, n])];
    let t = task(Opcode::GEMM_TILE, ins.len(), 1, &p);
    call(op_gemm_tile::reference::run, &t, &ins, &mut o).unwrap();
    let [o] = o;
    o
}

/// The unfused program over every row: RMSNORM (when `norm`), GEMM_TILE over all columns,
/// then ADD with `extra` or SILU_MUL with the up product.
fn unfused(
    x: &Tensor,
    w: &Tensor,
    nw: &Tensor,
    extra: &Tensor,
    norm: bool,
    epi: Epilogue,
    dt: DType,
) -> Tensor {
    let (m, n) = (x.shape()[0], w.shape()[0]);
    let xs = normed(x, nw, norm);
    let product = |w: &Tensor| gemm(&xs, w, None, dt);
    let s = product(w);
    let (op, second, run): (_, Tensor, amk_core::ReferenceFn) = match epi {
        // RoPE has its own test below.
        Epilogue::None | Epilogue::Rope => return s,
        Epilogue::Residual => (Opcode::ADD, extra.clone(), op_add::reference::run),
        Epilogue::SwiGlu => (
            Opcode::SILU_MUL,
            product(extra),
            op_silu_mul::reference::run,
        ),
    };
    let mut o = [Tensor::poisoned(dt, &[m, n])];
    call(run, &task(op, 2, 1, &[]), &[&s, &second], &mut o).unwrap();
    let [o] = o;
    o
}

#[rstest]
#[case::f32_plain(DType::F32, false, Epilogue::None)]
#[case::f32_norm_residual(DType::F32, true, Epilogue::Residual)]
#[case::bf16_norm(DType::BF16, true, Epilogue::None)]
#[case::bf16_residual(DType::BF16, false, Epilogue::Residual)]
#[case::bf16_norm_swiglu(DType::BF16, true, Epilogue::SwiGlu)]
#[case::f16_swiglu(DType::F16, false, Epilogue::SwiGlu)]
fn equals_the_unfused_program(#[case] dt: DType, #[case] norm: bool, #[case] epi: Epilogue) {
    let (m, k, n) = (7usize, 24usize, 10usize);
    let tile = Tile {
        k,
        rows: (2, 4),
        cols: (3, 5),
    };
    let mut r = rng((k * 7 + n) as u64 + epi.code() as u64);
    let x = random_nonzero(dt, &[m as u64, k as u64], &mut r, -2.0, 2.0);
    let nw = random_nonzero(dt, &[k as u64], &mut r, 0.5, 1.5);
    let w = random_nonzero(dt, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    let extra = match epi {
        Epilogue::SwiGlu => random_nonzero(dt, &[n as u64, k as u64], &mut r, -1.0, 1.0),
        _ => random_nonzero(dt, &[m as u64, n as u64], &mut r, -1.0, 1.0),
    };
    let want = unfused(&x, &w, &nw, &extra, norm, epi, dt);
    let mut ins = vec![&x, &w];
    if norm {
        ins.push(&nw);
    }
    if epi != Epilogue::None {
        ins.push(&extra);
    }
    let t = task(Opcode::LINEAR_TILE, ins.len(), 1, &params(tile, norm, epi));
    let mut got = [Tensor::poisoned(dt, &[m as u64, n as u64])];
    call(op_linear_tile::reference::run, &t, &ins, &mut got).unwrap();
    let rows = tile.rows.0..tile.rows.0 + tile.rows.1;
    let cols = tile.cols.0..tile.cols.0 + tile.cols.1;
    for i in 0..m {
        for j in 0..n {
            let (a, b) = (got[0].get_f32(i * n + j), want.get_f32(i * n + j));
            if rows.contains(&i) && cols.contains(&j) {
                assert_eq!(a.to_bits(), b.to_bits(), "[{i}, {j}]: {a} vs {b}");
            } else {
                assert!(a.is_nan(), "[{i}, {j}] outside the tile was written");
            }
        }
    }
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut r = rng(6);
    let x = random_nonzero(DType::F32, &[3, 8], &mut r, -1.0, 1.0);
    let nw = random_nonzero(DType::F32, &[8], &mut r, 0.5, 1.5);
    let w = random_nonzero(DType::F32, &[4, 8], &mut r, -1.0, 1.0);
    let w5 = random_nonzero(DType::F32, &[5, 8], &mut r, -1.0, 1.0);
    let run = |ins: &[&Tensor], p: &[(&str, Value)]| {
        let mut out = [Tensor::poisoned(DType::F32, &[3, 4])];
        let t = task(Opcode::LINEAR_TILE, ins.len(), 1, p);
        call(op_linear_tile::reference::run, &t, ins, &mut out)
    };
    let all = Tile {
        k: 8,
        rows: (0, 3),
        cols: (0, 4),
    };
    let ok = params(all, false, Epilogue::None);
    assert!(run(&[&x, &w], &ok).is_ok());
    assert!(matches!(
        run(&[&x, &w, &nw], &ok),
        Err(OpError::Arity { .. })
    ));
    let rows_out = Tile {
        rows: (1, 3),
        ..all
    };
    assert!(matches!(
        run(&[&x, &w], &params(rows_out, false, Epilogue::None)),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run(&[&x, &w, &w5], &params(all, false, Epilogue::SwiGlu)),
        Err(OpError::Shape(_))
    ));
    let mut bad: Vec<_> = ok
        .iter()
        .filter(|(k, _)| *k != "epilogue")
        .cloned()
        .collect();
    bad.push(("epilogue", Value::Int(4)));
    assert!(matches!(
        run(&[&x, &w], &bad),
        Err(OpError::BadParam { .. })
    ));
    assert!(run(&[&x, &w, &nw], &params(all, true, Epilogue::None)).is_ok());
}

/// The RoPE epilogue equals GEMM_TILE into an activation of the output's dtype followed by
/// ROPE at each row's position (with and without Llama 3's frequency divisors).
#[rstest]
#[case::f32(DType::F32, false)]
#[case::bf16_factors(DType::BF16, true)]
fn the_rope_epilogue_equals_gemm_then_rope(#[case] dt: DType, #[case] factors: bool) {
    let (m, k, hd, heads) = (5usize, 16usize, 8usize, 3usize);
    let n = hd * heads;
    let mut r = rng(77);
    let x = random_nonzero(dt, &[m as u64, k as u64], &mut r, -2.0, 2.0);
    let w = random_nonzero(dt, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    let fac = random_nonzero(DType::F32, &[hd as u64 / 2], &mut r, 1.0, 8.0);
    let pos = Tensor::from_i64(DType::I32, &[m as u64], &[3, 4, 5, 6, 700]).unwrap();
    let rope_p = [
        ("head_dim", Value::Int(hd as i64)),
        ("theta", Value::Float(10000.0)),
    ];
    let want = {
        let all = Tile {
            k,
            rows: (0, m),
            cols: (0, n),
        };
        let mut s = [Tensor::poisoned(dt, &[m as u64, heads as u64, hd as u64])];
        let t = task(
            Opcode::LINEAR_TILE,
            2,
            1,
            &params(all, false, Epilogue::None),
        );
        call(op_linear_tile::reference::run, &t, &[&x, &w], &mut s).unwrap();
        let mut ins = vec![&s[0], &pos];
        if factors {
            ins.push(&fac);
        }
        let mut o = [Tensor::poisoned(dt, &[m as u64, heads as u64, hd as u64])];
        call(
            op_rope::reference::run,
            &task(Opcode::ROPE, ins.len(), 1, &rope_p),
            &ins,
            &mut o,
        )
        .unwrap();
        let [o] = o;
        o
    };
    // Rows 1..4, the second and third heads.
    let tile = Tile {
        k,
        rows: (1, 3),
        cols: (hd, 2 * hd),
    };
    let mut p = params(tile, false, Epilogue::Rope);
    p.extend(rope_p.iter().cloned());
    let mut ins = vec![&x, &w, &pos];
    if factors {
        p.push(("rope_factors", Value::Int(1)));
        ins.push(&fac);
    }
    let mut got = [Tensor::poisoned(dt, &[m as u64, heads as u64, hd as u64])];
    call(
        op_linear_tile::reference::run,
        &task(Opcode::LINEAR_TILE, ins.len(), 1, &p),
        &ins,
        &mut got,
    )
    .unwrap();
    for i in 0..m {
        for j in 0..n {
            let (a, b) = (got[0].get_f32(i * n + j), want.get_f32(i * n + j));
            if (1..4).contains(&i) && j >= hd {
                assert_eq!(a.to_bits(), b.to_bits(), "[{i}, {j}]: {a} vs {b}");
            } else {
                assert!(a.is_nan(), "[{i}, {j}] outside the tile was written");
            }
        }
    }
}

/// A bias equals GEMM_TILE's own (`[x, W, bias]`), with a norm and with RoPE after it.
#[rstest]
#[case::f32_norm(DType::F32, true, Epilogue::None)]
#[case::bf16_rope(DType::BF16, false, Epilogue::Rope)]
fn a_bias_is_gemm_tiles(#[case] dt: DType, #[case] norm: bool, #[case] epi: Epilogue) {
    let (m, k, hd, heads) = (5usize, 16usize, 8usize, 2usize);
    let n = hd * heads;
    let mut r = rng(91);
    let x = random_nonzero(dt, &[m as u64, k as u64], &mut r, -2.0, 2.0);
    let nw = random_nonzero(dt, &[k as u64], &mut r, 0.5, 1.5);
    let w = random_nonzero(dt, &[n as u64, k as u64], &mut r, -1.0, 1.0);
    let bias = random_nonzero(dt, &[n as u64], &mut r, -1.0, 1.0);
    let pos = Tensor::from_i64(DType::I32, &[m as u64], &[0, 1, 2, 3, 9]).unwrap();
    let rope_p = [
        ("head_dim", Value::Int(hd as i64)),
        ("theta", Value::Float(10000.0)),
    ];
    let flat = [gemm(&normed(&x, &nw, norm), &w, Some(&bias), dt)];
    // The same values as [rows, heads, head_dim] (a 16-bit value is exact in f32).
    let shape = [m as u64, heads as u64, hd as u64];
    let mut want = Tensor::from_f32(dt, &shape, &flat[0].to_f32_vec()).unwrap();
    if epi == Epilogue::Rope {
        let mut o = [Tensor::poisoned(dt, &shape)];
        let t = task(Opcode::ROPE, 2, 1, &rope_p);
        call(op_rope::reference::run, &t, &[&want, &pos], &mut o).unwrap();
        [want] = o;
    }
    let all = Tile {
        k,
        rows: (0, m),
        cols: (0, n),
    };
    let mut p = params(all, norm, epi);
    p.push(("flags", Value::Int(op_linear_tile::FLAG_BIAS)));
    let mut ins = vec![&x, &w];
    if norm {
        ins.push(&nw);
    }
    ins.push(&bias);
    if epi == Epilogue::Rope {
        p.extend(rope_p.iter().cloned());
        ins.push(&pos);
    }
    let mut got = [Tensor::poisoned(dt, &[m as u64, heads as u64, hd as u64])];
    let t = task(Opcode::LINEAR_TILE, ins.len(), 1, &p);
    call(op_linear_tile::reference::run, &t, &ins, &mut got).unwrap();
    for i in 0..m * n {
        let (a, b) = (got[0].get_f32(i), want.get_f32(i));
        assert_eq!(a.to_bits(), b.to_bits(), "[{i}]: {a} vs {b}");
    }
}
