//! NOP's CPU reference: it accepts exactly zero operands and has no effect; any other arity
//! is a typed error. It is registered with the reference.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::testkit::{call, task};
use amk_core::{DType, OpError, Opcode, Registry, Tensor};
use op_nop::reference::run;
use rstest::rstest;

#[test]
fn no_operands_is_ok() {
    let t = task(Opcode::NOP, 0, 0, &[]);
    call(run, &t, &[], &mut []).unwrap();
}

#[rstest]
#[case(1, 0, "inputs")]
#[case(3, 0, "inputs")]
#[case(0, 1, "outputs")]
#[case(1, 1, "inputs")]
fn operands_are_arity_errors(#[case] n_in: usize, #[case] n_out: usize, #[case] which: &str) {
    let x = Tensor::zeros(DType::F32, &[4]);
    let ins: Vec<&Tensor> = (0..n_in).map(|_| &x).collect();
    let mut outs: Vec<Tensor> = (0..n_out)
        .map(|_| Tensor::poisoned(DType::F32, &[4]))
        .collect();
    let t = task(Opcode::NOP, n_in, n_out, &[]);
    match call(run, &t, &ins, &mut outs) {
        Err(OpError::Arity { what, .. }) => assert_eq!(what, which),
        other => panic!("{other:?}"),
    }
    // Nothing was written.
    assert!(
        outs.iter()
            .all(|o| o.to_f32_vec().iter().all(|v| v.is_nan()))
    );
}

#[test]
fn registered_with_its_reference() {
    let reg = Registry::builtin().unwrap();
    let r = reg.reference(Opcode::NOP).expect("NOP has a CPU reference");
    assert!(r.in_place.is_empty());
    let amk_core::RunFn::Static(run) = r.run else {
        panic!("NOP is a static reference")
    };
    call(run, &task(Opcode::NOP, 0, 0, &[]), &[], &mut []).unwrap();
}
