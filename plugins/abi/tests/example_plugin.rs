//! Loads the example plugin's shared library (`libamk_plugin_example_gelu_tanh.so`, built by
//! cargo because this crate dev-depends on the example, whose `crate-type` includes `cdylib`),
//! validates and runs a program using its op on the CPU VM, and checks every refusal path
//! reachable with real files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cpu::CpuBackend;
use amk_core::json::Map;
use amk_core::{Backend, BufferKind, DType, Opcode, Origin, Program, Tensor, WeightStore};
use amk_plugin_abi::{PluginError, PluginRegistry, load_plugin_with_entry};
use std::path::PathBuf;

/// The example's cdylib, built by cargo because this crate dev-depends on the example.
fn example_so() -> PathBuf {
    amk_plugin_abi::find_built_cdylib("amk_plugin_example_gelu_tanh")
        .expect("the example plugin's shared library next to the test executable")
}

fn gelu_tanh_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn the_example_loads_validates_and_runs_on_the_cpu_vm() {
    let so = example_so();
    let mut reg = amk_ops::registry().unwrap();
    let n_builtin = reg.len();
    let loaded = reg.load_plugin(&so).unwrap();
    assert_eq!(loaded.name, "amk-example-gelu-tanh");
    assert_eq!(loaded.ops.len(), 1);
    let op = &loaded.ops[0];
    let code = Opcode(amk_plugin_example_gelu_tanh::CODE as u16);
    assert_eq!((op.name.as_str(), op.code), ("example.gelu_tanh", code));
    let cuda = op.cuda.as_ref().unwrap();
    assert_eq!(cuda.entry, "amk_example_gelu_tanh");
    assert!(cuda.source.contains("tanhf"));
    assert_eq!(reg.len(), n_builtin + 1);
    assert_eq!(reg.origin(code), Some(&Origin::Plugin(so.clone())));
    assert_eq!(reg.resolve_name("example.gelu_tanh"), Some(code));
    assert!(reg.reference(code).is_some());

    // z = gelu(x) (f32), yb = gelu(x) (bf16), w = z + x after z is complete.
    let shape = [3u64, 5];
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &shape);
    let z = p.new_buffer("z", BufferKind::IO_OUTPUT, DType::F32, &shape);
    let yb = p.new_buffer("yb", BufferKind::IO_OUTPUT, DType::BF16, &shape);
    let w = p.new_buffer("w", BufferKind::IO_OUTPUT, DType::F32, &shape);
    let (cz, cy, cw) = (p.new_counter("z"), p.new_counter("yb"), p.new_counter("w"));
    p.push_task(code, &[x], &[z], cz, &[], Map::new(), "gelu f32");
    p.push_task(code, &[x], &[yb], cy, &[], Map::new(), "gelu bf16");
    p.push_task(
        Opcode::ADD,
        &[z, x],
        &[w],
        cw,
        &[(cz, 1)],
        Map::new(),
        "residual",
    );
    let validated =
        amk_core::validate_owned(p, &reg).unwrap_or_else(|r| panic!("rejected: {}", r.report()));

    let xs: Vec<f32> = (0..15).map(|i| (i as f32 - 7.0) * 0.83).collect();
    let mut session = CpuBackend::default()
        .load(&validated, &WeightStore::new(), &reg)
        .unwrap();
    let out = session
        .step(&[("x", Tensor::from_f32(DType::F32, &shape, &xs).unwrap())])
        .unwrap();
    let (zv, yv, wv) = (
        out.get("z").unwrap().to_f32_vec(),
        out.get("yb").unwrap().to_f32_vec(),
        out.get("w").unwrap().to_f32_vec(),
    );
    for (i, &xi) in xs.iter().enumerate() {
        let want = gelu_tanh_f64(f64::from(xi));
        assert!(
            (f64::from(zv[i]) - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "z[{i}]"
        );
        assert!(
            (f64::from(yv[i]) - want).abs() <= 8e-3 * (1.0 + want.abs()),
            "yb[{i}]"
        );
        let w_want = want + f64::from(xi);
        assert!(
            (f64::from(wv[i]) - w_want).abs() <= 1e-5 * (1.0 + w_want.abs()),
            "w[{i}]"
        );
    }

    // A wrong operand count is refused before the plugin is called.
    let mut bad = Program::new();
    let a = bad.new_buffer("a", BufferKind::IO_INPUT, DType::F32, &[2]);
    let b = bad.new_buffer("b", BufferKind::IO_OUTPUT, DType::F32, &[2]);
    let c = bad.new_counter("b");
    bad.push_task(code, &[a, a], &[b], c, &[], Map::new(), "two inputs");
    assert!(amk_core::validate_owned(bad, &reg).is_err());
}

#[test]
fn loading_twice_is_a_duplicate() {
    let so = example_so();
    let mut reg = amk_ops::registry().unwrap();
    reg.load_plugin(&so).unwrap();
    let e = reg.load_plugin(&so).unwrap_err();
    assert!(matches!(e, PluginError::Registry { .. }), "{e}");
    assert!(e.to_string().contains("already registered"), "{e}");
}

#[test]
fn missing_files_non_libraries_and_missing_symbols_are_refused() {
    let mut reg = amk_ops::registry().unwrap();
    let n = reg.len();
    let e = reg.load_plugin("/nonexistent/libnothing.so").unwrap_err();
    assert!(matches!(e, PluginError::NotFound { .. }), "{e}");

    let dir = std::env::temp_dir().join(format!("amk-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("not-a-library.so");
    std::fs::write(&text, b"this is not an ELF file\n").unwrap();
    let e = reg.load_plugin(&text).unwrap_err();
    assert!(matches!(e, PluginError::Load { .. }), "{e}");
    assert!(e.to_string().contains("cannot load"), "{e}");
    // The dynamic loader's own reason (glibc: "invalid ELF header"), not only "dlopen failed".
    let PluginError::Load { reason, .. } = &e else {
        unreachable!()
    };
    assert!(
        reason.contains("not-a-library.so") && !reason.ends_with("dlopen failed"),
        "{e}"
    );

    let e = load_plugin_with_entry(&mut reg, &example_so(), "amk_plugin_entry_v9000").unwrap_err();
    assert!(
        matches!(&e, PluginError::MissingEntry { symbol, .. } if symbol == "amk_plugin_entry_v9000"),
        "{e}"
    );
    assert_eq!(reg.len(), n);
    let _ = std::fs::remove_dir_all(&dir);
}
