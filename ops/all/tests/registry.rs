//! The built-in registry holds exactly the 20 ABI opcodes and our 12 appended ones (the fused
//! decode ops, codes 20–23, NEXT_TOKEN, 24, the split-KV pair ATTENTION_SPLIT, 25, and
//! COMBINE_GEMV, 26, the prefill pair LINEAR_TILE, 27, and ATTENTION_CAUSAL, 28, the
//! scorer's TOKEN_NLL, 29, the split-KV merge ATTENTION_MERGE, 30, and the decode tail's
//! LOGIT_STATS, 31), under
//! their canonical codes and names, with the
//! arities of docs/ir.md, "Opcodes and params" (with our GEMV/GEMM 2–4 inputs fix and the
//! position inputs: KV_APPEND's third input, which makes its `pos` param optional,
//! ATTENTION_GEMV's sixth).

use amk_core::{Opcode, Origin, ParamType};
use rstest::rstest;

#[test]
fn registry_holds_exactly_the_abi_and_extended_opcodes() {
    let reg = amk_ops::registry().unwrap();
    assert_eq!(reg.len(), 32);
    let codes: Vec<u16> = reg.iter().map(|(s, _)| s.code.0).collect();
    assert_eq!(codes, (0..32).collect::<Vec<u16>>());
    assert_eq!(
        Opcode::EXTENDED_OPS.iter().map(|o| o.0).collect::<Vec<_>>(),
        [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
    );
    for (spec, origin) in reg.iter() {
        assert_eq!(
            Some(spec.name.as_ref()),
            spec.code.abi_name().or(spec.code.extended_name())
        );
        assert_eq!(spec.code.to_string(), spec.name);
        assert_eq!(*origin, Origin::Builtin);
        assert_eq!(reg.resolve_name(&spec.name), Some(spec.code));
        assert!(
            reg.reference(spec.code).is_some(),
            "{} has a CPU reference",
            spec.name
        );
        // Only FUSED's tasks expand into steps (the backends learn its steps through this).
        assert_eq!(
            reg.expansion(spec.code).is_some(),
            spec.code == Opcode::FUSED,
            "{}",
            spec.name
        );
    }
}

#[rstest]
#[case("NOP", 0, 0, Some(0), Some(0), &[])]
#[case("COPY", 1, 1, Some(1), Some(1), &[])]
#[case("EMBED", 2, 2, Some(2), Some(1), &["hidden"])]
#[case("RMSNORM", 3, 2, Some(2), Some(1), &["eps", "hidden"])]
#[case("LAYERNORM", 4, 2, Some(3), Some(1), &["eps", "hidden"])]
#[case("GEMV_TILE", 5, 2, Some(4), Some(1), &["K", "N_tile", "n_off"])]
#[case("GEMM_TILE", 6, 2, Some(4), Some(1), &["M_tile", "K", "N_tile", "n_off"])]
#[case("ATTENTION_TILE", 7, 3, Some(4), Some(1), &["head_dim", "kv_start", "kv_len", "scale", "n_heads", "n_kv_heads"])]
#[case("ROPE", 8, 2, Some(3), Some(1), &["head_dim", "theta"])]
#[case("SILU_MUL", 9, 2, Some(2), Some(1), &[])]
#[case("GELU", 10, 1, Some(1), Some(1), &[])]
#[case("ADD", 11, 2, Some(2), Some(1), &[])]
#[case("MUL", 12, 1, Some(2), Some(1), &[])]
#[case("DEQUANT", 13, 2, Some(3), Some(1), &["qdtype", "group"])]
#[case("SOFTMAX", 14, 1, Some(1), Some(1), &[])]
#[case("ALLREDUCE_SHARD", 15, 1, Some(8), Some(1), &[])]
#[case("KV_APPEND", 16, 2, Some(3), Some(1), &[])]
#[case("SAMPLE_ARGMAX", 17, 1, Some(1), Some(1), &[])]
#[case("ATTENTION_COMBINE", 18, 2, Some(8), Some(1), &["head_dim"])]
#[case("FUSED", 19, 1, None, Some(1), &["recipe"])]
#[case("RMSNORM_GEMV", 20, 3, Some(4), Some(1), &["eps", "K", "N_tile", "n_off"])]
#[case("GATE_UP_SILU", 21, 3, Some(4), Some(1), &["K", "N_tile", "n_off"])]
#[case("QKV_ROPE_APPEND", 22, 5, Some(8), Some(3), &["K", "N_tile", "n_off", "head_dim", "n_heads", "n_kv_heads", "theta"])]
#[case("ATTENTION_GEMV", 23, 4, Some(6), Some(1), &["head_dim", "kv_start", "kv_len", "scale", "n_heads", "n_kv_heads", "K", "N_tile", "n_off"])]
#[case("NEXT_TOKEN", 24, 6, Some(7), Some(4), &[])]
#[case("ATTENTION_SPLIT", 25, 4, Some(4), Some(1), &["head_dim", "n_heads", "n_kv_heads", "scale", "N_tile", "n_off", "n_splits", "chunk"])]
#[case("COMBINE_GEMV", 26, 3, Some(4), Some(1), &["head_dim", "n_heads", "n_kv_heads", "K", "N_tile", "n_off", "n_splits", "chunk"])]
#[case("LINEAR_TILE", 27, 2, Some(6), Some(1), &["K", "N_tile", "n_off", "M_tile", "m_off"])]
#[case("ATTENTION_CAUSAL", 28, 4, Some(4), Some(1), &["head_dim", "n_heads", "n_kv_heads", "scale", "m_off", "M_tile", "n_off", "N_tile"])]
#[case("TOKEN_NLL", 29, 2, Some(2), Some(1), &[])]
#[case("ATTENTION_MERGE", 30, 2, Some(2), Some(1), &["head_dim", "n_heads", "n_kv_heads", "N_tile", "n_off", "n_splits", "chunk"])]
#[case("LOGIT_STATS", 31, 2, Some(2), Some(1), &["cols", "N_tile", "n_off"])]
fn spec_matches_the_table(
    #[case] name: &str,
    #[case] code: u16,
    #[case] min: u8,
    #[case] max: Option<u8>,
    #[case] outs: Option<u8>,
    #[case] required: &[&str],
) {
    let reg = amk_ops::registry().unwrap();
    let spec = reg.get(Opcode(code)).unwrap();
    assert_eq!(spec.name, name);
    assert_eq!(spec.min_inputs, min);
    assert_eq!(spec.max_inputs, max);
    assert_eq!(spec.n_outputs, outs);
    let req: Vec<&str> = spec.required_params().map(|p| p.name.as_ref()).collect();
    assert_eq!(req, required);
    for p in spec.required_params() {
        let ty = spec.param_type(&p.name).unwrap();
        let want = match p.name.as_ref() {
            "eps" | "scale" | "theta" => ParamType::Real,
            "recipe" => ParamType::Object,
            _ => ParamType::Int,
        };
        assert_eq!(ty, want, "{name}.{}", p.name);
    }
}

#[test]
fn duplicates_are_refused() {
    let mut reg = amk_ops::registry().unwrap();
    let gemv = reg.get(Opcode::GEMV_TILE).unwrap().clone();
    assert!(reg.register(gemv.clone(), Origin::Builtin).is_err());
    let mut renamed = gemv.clone();
    renamed.code = Opcode(23);
    assert!(
        reg.register(renamed, Origin::Builtin).is_err(),
        "duplicate name"
    );
    let mut wrong_abi = gemv.clone();
    wrong_abi.code = Opcode::ADD;
    assert!(
        reg.register(wrong_abi, Origin::Builtin).is_err(),
        "ABI code under another name"
    );
    let mut plugin = gemv;
    plugin.code = Opcode(30);
    plugin.name = "acme.GEMV".into();
    assert!(
        reg.register(plugin.clone(), Origin::Plugin("x.so".into()))
            .is_err(),
        "plugin code < 1000"
    );
    plugin.code = Opcode(1000);
    let mut mistyped = plugin.clone();
    mistyped.name = "acme.MISTYPED".into();
    mistyped.code = Opcode(1001);
    mistyped.params = vec![amk_core::ParamDecl::required("K", ParamType::Real)].into();
    assert!(
        reg.register(mistyped, Origin::Plugin("x.so".into()))
            .is_err(),
        "a device field declared with another type"
    );
    reg.register(plugin, Origin::Plugin("x.so".into())).unwrap();
    assert_eq!(reg.resolve_name("acme.GEMV"), Some(Opcode(1000)));
    let codes: Vec<u16> = reg.iter().map(|(s, _)| s.code.0).collect();
    let mut sorted = codes.clone();
    sorted.sort_unstable();
    assert_eq!(codes, sorted, "registry stays sorted by code");
}

/// docs/adding-an-op.md walks through adding an op under the next free built-in code: every
/// `Opcode(N)` its text declares is that code (one past the registry's last built-in), so the
/// walk-through cannot take a code an op already has.
#[test]
fn the_adding_an_op_guide_takes_the_next_free_code() {
    let reg = amk_ops::registry().unwrap();
    let next = reg.iter().map(|(s, _)| s.code.0).max().unwrap() + 1;
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/adding-an-op.md"
    ))
    .unwrap();
    let declared: Vec<u16> = guide
        .split("Opcode(")
        .skip(1)
        .filter_map(|rest| rest.split(')').next()?.parse().ok())
        .collect();
    assert!(!declared.is_empty(), "the guide declares no Opcode(N)");
    for code in declared {
        assert_eq!(
            code, next,
            "the guide declares Opcode({code}); the next free code is {next}"
        );
    }
    assert!(
        guide.contains(&format!("opcode #{next}"))
            && guide.contains(&format!("the next is {next}")),
        "the guide's text names another code than {next}"
    );
}

/// The device libraries come with the registry, in the order a kernel holds them, each naming
/// the repository file its text is (the compiler's line info points there).
#[test]
fn registry_holds_the_device_libraries_in_order() {
    let reg = amk_ops::registry().unwrap();
    let libs = reg.device_libraries();
    let names: Vec<&str> = libs.iter().map(|l| l.name).collect();
    assert_eq!(names, ["tile", "attention", "logits"]);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for lib in libs {
        let text = std::fs::read_to_string(root.join(lib.file))
            .unwrap_or_else(|e| panic!("library {}: {}: {e}", lib.name, lib.file));
        assert_eq!(text, lib.cuda, "library {}'s file holds its text", lib.name);
    }
    assert!(amk_core::Registry::empty().device_libraries().is_empty());
}
