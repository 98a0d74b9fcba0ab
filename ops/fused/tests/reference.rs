//! FUSED's CPU reference against independent f64 formulas: recipes of real ops (ADD, MUL,
//! SILU_MUL, GEMV_TILE) plus a few test-local ops for what no real op shows here (a reduction
//! into a differently shaped scratch, an in-place pair, an op without a reference). Inputs are
//! random and non-zero, outputs poisoned, and every refusal is a typed `OpError`.

use amk_core::json::{Value, parse};
use amk_core::testkit::{assert_close, call, call_with, random_nonzero, rng, task};
use amk_core::{
    CpuCall, DType, Input, OpError, OpSpec, Opcode, Origin, ParamDecl, ParamType, Reference,
    Registry, Tensor, WriteRegion,
};
use half::{bf16, f16};
use op_fused::reference::run;
use rstest::rstest;
use std::borrow::Cow;

/// Test-local ops and helpers (a `cfg(test)` module, so clippy treats them as test code).
#[cfg(test)]
mod helpers {
    use super::*;

    // ---------------------------------------------------------------------------------------------
    // Test-local ops (plugin codes, so they never collide with the real ones).

    const SCALE: Opcode = Opcode(1000);
    const ROWSUM: Opcode = Opcode(1001);
    const ACCUM: Opcode = Opcode(1002);
    const NOREF: Opcode = Opcode(1003);

    const fn spec(code: Opcode, name: &'static str, lo: u8, hi: u8) -> OpSpec {
        OpSpec {
            code,
            name: Cow::Borrowed(name),
            min_inputs: lo,
            max_inputs: Some(hi),
            n_outputs: Some(1),
            params: Cow::Borrowed(&[]),
            write_region: WriteRegion::Whole,
            check: None,
            summary: Cow::Borrowed("test op"),
        }
    }

    /// `out = x · scale` (required real param).
    fn scale_run(c: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
        c.expect_arity(1, 1, 1)?;
        let s = c.real("scale")? as f32;
        let x = c.input(0)?;
        let out = c.output(0)?;
        for i in 0..out.numel() {
            out.set_f32(i, x.get_f32(i) * s);
        }
        Ok(())
    }

    /// `out[r] = Σ_k x[r, k]` over the last dim.
    fn rowsum_run(c: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
        c.expect_arity(1, 1, 1)?;
        let x = c.input(0)?;
        let k = x.last_dim();
        let out = c.output(0)?;
        if out.numel() * k != x.numel() {
            return Err(OpError::Shape("rowsum".into()));
        }
        for r in 0..out.numel() {
            out.set_f32(r, (0..k).map(|j| x.get_f32(r * k + j)).sum());
        }
        Ok(())
    }

    /// `out += y`, where `out` is input 0 written in place.
    fn accum_run(c: &mut CpuCall<'_, '_>) -> Result<(), OpError> {
        c.expect_arity(2, 2, 1)?;
        if !matches!(c.inputs[0], Input::InPlace(0)) {
            return Err(OpError::Shape("ACCUM's input 0 must be in place".into()));
        }
        let y = c.input(1)?;
        let out = c.output(0)?;
        for i in 0..out.numel() {
            out.set_f32(i, out.get_f32(i) + y.get_f32(i));
        }
        Ok(())
    }

    pub(super) fn registry() -> Registry {
        let mut reg = Registry::empty();
        let mut add = |spec: OpSpec, r: Option<Reference>| {
            reg.register_with(spec, Origin::Builtin, r).unwrap();
        };
        let plain = |run| Some(Reference { run, in_place: &[] });
        add(op_add::SPEC, plain(op_add::reference::run));
        add(op_fused::SPEC, plain(run));
        add(op_mul::SPEC, plain(op_mul::reference::run));
        add(op_silu_mul::SPEC, plain(op_silu_mul::reference::run));
        add(op_gemv_tile::SPEC, plain(op_gemv_tile::reference::run));
        let mut scale = spec(SCALE, "test.SCALE", 1, 1);
        scale.params = Cow::Owned(vec![ParamDecl::required("scale", ParamType::Real)]);
        add(scale, plain(scale_run));
        add(spec(ROWSUM, "test.ROWSUM", 1, 1), plain(rowsum_run));
        add(
            spec(ACCUM, "test.ACCUM", 2, 2),
            Some(Reference {
                run: accum_run,
                in_place: &[(0, 0)],
            }),
        );
        add(spec(NOREF, "test.NOREF", 1, 1), None);
        reg
    }

    /// A FUSED task over `n_in` inputs whose recipe is the JSON `steps` array.
    pub(super) fn fused(n_in: usize, steps: &str) -> amk_core::Task {
        let recipe = parse(&format!("{{\"steps\": {steps}}}")).unwrap();
        task(Opcode::FUSED, n_in, 1, &[("recipe", recipe)])
    }

    pub(super) fn inputs(
        n: usize,
        dtype: DType,
        shape: &[u64],
        seed: u64,
        lo: f64,
        hi: f64,
    ) -> Vec<Tensor> {
        let mut r = rng(seed);
        (0..n)
            .map(|_| random_nonzero(dtype, shape, &mut r, lo, hi))
            .collect()
    }

    pub(super) fn f64s(t: &Tensor) -> Vec<f64> {
        (0..t.numel()).map(|i| t.get_f32(i) as f64).collect()
    }

    /// Runs `t` with the test registry; returns the result and the (initially poisoned) output.
    pub(super) fn exec(
        t: &amk_core::Task,
        ins: &[Tensor],
        out_dtype: DType,
        out_shape: &[u64],
    ) -> (Result<(), OpError>, Tensor) {
        let reg = registry();
        let refs: Vec<&Tensor> = ins.iter().collect();
        let mut out = [Tensor::poisoned(out_dtype, out_shape)];
        let r = call_with(run, t, &refs, &mut out, Some(&reg));
        let [o] = out;
        (r, o)
    }

    pub(super) fn recipe_err(r: Result<(), OpError>) -> String {
        match r {
            Err(OpError::Recipe(m)) => m,
            other => panic!("expected OpError::Recipe, got {other:?}"),
        }
    }

    pub(super) fn assert_untouched(out: &Tensor) {
        assert!(
            (0..out.numel()).all(|i| out.get_f32(i).is_nan()),
            "a refused recipe must not write the output"
        );
    }

    /// f32 rounding of an f64 value (what an F32 scratch holds).
    pub(super) fn r32(x: f64) -> f64 {
        x as f32 as f64
    }
}

use helpers::*;

// ---------------------------------------------------------------------------------------------
// Numerics.

/// `(a + b) + c` through scratch slot 0, across shapes and dtypes.
#[rstest]
#[case(&[], DType::F32, DType::F32)]
#[case(&[7], DType::F32, DType::F32)]
#[case(&[3, 5], DType::F32, DType::F32)]
#[case(&[2, 3, 4], DType::F16, DType::F32)]
#[case(&[1, 2, 3, 5], DType::BF16, DType::BF16)]
#[case(&[4, 33], DType::F32, DType::F16)]
fn two_adds_through_scratch(#[case] shape: &[u64], #[case] din: DType, #[case] dout: DType) {
    let ins = inputs(3, din, shape, 11 + shape.len() as u64, -4.0, 4.0);
    let t = fused(
        3,
        r#"[{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0},
            {"op": 11, "args": [{"s": 0}, {"in": 2}], "out": "final"}]"#,
    );
    let (r, out) = exec(&t, &ins, dout, shape);
    r.unwrap();
    let (a, b, c) = (f64s(&ins[0]), f64s(&ins[1]), f64s(&ins[2]));
    let want: Vec<f64> = (0..a.len()).map(|i| r32(a[i] + b[i]) + c[i]).collect();
    assert_close(&out, &want, 1e-7, 0.0);
}

/// `-1` is the same as `"final"`; a one-step recipe writes the output directly.
#[test]
fn one_step_with_out_minus_one() {
    let ins = inputs(2, DType::F32, &[9], 3, -2.0, 2.0);
    let t = fused(
        2,
        r#"[{"op": 11, "args": [{"in": 1}, {"in": 0}], "out": -1}]"#,
    );
    let (r, out) = exec(&t, &ins, DType::F32, &[9]);
    r.unwrap();
    let (a, b) = (f64s(&ins[0]), f64s(&ins[1]));
    let want: Vec<f64> = (0..9).map(|i| a[i] + b[i]).collect();
    assert_close(&out, &want, 1e-7, 0.0);
}

/// Slots are overwritten by later steps (even by a step reading the slot it overwrites) and
/// every read sees the latest write.
#[test]
fn scratch_slots_are_reused() {
    let ins = inputs(3, DType::F32, &[4, 6], 5, -3.0, 3.0);
    let t = fused(
        3,
        r#"[{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0},
            {"op": 11, "args": [{"s": 0}, {"in": 2}], "out": 7},
            {"op": 11, "args": [{"s": 7}, {"in": 0}], "out": 0},
            {"op": 11, "args": [{"s": 0}, {"s": 0}], "out": 0},
            {"op": 11, "args": [{"s": 0}, {"s": 7}], "out": "final"}]"#,
    );
    let (r, out) = exec(&t, &ins, DType::F32, &[4, 6]);
    r.unwrap();
    let (a, b, c) = (f64s(&ins[0]), f64s(&ins[1]), f64s(&ins[2]));
    let want: Vec<f64> = (0..a.len())
        .map(|i| {
            let s0 = r32(a[i] + b[i]);
            let s7 = r32(s0 + c[i]);
            let s0 = r32(s7 + a[i]);
            let s0 = r32(s0 + s0);
            s0 + s7
        })
        .collect();
    assert_close(&out, &want, 1e-7, 0.0);
}

/// One task input feeds several arguments and several steps.
#[test]
fn an_input_is_read_more_than_once() {
    let ins = inputs(1, DType::BF16, &[2, 8], 7, -4.0, 4.0);
    let t = fused(
        1,
        r#"[{"op": 11, "args": [{"in": 0}, {"in": 0}], "out": 0},
            {"op": 11, "args": [{"s": 0}, {"in": 0}], "out": "final"}]"#,
    );
    let (r, out) = exec(&t, &ins, DType::F32, &[2, 8]);
    r.unwrap();
    let a = f64s(&ins[0]);
    let want: Vec<f64> = a.iter().map(|&x| r32(x + x) + x).collect();
    assert_close(&out, &want, 1e-7, 0.0);
    assert_eq!(ins[0], inputs(1, DType::BF16, &[2, 8], 7, -4.0, 4.0)[0]);
}

/// `out_dtype` sets the scratch type: values are rounded (floats) or truncated and saturated
/// (ints) on store, and `float64` keeps fp32 (tensors have no f64).
#[rstest]
#[case("float32")]
#[case("float64")]
#[case("float16")]
#[case("bfloat16")]
#[case("int8")]
#[case("int32")]
fn out_dtype_casts_the_scratch(#[case] dt: &str) {
    let ins = inputs(3, DType::F32, &[5, 7], 13, -100.0, 100.0);
    let t = fused(
        3,
        &format!(
            r#"[{{"op": 11, "args": [{{"in": 0}}, {{"in": 1}}], "out": 2, "out_dtype": "{dt}"}},
                {{"op": 11, "args": [{{"s": 2}}, {{"in": 2}}], "out": "final"}}]"#
        ),
    );
    let (r, out) = exec(&t, &ins, DType::F32, &[5, 7]);
    r.unwrap();
    let cast = |x: f64| -> f64 {
        match dt {
            "float32" | "float64" => r32(x),
            "float16" => f16::from_f64(x).to_f64(),
            "bfloat16" => bf16::from_f64(x).to_f64(),
            "int8" => x.trunc().clamp(-128.0, 127.0),
            "int32" => x.trunc(),
            _ => unreachable!(),
        }
    };
    let (a, b, c) = (f64s(&ins[0]), f64s(&ins[1]), f64s(&ins[2]));
    // The sum a + b is formed in fp32 by ADD, then cast on store into the scratch.
    let want: Vec<f64> = (0..a.len())
        .map(|i| cast(r32(a[i] + b[i])) + c[i])
        .collect();
    assert_close(&out, &want, 1e-7, 0.0);
    if dt == "int8" {
        // The inputs span ±100, so some sums saturate: the cast is really observed.
        assert!((0..a.len()).any(|i| (a[i] + b[i]).abs() > 127.0));
    }
}

/// A SwiGLU-style chain of real ops: `silu(g) · u`, times `w`, times the param `scale` (MUL's
/// one-input form, so the step's params must reach it).
#[rstest]
#[case(&[16], DType::F32)]
#[case(&[2, 24], DType::BF16)]
#[case(&[3, 1, 8], DType::F16)]
fn silu_mul_then_muls(#[case] shape: &[u64], #[case] dout: DType) {
    let ins = inputs(3, DType::F32, shape, 43 + shape.len() as u64, -4.0, 4.0);
    let t = fused(
        3,
        r#"[{"op": 9, "args": [{"in": 0}, {"in": 1}], "out": 0},
            {"op": 12, "args": [{"s": 0}, {"in": 2}], "out": 1},
            {"op": 12, "args": [{"s": 1}], "out": "final", "params": {"scale": 0.25}}]"#,
    );
    let (r, out) = exec(&t, &ins, dout, shape);
    r.unwrap();
    let (g, u, w) = (f64s(&ins[0]), f64s(&ins[1]), f64s(&ins[2]));
    let want: Vec<f64> = (0..g.len())
        .map(|i| g[i] / (1.0 + (-g[i]).exp()) * u[i] * w[i] * 0.25)
        .collect();
    assert_close(&out, &want, 1e-5, 0.0);
}

/// A projection with bias, then the residual: `GEMV_TILE(x, W, bias)` into a `[1, N]`
/// scratch, then `ADD` with the residual into the output.
#[rstest]
#[case(8, 12, DType::F32)]
#[case(64, 32, DType::BF16)]
fn gemv_bias_then_residual(#[case] k: u64, #[case] n: u64, #[case] wdt: DType) {
    let mut r = rng(47 + k);
    let x = random_nonzero(DType::F32, &[1, k], &mut r, -1.0, 1.0);
    let w = random_nonzero(wdt, &[n, k], &mut r, -1.0, 1.0);
    let bias = random_nonzero(DType::F32, &[n], &mut r, -1.0, 1.0);
    let res = random_nonzero(DType::F32, &[1, n], &mut r, -1.0, 1.0);
    let t = fused(
        4,
        &format!(
            r#"[{{"op": 5, "args": [{{"in": 0}}, {{"in": 1}}, {{"in": 2}}], "out": 0,
                  "params": {{"K": {k}, "N_tile": {n}, "n_off": 0}}}},
                {{"op": 11, "args": [{{"s": 0}}, {{"in": 3}}], "out": "final"}}]"#
        ),
    );
    let (rr, out) = exec(
        &t,
        &[x.clone(), w.clone(), bias.clone(), res.clone()],
        DType::F32,
        &[1, n],
    );
    rr.unwrap();
    let (xs, ws, bs, rs) = (f64s(&x), f64s(&w), f64s(&bias), f64s(&res));
    let want: Vec<f64> = (0..n as usize)
        .map(|j| {
            let dot: f64 = (0..k as usize)
                .map(|c| xs[c] * ws[j * k as usize + c])
                .sum();
            dot + bs[j] + rs[j]
        })
        .collect();
    assert_close(&out, &want, 1e-5, 1e-5);
}

/// The final output is not cleared before the last step: a GEMV tile written straight into it
/// leaves the other columns as they were.
#[test]
fn final_step_writes_only_its_region() {
    let mut r = rng(53);
    let x = random_nonzero(DType::F32, &[1, 8], &mut r, -1.0, 1.0);
    let w = random_nonzero(DType::F32, &[12, 8], &mut r, -1.0, 1.0);
    let t = fused(
        2,
        r#"[{"op": 5, "args": [{"in": 0}, {"in": 1}], "out": "final",
             "params": {"K": 8, "N_tile": 4, "n_off": 4}}]"#,
    );
    let (rr, out) = exec(&t, &[x.clone(), w.clone()], DType::F32, &[1, 12]);
    rr.unwrap();
    let (xs, ws) = (f64s(&x), f64s(&w));
    for j in 0..12 {
        let got = out.get_f32(j) as f64;
        if (4..8).contains(&j) {
            let want: f64 = (0..8).map(|c| xs[c] * ws[j * 8 + c]).sum();
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "col {j}: {got} vs {want}"
            );
        } else {
            assert!(got.is_nan(), "col {j} outside the tile was written: {got}");
        }
    }
}

/// A step's params reach its op; `out_shape` shapes the scratch (here a reduction into a
/// smaller scratch, then a broadcast-free ADD against a same-sized input).
#[test]
fn params_and_out_shape_reach_the_step() {
    let mut r = rng(17);
    let x = random_nonzero(DType::F32, &[3, 8], &mut r, -2.0, 2.0);
    let y = random_nonzero(DType::F32, &[3], &mut r, -2.0, 2.0);
    let t = fused(
        2,
        r#"[{"op": 1000, "args": [{"in": 0}], "out": 0, "out_shape": [3, 8],
             "params": {"scale": 0.5}},
            {"op": 1001, "args": [{"s": 0}], "out": 1, "out_shape": [3]},
            {"op": 11, "args": [{"s": 1}, {"in": 1}], "out": "final"}]"#,
    );
    let (res, out) = exec(&t, &[x.clone(), y.clone()], DType::F32, &[3]);
    res.unwrap();
    let (xs, ys) = (f64s(&x), f64s(&y));
    let want: Vec<f64> = (0..3)
        .map(|row| (0..8).map(|k| 0.5 * xs[row * 8 + k]).sum::<f64>() + ys[row])
        .collect();
    assert_close(&out, &want, 1e-6, 1e-6);
}

/// The default scratch shape is the task output's; a scratch whose shape does not fit the
/// step's op fails that step, named by index.
#[test]
fn default_scratch_shape_is_the_outputs() {
    let x = inputs(1, DType::F32, &[3, 8], 19, -2.0, 2.0);
    let t = fused(
        1,
        r#"[{"op": 1001, "args": [{"in": 0}], "out": 0},
            {"op": 11, "args": [{"s": 0}, {"s": 0}], "out": "final"}]"#,
    );
    // Output [3]: the ROWSUM scratch is [3] too.
    let (res, out) = exec(&t, &x, DType::F32, &[3]);
    res.unwrap();
    let xs = f64s(&x[0]);
    let want: Vec<f64> = (0..3)
        .map(|row| 2.0 * (0..8).map(|k| xs[row * 8 + k]).sum::<f64>())
        .collect();
    assert_close(&out, &want, 1e-6, 1e-6);
    // Output [3, 8]: so is the scratch, which ROWSUM refuses.
    let (res, out) = exec(&t, &x, DType::F32, &[3, 8]);
    let m = recipe_err(res);
    assert!(
        m.contains("recipe step 0") && m.contains("test.ROWSUM"),
        "{m}"
    );
    assert_untouched(&out);
}

/// An op's in-place pair: its output starts as the argument, passed as `Input::InPlace`.
#[test]
fn in_place_step_ops_start_from_their_argument() {
    let ins = inputs(3, DType::F32, &[10], 23, -3.0, 3.0);
    let t = fused(
        3,
        r#"[{"op": 1002, "args": [{"in": 0}, {"in": 1}], "out": 0},
            {"op": 1002, "args": [{"s": 0}, {"in": 2}], "out": "final"}]"#,
    );
    let (r, out) = exec(&t, &ins, DType::F32, &[10]);
    r.unwrap();
    let (a, b, c) = (f64s(&ins[0]), f64s(&ins[1]), f64s(&ins[2]));
    let want: Vec<f64> = (0..10).map(|i| r32(a[i] + b[i]) + c[i]).collect();
    assert_close(&out, &want, 1e-7, 0.0);

    // An argument of another dtype (here F32 into the F16 final output) cannot be the
    // output's buffer.
    let t = fused(
        3,
        r#"[{"op": 1002, "args": [{"in": 0}, {"in": 1}], "out": "final"}]"#,
    );
    let (r, out) = exec(&t, &ins, DType::F16, &[10]);
    let m = recipe_err(r);
    assert!(m.contains("recipe step 0") && m.contains("in place"), "{m}");
    assert_untouched(&out);
}

// ---------------------------------------------------------------------------------------------
// Refusals.

/// The structural rule runs before any step, so a bad recipe never touches the output.
#[rstest]
#[case::nested_fused(
    r#"[{"op": 19, "args": [{"in": 0}], "out": "final", "params": {"recipe": {}}}]"#,
    "nests FUSED"
)]
#[case::unwritten_slot(
    r#"[{"op": 11, "args": [{"in": 0}, {"s": 3}], "out": "final"}]"#,
    "scratch slot 3 before any step writes it"
)]
#[case::slot_written_later(
    r#"[{"op": 11, "args": [{"in": 0}, {"s": 0}], "out": 1},
        {"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0},
        {"op": 11, "args": [{"s": 0}, {"s": 1}], "out": "final"}]"#,
    "scratch slot 0 before any step writes it"
)]
#[case::bad_input_index(
    r#"[{"op": 11, "args": [{"in": 0}, {"in": 2}], "out": "final"}]"#,
    "reads task input 2; the task has 2"
)]
#[case::negative_input_index(
    r#"[{"op": 11, "args": [{"in": -1}, {"in": 0}], "out": "final"}]"#,
    "reads task input -1"
)]
#[case::no_final(
    r#"[{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0}]"#,
    "writes scratch slot 0, not the task output"
)]
#[case::two_finals(
    r#"[{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": "final"},
        {"op": 11, "args": [{"in": 0}, {"in": 1}], "out": -1}]"#,
    "exactly one step"
)]
#[case::no_steps("[]", "no steps")]
#[case::unknown_op(
    r#"[{"op": 4242, "args": [{"in": 0}], "out": "final"}]"#,
    "not registered"
)]
#[case::arity(r#"[{"op": 11, "args": [{"in": 0}], "out": "final"}]"#, "argument(s)")]
#[case::missing_param(
    r#"[{"op": 1000, "args": [{"in": 0}], "out": "final"}]"#,
    "lacks the param 'scale'"
)]
#[case::bad_out_dtype(
    r#"[{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0, "out_dtype": "float8"},
        {"op": 11, "args": [{"s": 0}, {"in": 1}], "out": "final"}]"#,
    "out_dtype"
)]
#[case::bad_arg(
    r#"[{"op": 11, "args": [{"in": 0, "s": 0}, {"in": 1}], "out": "final"}]"#,
    "must be {\"in\": k} or {\"s\": j}"
)]
fn static_rule_rejections_are_recipe_errors(#[case] steps: &str, #[case] want: &str) {
    let ins = inputs(2, DType::F32, &[6], 29, -1.0, 1.0);
    let (r, out) = exec(&fused(2, steps), &ins, DType::F32, &[6]);
    let m = recipe_err(r);
    assert!(m.contains(want), "message {m:?} lacks {want:?}");
    assert_untouched(&out);
}

/// A step op with no CPU reference fails that step (earlier steps may have run into scratch,
/// but the output stays unwritten).
#[test]
fn step_op_without_a_reference() {
    let ins = inputs(2, DType::F32, &[6], 31, -1.0, 1.0);
    let t = fused(
        2,
        r#"[{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": 0},
            {"op": 1003, "args": [{"s": 0}], "out": "final"}]"#,
    );
    let (r, out) = exec(&t, &ins, DType::F32, &[6]);
    let m = recipe_err(r);
    assert!(
        m.contains("recipe step 1") && m.contains("test.NOREF has no CPU reference"),
        "{m}"
    );
    assert_untouched(&out);
}

/// A step's own error is wrapped as a recipe error naming the step and the op.
#[test]
fn step_errors_name_the_step() {
    let mut r = rng(37);
    let a = random_nonzero(DType::F32, &[6], &mut r, -1.0, 1.0);
    let b = random_nonzero(DType::F32, &[5], &mut r, -1.0, 1.0);
    let t = fused(
        2,
        r#"[{"op": 11, "args": [{"in": 0}, {"in": 0}], "out": 0},
            {"op": 11, "args": [{"s": 0}, {"in": 1}], "out": "final"}]"#,
    );
    let (res, out) = exec(&t, &[a, b], DType::F32, &[6]);
    let m = recipe_err(res);
    assert!(
        m.contains("recipe step 1") && m.contains("ADD") && m.contains("shape"),
        "{m}"
    );
    assert_untouched(&out);
}

/// Without a registry the recipe's ops cannot be found.
#[test]
fn no_registry_is_a_recipe_error() {
    let ins = inputs(2, DType::F32, &[4], 41, -1.0, 1.0);
    let t = fused(
        2,
        r#"[{"op": 11, "args": [{"in": 0}, {"in": 1}], "out": "final"}]"#,
    );
    let mut out = [Tensor::poisoned(DType::F32, &[4])];
    let r = call(run, &t, &[&ins[0], &ins[1]], &mut out);
    let m = recipe_err(r);
    assert!(m.contains("registry"), "{m}");
    assert_untouched(&out[0]);
}

/// Missing or mistyped `recipe` params and wrong operand counts are their own typed errors.
#[test]
fn bad_calls_are_typed_errors() {
    let reg = registry();
    let a = Tensor::zeros(DType::F32, &[4]);
    let ok = fused(
        1,
        r#"[{"op": 11, "args": [{"in": 0}, {"in": 0}], "out": "final"}]"#,
    );
    let mut out = [Tensor::zeros(DType::F32, &[4])];
    assert!(matches!(
        call_with(run, &task(Opcode::FUSED, 1, 1, &[]), &[&a], &mut out, Some(&reg)),
        Err(OpError::MissingParam(k)) if k == "recipe"
    ));
    let t = task(Opcode::FUSED, 1, 1, &[("recipe", Value::Int(3))]);
    assert!(matches!(
        call_with(run, &t, &[&a], &mut out, Some(&reg)),
        Err(OpError::BadParam { key, .. }) if key == "recipe"
    ));
    assert!(matches!(
        call_with(run, &ok, &[], &mut out, Some(&reg)),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call_with(run, &ok, &[&a], &mut [], Some(&reg)),
        Err(OpError::Arity {
            what: "outputs",
            ..
        })
    ));
    call_with(run, &ok, &[&a], &mut out, Some(&reg)).unwrap();
}

/// FUSED registers its reference with the built-in ops.
#[test]
fn fused_is_registered_with_its_reference() {
    let reg = Registry::builtin().unwrap();
    assert!(reg.reference(Opcode::FUSED).is_some());
    assert!(reg.reference(Opcode::ADD).is_some());
}
