//! ROPE's CPU reference against an independent formula (both pairings, ranks 1–4, several
//! thetas, positions from 0 to 10^5, every float dtype), the `pairing` rule of the validator,
//! and typed errors for bad calls. Inputs are fresh random non-zero values, outputs are
//! poisoned before the call.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, shape_rule_kinds, task};
use amk_core::{DType, ErrorKind, OpError, Opcode, Task, Tensor};
use op_rope::reference::run;
use rstest::rstest;

fn rope_task(hd: i64, theta: f64, pairing: Option<i64>) -> Task {
    let mut p = vec![("head_dim", Value::Int(hd)), ("theta", Value::Float(theta))];
    if let Some(x) = pairing {
        p.push(("pairing", Value::Int(x)));
    }
    task(Opcode::ROPE, 2, 1, &p)
}

/// The expected output. The angle follows the spec's fp32 recipe (`inv_freq = 1 / theta^(i /
/// half)`, divided by `factors[i]` when given, and `pos · inv_freq`, each step rounded to fp32)
/// when `f32_angle`, else it is exact f64; the rotation is f64. Row `r` of the leading dims
/// uses `positions[r]`.
fn naive(
    x: &Tensor,
    positions: &[i64],
    hd: usize,
    theta: f64,
    adjacent: bool,
    f32_angle: bool,
    factors: Option<&Tensor>,
) -> Vec<f64> {
    let half = hd / 2;
    let n = x.numel();
    let per_pos = n / positions.len();
    let mut out = vec![f64::NAN; n];
    for head in 0..n / hd {
        let p = positions[head * hd / per_pos];
        for i in 0..half {
            let f = factors.map_or(1.0, |t| t.get_f32(i));
            let ang = if f32_angle {
                let e = i as f32 / half as f32;
                let inv = (1.0f32 / (theta as f32).powf(e)) / f;
                (p as f32 * inv) as f64
            } else {
                p as f64 / theta.powf(i as f64 / half as f64) / f as f64
            };
            let (a, b) = if adjacent {
                (head * hd + 2 * i, head * hd + 2 * i + 1)
            } else {
                (head * hd + i, head * hd + half + i)
            };
            let (x1, x2) = (x.get_f32(a) as f64, x.get_f32(b) as f64);
            out[a] = x1 * ang.cos() - x2 * ang.sin();
            out[b] = x2 * ang.cos() + x1 * ang.sin();
        }
    }
    out
}

#[rstest]
// rank 2 [n_heads, hd]: every head at positions[0]; both pairings.
#[case(&[4, 8], 8, 10000.0, None, &[5], DType::F32, DType::F32)]
#[case(&[4, 8], 8, 10000.0, Some(1), &[5], DType::F32, DType::F32)]
#[case(&[32, 128], 128, 500000.0, Some(0), &[4095], DType::F32, DType::F32)]
#[case(&[32, 128], 128, 500000.0, Some(1), &[4095], DType::F32, DType::F32)]
// rank 1 (flat q_dim) and rank 2 [1, q_dim]; position 0 is the identity.
#[case(&[48], 16, 10000.0, None, &[0], DType::F32, DType::F32)]
#[case(&[1, 24], 6, 10.0, Some(1), &[3], DType::F32, DType::F32)]
// rank 3 [S, heads, hd]: one position per row (the roped k row is [1, n_kv, hd]).
#[case(&[1, 2, 64], 64, 10000.0, None, &[17], DType::F32, DType::F32)]
#[case(&[3, 4, 16], 16, 1000000.0, None, &[0, 9, 100000], DType::F32, DType::F32)]
#[case(&[3, 4, 16], 16, 1000000.0, Some(1), &[2, 1, 65535], DType::F32, DType::F32)]
#[case(&[5, 1, 2], 2, 10000.0, Some(0), &[1, 2, 3, 4, 5], DType::F32, DType::F32)]
// rank 3 with rows of several heads packed flat ([S, 1, heads * hd]).
#[case(&[2, 1, 24], 8, 10000.0, Some(1), &[6, 7], DType::F32, DType::F32)]
// rank 4 [B, S, heads, hd]: B·S positions.
#[case(&[2, 2, 3, 4], 4, 10000.0, None, &[1, 2, 30, 31], DType::F32, DType::F32)]
// Half-precision operands (cast on store), and narrow integer position buffers.
#[case(&[8, 64], 64, 10000.0, None, &[123], DType::F16, DType::F16)]
#[case(&[2, 4, 32], 32, 500000.0, Some(1), &[7, 8], DType::BF16, DType::F32)]
#[case(&[6, 16], 16, 10000.0, Some(0), &[77], DType::F32, DType::BF16)]
fn matches_formula(
    #[case] shape: &[u64],
    #[case] hd: usize,
    #[case] theta: f64,
    #[case] pairing: Option<i64>,
    #[case] positions: &[i64],
    #[case] dx: DType,
    #[case] dout: DType,
) {
    let mut r = rng(shape.iter().product::<u64>() + hd as u64 * 7 + positions[0] as u64);
    let x = random_nonzero(dx, shape, &mut r, -2.0, 2.0);
    let max_pos = positions.iter().copied().max().unwrap_or(0);
    let pdtype = if max_pos < 128 {
        DType::I8
    } else if max_pos < 256 {
        DType::U8
    } else {
        DType::I32
    };
    let pos = Tensor::from_i64(pdtype, &[positions.len() as u64], positions).unwrap();
    let t = rope_task(hd as i64, theta, pairing);
    let mut out = [Tensor::poisoned(dout, shape)];
    call(run, &t, &[&x, &pos], &mut out).unwrap();
    let adjacent = pairing == Some(1);
    let want = naive(&x, positions, hd, theta, adjacent, true, None);
    assert_close(&out[0], &want, 1e-6, 1e-6);
    if max_pos <= 16 {
        // At small positions the fp32 angle is as good as the exact one.
        let exact = naive(&x, positions, hd, theta, adjacent, false, None);
        assert_close(&out[0], &exact, 1e-5, 1e-5);
    }
}

#[test]
fn the_two_pairings_differ_and_position_zero_is_the_identity() {
    let mut r = rng(3);
    let x = random_nonzero(DType::F32, &[2, 8], &mut r, -1.0, 1.0);
    let at = |p: i64, pairing: i64| {
        let pos = Tensor::from_i64(DType::I32, &[1], &[p]).unwrap();
        let mut out = [Tensor::poisoned(DType::F32, &[2, 8])];
        call(
            run,
            &rope_task(8, 10000.0, Some(pairing)),
            &[&x, &pos],
            &mut out,
        )
        .unwrap();
        let [o] = out;
        o.to_f32_vec()
    };
    assert_eq!(at(0, 0), x.to_f32_vec());
    assert_eq!(at(0, 1), x.to_f32_vec());
    assert_ne!(at(3, 0), at(3, 1));
    // Rotations preserve each pair's norm: dims (i, i + 4) for rotate-half, (2i, 2i + 1) else.
    let (h, a) = (at(3, 0), at(3, 1));
    let xv = x.to_f32_vec();
    for head in 0..2 {
        for i in 0..4 {
            let b = head * 8;
            let n = |v: &[f32], p: usize, q: usize| v[b + p].hypot(v[b + q]);
            assert!((n(&h, i, i + 4) - n(&xv, i, i + 4)).abs() < 1e-6);
            assert!((n(&a, 2 * i, 2 * i + 1) - n(&xv, 2 * i, 2 * i + 1)).abs() < 1e-6);
        }
    }
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut r = rng(8);
    let x = random_nonzero(DType::F32, &[4, 8], &mut r, -1.0, 1.0);
    let pos = Tensor::from_i64(DType::I32, &[1], &[3]).unwrap();
    let ok = rope_task(8, 10000.0, None);
    let go = |t: &Task, ins: &[&Tensor], out_shape: &[u64]| {
        let mut out = [Tensor::poisoned(DType::F32, out_shape)];
        call(run, t, ins, &mut out)
    };
    assert!(go(&ok, &[&x, &pos], &[32]).is_ok());
    // Arity.
    assert!(matches!(go(&ok, &[&x], &[32]), Err(OpError::Arity { .. })));
    assert!(matches!(
        go(&ok, &[&x, &pos, &pos, &pos], &[32]),
        Err(OpError::Arity { .. })
    ));
    // A third input is the frequency factors: floats, head_dim / 2 of them.
    assert!(matches!(
        go(&ok, &[&x, &pos, &pos], &[32]),
        Err(OpError::DType(_))
    ));
    assert!(matches!(
        call(run, &ok, &[&x, &pos], &mut []),
        Err(OpError::Arity { .. })
    ));
    // Missing params.
    let t = task(Opcode::ROPE, 2, 1, &[("theta", Value::Float(1e4))]);
    assert_eq!(
        go(&t, &[&x, &pos], &[32]),
        Err(OpError::MissingParam("head_dim".into()))
    );
    let t = task(Opcode::ROPE, 2, 1, &[("head_dim", Value::Int(8))]);
    assert_eq!(
        go(&t, &[&x, &pos], &[32]),
        Err(OpError::MissingParam("theta".into()))
    );
    // Bad param values: odd or non-positive head_dim, non-positive theta, pairing ∉ {0, 1}.
    for t in [
        rope_task(7, 1e4, None),
        rope_task(0, 1e4, None),
        rope_task(-8, 1e4, None),
        rope_task(8, 0.0, None),
        rope_task(8, -5.0, None),
        rope_task(8, 1e4, Some(2)),
        rope_task(8, 1e4, Some(-1)),
    ] {
        assert!(
            matches!(go(&t, &[&x, &pos], &[32]), Err(OpError::BadParam { .. })),
            "{:?}",
            t.params
        );
    }
    // Shapes: not whole heads, output size, rank-3 rows vs positions, empty positions.
    assert!(matches!(
        go(&rope_task(6, 1e4, None), &[&x, &pos], &[32]),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        go(&ok, &[&x, &pos], &[31]),
        Err(OpError::Shape(_))
    ));
    let x3 = random_nonzero(DType::F32, &[3, 2, 8], &mut r, -1.0, 1.0);
    let two = Tensor::from_i64(DType::I32, &[2], &[1, 2]).unwrap();
    assert!(matches!(
        go(&ok, &[&x3, &two], &[48]),
        Err(OpError::Shape(_))
    ));
    let x3_ragged = random_nonzero(DType::F32, &[2, 1, 12], &mut r, -1.0, 1.0);
    assert!(matches!(
        go(&ok, &[&x3_ragged, &two], &[24]),
        Err(OpError::Shape(_))
    ));
    let empty = Tensor::zeros(DType::I32, &[0]);
    assert!(matches!(
        go(&ok, &[&x, &empty], &[32]),
        Err(OpError::Shape(_))
    ));
    // Dtypes: float positions, integer input.
    let fpos = Tensor::from_f32(DType::F32, &[1], &[3.0]).unwrap();
    assert!(matches!(
        go(&ok, &[&x, &fpos], &[32]),
        Err(OpError::DType(_))
    ));
    let xi = random_nonzero(DType::I32, &[4, 8], &mut r, 1.0, 5.0);
    assert!(matches!(
        go(&ok, &[&xi, &pos], &[32]),
        Err(OpError::DType(_))
    ));
    // Negative positions (row 1 of three).
    let neg = Tensor::from_i64(DType::I32, &[3], &[4, -2, 7]).unwrap();
    assert_eq!(
        go(&ok, &[&x3, &neg], &[48]),
        Err(OpError::IndexOutOfRange {
            at: 1,
            value: -2,
            limit: 1 << 31
        })
    );
}

use amk_core::testkit::buffer;

/// Runs ROPE's static shape rule on `x [pos] -> out` with the given params.
fn findings(x: &[u64], pos: &[u64], params: &[(&str, Value)]) -> Vec<ErrorKind> {
    let buffers = [
        buffer(0, DType::F32, x),
        buffer(1, DType::I32, pos),
        buffer(2, DType::F32, x),
    ];
    let mut t = task(Opcode::ROPE, 2, 1, params);
    t.outputs = vec![2];
    assert!(op_rope::SPEC.check.is_some(), "ROPE has a shape rule");
    shape_rule_kinds(&op_rope::SPEC, &t, &buffers)
}

#[test]
fn the_shape_rule_flags_a_bad_pairing_and_rows_without_positions() {
    let p = |pairing: i64| {
        vec![
            ("head_dim", Value::Int(8)),
            ("theta", Value::Float(1e4)),
            ("pairing", Value::Int(pairing)),
        ]
    };
    assert!(findings(&[4, 8], &[1], &p(0)).is_empty());
    assert!(findings(&[4, 8], &[1], &p(1)).is_empty());
    assert_eq!(
        findings(&[4, 8], &[1], &p(2)),
        vec![ErrorKind::TileOutOfBounds]
    );
    assert_eq!(
        findings(&[4, 8], &[1], &p(-1)),
        vec![ErrorKind::TileOutOfBounds]
    );
    // Rank 3 needs S positions, rank 4 needs B·S; rows must be whole heads.
    assert!(findings(&[3, 2, 8], &[3], &p(0)).is_empty());
    assert_eq!(
        findings(&[3, 2, 8], &[2], &p(0)),
        vec![ErrorKind::ShapeMismatch]
    );
    assert!(findings(&[2, 3, 2, 8], &[6], &p(1)).is_empty());
    assert_eq!(
        findings(&[2, 3, 2, 8], &[3], &p(1)),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        findings(&[2, 1, 12], &[2], &p(0)),
        vec![ErrorKind::ShapeMismatch]
    );
}

/// Per-pair frequency factors (Llama 3's scaling): frequency `i` is `inv_freq[i] / f[i]`, each
/// step rounded to fp32 as the spec says, against the formula evaluated here; factors of 1
/// change nothing, bit for bit.
#[rstest]
#[case(&[4, 16], 16, 10000.0, None, 11)]
#[case(&[2, 64], 64, 500000.0, Some(1), 4095)]
#[case(&[1, 3, 8], 8, 10000.0, Some(0), 37)]
fn frequency_factors_divide_the_frequencies(
    #[case] shape: &[u64],
    #[case] hd: usize,
    #[case] theta: f64,
    #[case] pairing: Option<i64>,
    #[case] position: i64,
) {
    let half = hd / 2;
    let mut r = rng(hd as u64 * 13 + position as u64);
    let x = random_nonzero(DType::F32, shape, &mut r, -2.0, 2.0);
    let f = random_nonzero(DType::F32, &[half as u64], &mut r, 1.0, 32.0);
    let pos = Tensor::from_i64(DType::I32, &[1], &[position]).unwrap();
    let mut t = rope_task(hd as i64, theta, pairing);
    t.inputs = vec![0, 1, 2];
    let mut out = [Tensor::poisoned(DType::F32, shape)];
    call(run, &t, &[&x, &pos, &f], &mut out).unwrap();
    let want = naive(
        &x,
        &[position],
        hd,
        theta,
        pairing == Some(1),
        true,
        Some(&f),
    );
    assert_close(&out[0], &want, 1e-6, 1e-6);

    let ones = Tensor::from_f32(DType::F32, &[half as u64], &vec![1.0; half]).unwrap();
    let mut with_ones = [Tensor::poisoned(DType::F32, shape)];
    call(run, &t, &[&x, &pos, &ones], &mut with_ones).unwrap();
    let t2 = rope_task(hd as i64, theta, pairing);
    let mut without = [Tensor::poisoned(DType::F32, shape)];
    call(run, &t2, &[&x, &pos], &mut without).unwrap();
    for i in 0..x.numel() {
        assert_eq!(
            with_ones[0].get_f32(i).to_bits(),
            without[0].get_f32(i).to_bits()
        );
    }
}

#[test]
fn frequency_factors_of_the_wrong_length_or_dtype_are_refused() {
    let x = Tensor::from_f32(DType::F32, &[2, 8], &[0.5; 16]).unwrap();
    let pos = Tensor::from_i64(DType::I32, &[1], &[3]).unwrap();
    let mut t = rope_task(8, 1e4, None);
    t.inputs = vec![0, 1, 2];
    let short = Tensor::from_f32(DType::F32, &[3], &[1.0; 3]).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[2, 8])];
    let err = call(run, &t, &[&x, &pos, &short], &mut out).unwrap_err();
    assert!(matches!(err, OpError::Shape(_)), "{err}");
    let ints = Tensor::from_i64(DType::I32, &[4], &[1, 1, 1, 1]).unwrap();
    let err = call(run, &t, &[&x, &pos, &ints], &mut out).unwrap_err();
    assert!(matches!(err, OpError::DType(_)), "{err}");

    // The shape rule: the factors must be head_dim / 2 floats.
    let buffers = [
        buffer(0, DType::F32, &[2, 8]),
        buffer(1, DType::I32, &[1]),
        buffer(2, DType::F32, &[2, 8]),
        buffer(3, DType::F32, &[3]),
        buffer(4, DType::F32, &[4]),
    ];
    let rule = |factors: u32| {
        let mut t = rope_task(8, 1e4, None);
        t.inputs = vec![0, 1, factors];
        t.outputs = vec![2];
        shape_rule_kinds(&op_rope::SPEC, &t, &buffers)
    };
    assert!(rule(4).is_empty());
    assert_eq!(rule(3), vec![ErrorKind::ShapeMismatch]);
}
