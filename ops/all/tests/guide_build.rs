//! docs/adding-an-op.md, done by a test: its step 1 (copy `ops/add` as `op-scale-add`) and the
//! spec of its step 2 (code 32, name SCALE_ADD) applied to a copy in a scratch workspace, which
//! is then built and tested offline against this checkout's `amk-core`. A guide whose template
//! crate no longer builds on its own, or whose commands no longer name what they do here, fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Copies the directory `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dst = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dst);
        } else {
            fs::copy(entry.path(), &dst).unwrap();
        }
    }
}

/// The root manifest's table `[name]` with its lines, up to the next table.
fn table(manifest: &str, name: &str) -> String {
    let head = format!("[{name}]");
    let start = manifest
        .find(&format!("\n{head}\n"))
        .unwrap_or_else(|| panic!("the root Cargo.toml has no {head}"));
    let body = &manifest[start + 1..];
    let end = body[1..].find("\n[").map_or(body.len(), |e| e + 2);
    body[..end].to_string()
}

/// The scratch workspace's manifest: the copy as its one member, this checkout's package
/// fields and lints, and the dependencies the template uses (core by path, the rest as pinned
/// here).
fn scratch_manifest(root_manifest: &str, core: &Path) -> String {
    let deps = table(root_manifest, "workspace.dependencies");
    let pinned = |name: &str| {
        deps.lines()
            .find(|l| l.starts_with(&format!("{name} =")))
            .unwrap_or_else(|| panic!("no {name} in [workspace.dependencies]"))
            .to_string()
    };
    format!(
        "[workspace]\nresolver = \"3\"\nmembers = [\"scale-add\"]\n\n{}\n[workspace.dependencies]\n\
         amk-core = {{ path = {:?} }}\n{}\n\n{}\n{}",
        table(root_manifest, "workspace.package"),
        core.display().to_string(),
        pinned("rstest"),
        table(root_manifest, "workspace.lints.rust"),
        table(root_manifest, "workspace.lints.clippy"),
    )
}

/// Replaces every `from` (one at least must be there) with `to` in the file at `path`.
fn edit(path: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{}: no {from:?}", path.display());
    fs::write(path, text.replace(from, to)).unwrap();
}

#[test]
fn a_crate_copied_as_the_guide_says_builds_and_passes_its_tests() {
    let root = root().canonicalize().unwrap();
    let guide = fs::read_to_string(root.join("docs/adding-an-op.md")).unwrap();
    for step in [
        "cp -r ops/add ops/scale-add",
        "rename the package to `op-scale-add`",
        "`use op_add::…` lines become `use op_scale_add::…`",
        "code: Opcode(32),",
        "name: Cow::Borrowed(\"SCALE_ADD\"),",
    ] {
        assert!(guide.contains(step), "the guide no longer says {step:?}");
    }
    let work = std::env::temp_dir().join(format!("amk-guide-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let krate = work.join("scale-add");
    copy_dir(&root.join("ops/add"), &krate);
    let root_manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    fs::write(
        work.join("Cargo.toml"),
        scratch_manifest(&root_manifest, &root.join("core")),
    )
    .unwrap();
    // This checkout's lock file: the same dependency versions, found offline.
    fs::copy(root.join("Cargo.lock"), work.join("Cargo.lock")).unwrap();
    edit(
        &krate.join("Cargo.toml"),
        "name = \"op-add\"",
        "name = \"op-scale-add\"",
    );
    edit(
        &krate.join("tests/reference.rs"),
        "use op_add::",
        "use op_scale_add::",
    );
    let lib = krate.join("src/lib.rs");
    edit(&lib, "code: Opcode::ADD,", "code: Opcode(32),");
    edit(
        &lib,
        "name: Cow::Borrowed(\"ADD\"),",
        "name: Cow::Borrowed(\"SCALE_ADD\"),",
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["test", "--offline", "--quiet", "--manifest-path"])
        .arg(work.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", work.join("target"))
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the copied crate failed:\n{log}");
    assert!(log.contains("test result: ok"), "no tests ran:\n{log}");
    let _ = fs::remove_dir_all(&work);
}
