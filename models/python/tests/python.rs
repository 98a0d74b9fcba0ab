//! The Python bindings from Python: the extension module this build made
//! (`target/<profile>/libamk_python.so`), copied to a temporary folder as `amk.so`, imported
//! by pytest (`models/python/tests/python/`). Skipped, visibly, where Python lacks pytest,
//! unless `AMK_REQUIRE_PYTHON=1` (CI sets it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use std::path::{Path, PathBuf};
use std::process::Command;

/// The extension module built with this test, beside its executable in
/// `target/<profile>/deps` (`cargo test` leaves it there; only `cargo build` copies it up).
fn extension() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = format!(
        "{}amk_python{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let lib = deps.join(&name);
    assert!(lib.is_file(), "{} was not built", lib.display());
    lib
}

#[test]
fn the_module_passes_its_pytest_suite() {
    let have = Command::new("python3")
        .args(["-c", "import pytest"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("AMK_REQUIRE_PYTHON").as_deref() != Ok("1"),
            "AMK_REQUIRE_PYTHON=1 but python3 cannot import pytest"
        );
        eprintln!("SKIPPED the_module_passes_its_pytest_suite: python3 with pytest is needed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("amk-python-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(extension(), dir.join("amk.so")).unwrap();
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python");
    let o = Command::new("python3")
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .arg(&tests)
        .env("PYTHONPATH", &dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        o.status.success(),
        "pytest failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.contains("skipped"), "{out}");
}
