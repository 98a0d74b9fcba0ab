//! Hostile inputs end in a typed error in bounded time and memory: each command runs in a
//! child under a 1 GiB address-space limit (`prlimit --as`; a child past it would abort
//! instead of exiting 2) and must finish within 10 s.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

mod limited;
mod tiny;

use std::io::Write as _;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

/// The time each may take.
const LIMIT_TIME: Duration = Duration::from_secs(10);

/// `amk ARGS` under the address-space limit, timed.
fn bounded(args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let o = limited::amk_limited().args(args).output().unwrap();
    (o, t0.elapsed())
}

/// Checks a typed refusal: exit status 2, an `error:` line holding `needle`, within the time.
fn assert_refused(args: &[&str], needle: &str) {
    let (o, took) = bounded(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{args:?}: {:?} (killed by a signal if None: the limit was hit)\n{err}",
        o.status
    );
    assert!(
        err.contains("error:") && err.contains(needle),
        "{args:?}: {err}"
    );
    assert!(took < LIMIT_TIME, "{args:?} took {took:?}");
}

fn gzip(path: &Path, parts: &[(&[u8], usize)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    for (bytes, times) in parts {
        for _ in 0..*times {
            gz.write_all(bytes).unwrap();
        }
    }
    gz.finish().unwrap();
}

#[test]
fn program_bombs_are_refused_within_bounds() {
    let d = tiny::scratch("bounds-programs");
    // 320 MiB of spaces (past the 128 MiB that a program may inflate to).
    let spaces = d.join("spaces.json.gz");
    gzip(&spaces, &[(&[b' '; 1 << 20], 320)]);
    assert_refused(&["validate", spaces.to_str().unwrap()], "limit");
    // 100 MB of `0,`: within the text limit, but 50 million values (3.2 GB as parsed).
    let zeros = d.join("zeros.json.gz");
    let pair = b"0,".repeat(1 << 19);
    gzip(
        &zeros,
        &[
            (
                br#"{"ir_version": "0.2.0", "abi_version": "0.2", "tasks": ["#,
                1,
            ),
            (&pair, 100),
            (b"0]}", 1),
        ],
    );
    assert_refused(&["validate", zeros.to_str().unwrap()], "MiB of memory");
    // A device that never ends.
    assert_refused(&["validate", "/dev/zero"], "not a regular file");
    let _ = std::fs::remove_dir_all(&d);
}

/// GGUF's little-endian string: its length, then its bytes.
fn gguf_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

#[test]
fn a_gguf_metadata_bomb_is_refused_within_bounds() {
    let d = tiny::scratch("bounds-gguf");
    // A GGUF (v3, no tensors) whose one metadata value is an array of 17 M empty strings:
    // 136 MB of file, 544 MB as parsed values, refused before they are allocated. Written by
    // hand so that the test itself does not hold the values.
    let n: u64 = 17 << 20;
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes()); // tensors
    head.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
    gguf_str(&mut head, "bomb");
    head.extend_from_slice(&9u32.to_le_bytes()); // array
    head.extend_from_slice(&8u32.to_le_bytes()); // of strings
    head.extend_from_slice(&n.to_le_bytes());
    let path = d.join("bomb.gguf");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&head).unwrap();
    f.write_all(&vec![0u8; 8 * n as usize]).unwrap(); // each a length of 0
    drop(f);
    assert_refused(
        &[
            "generate",
            "--model",
            path.to_str().unwrap(),
            "--prompt",
            "hi",
        ],
        "MiB of memory",
    );
    let _ = std::fs::remove_dir_all(&d); // 136 MB
}
