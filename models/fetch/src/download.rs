//! Resumable, sha256-verified HTTP(S) download into a `.part` file.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use crate::{FetchError, FetchOptions};

/// Root certificates: the PEM bundle named by `SSL_CERT_FILE` when set and readable,
/// else the platform verifier (system store, which also honours `SSL_CERT_FILE`/`SSL_CERT_DIR`).
fn root_certs() -> RootCerts {
    let certs: Vec<Certificate<'static>> = std::env::var_os("SSL_CERT_FILE")
        .and_then(|path| fs::read(path).ok())
        .map(|pem| {
            ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if !certs.is_empty() {
        return RootCerts::Specific(Arc::new(certs));
    }
    RootCerts::PlatformVerifier
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(TlsConfig::builder().root_certs(root_certs()).build())
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// Lower-case hex sha256 of a file.
pub(crate) fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let f = File::open(path).map_err(|e| FetchError::io("reading", path, e))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| FetchError::io("reading", path, e))?;
        if n == 0 {
            break;
        }
        h.update(buf.get(..n).unwrap_or_default());
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Stderr progress line: bytes, percentage, rate.
struct Progress {
    quiet: bool,
    label: String,
    total: u64,
    resumed_from: u64,
    start: Instant,
    last: Option<Instant>,
}

impl Progress {
    fn update(&mut self, done: u64, force: bool) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        if !force
            && self
                .last
                .is_some_and(|t| now.duration_since(t) < Duration::from_millis(200))
        {
            return;
        }
        self.last = Some(now);
        const MIB: f64 = 1024.0 * 1024.0;
        let secs = now.duration_since(self.start).as_secs_f64().max(1e-3);
        let rate = done.saturating_sub(self.resumed_from) as f64 / MIB / secs;
        let pct = if self.total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / self.total as f64
        };
        // Progress is best effort: a stderr that cannot be written loses it, nothing else.
        let _ = write!(
            std::io::stderr(),
            "\r{}: {:.1}/{:.1} MiB {:5.1}% {:.1} MiB/s   ",
            self.label,
            done as f64 / MIB,
            self.total as f64 / MIB,
            pct,
            rate
        );
        let _ = std::io::stderr().flush();
    }

    fn finish(&mut self, done: u64) {
        if !self.quiet && self.last.is_some() {
            self.update(done, true);
            let _ = writeln!(std::io::stderr());
        }
    }
}

fn part_len(part: &Path) -> Result<u64, FetchError> {
    match fs::metadata(part) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(FetchError::io("inspecting", part, e)),
    }
}

fn remove(part: &Path) -> Result<(), FetchError> {
    match fs::remove_file(part) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FetchError::io("deleting", part, e)),
    }
}

/// Downloads `opts.url` into `part` (continuing an existing partial file with a Range
/// request) and verifies size and sha256. On a mismatch the part file is deleted.
pub(crate) fn download(opts: &FetchOptions, part: &Path, target: &Path) -> Result<(), FetchError> {
    let net = |message: String| FetchError::Network {
        url: opts.url.clone(),
        message,
        part: part.to_path_buf(),
        target: target.to_path_buf(),
    };
    let mut have = part_len(part)?;
    if have > opts.size {
        remove(part)?;
        have = 0;
    }
    if have < opts.size {
        let agent = agent();
        // At most two attempts: a ranged one, then (if the server rejected the range) a fresh one.
        let mut attempts = 0;
        let (mut response, append) = loop {
            attempts += 1;
            let mut req = agent.get(&opts.url);
            if have > 0 {
                req = req.header("Range", format!("bytes={have}-"));
            }
            let response = req.call().map_err(|e| net(e.to_string()))?;
            let status = response.status().as_u16();
            match status {
                200 => break (response, false),
                206 if have > 0 => {
                    let expected = format!("bytes {have}-");
                    let ok = response
                        .headers()
                        .get("content-range")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.trim().starts_with(&expected));
                    if ok {
                        break (response, true);
                    }
                }
                416 if have > 0 => {}
                _ => {
                    return Err(FetchError::HttpStatus {
                        url: opts.url.clone(),
                        status,
                        target: target.to_path_buf(),
                    });
                }
            }
            // The server rejected or mangled the range: restart from scratch.
            drop(response);
            remove(part)?;
            have = 0;
            if attempts >= 2 {
                return Err(net(
                    "the server does not answer range requests consistently".into(),
                ));
            }
        };
        if !append {
            have = 0;
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(part)
            .map_err(|e| FetchError::io("creating", part, e))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let label = opts.url.rsplit('/').next().unwrap_or("download").to_owned();
        let mut progress = Progress {
            quiet: opts.quiet,
            label,
            total: opts.size,
            resumed_from: have,
            start: Instant::now(),
            last: None,
        };
        let mut body = response.body_mut().as_reader();
        let mut buf = vec![0u8; 1 << 16];
        let result = loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(net(e.to_string())),
            };
            if let Err(e) = out.write_all(buf.get(..n).unwrap_or_default()) {
                break Err(FetchError::io("writing", part, e));
            }
            have += n as u64;
            progress.update(have, false);
            if have > opts.size {
                break Ok(());
            }
        };
        progress.finish(have);
        out.flush()
            .map_err(|e| FetchError::io("writing", part, e))?;
        result?;
        have = part_len(part)?;
        if have < opts.size {
            return Err(net(format!(
                "the connection closed after {have} of {} bytes",
                opts.size
            )));
        }
    }
    if have != opts.size {
        remove(part)?;
        return Err(FetchError::SizeMismatch {
            url: opts.url.clone(),
            expected: opts.size,
            actual: have,
        });
    }
    let actual = sha256_file(part)?;
    if !actual.eq_ignore_ascii_case(opts.sha256.trim()) {
        remove(part)?;
        return Err(FetchError::ChecksumMismatch {
            url: opts.url.clone(),
            expected: opts.sha256.to_ascii_lowercase(),
            actual,
        });
    }
    Ok(())
}
