//! A minimal zip reader: finds one member through the central directory and
//! inflates it (stored or deflate), checking size and CRC-32.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::FetchError;

const EOCD_SIG: u32 = 0x0605_4b50;
const CDH_SIG: u32 = 0x0201_4b50;
const LFH_SIG: u32 = 0x0403_4b50;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

struct Entry {
    method: u16,
    crc: u32,
    compressed: u64,
    uncompressed: u64,
    local_offset: u64,
}

/// Extracts `member` of the zip at `archive` into `out`; returns the number of bytes written.
pub(crate) fn extract_member(
    archive: &Path,
    member: &str,
    out: &mut impl Write,
) -> Result<u64, FetchError> {
    let bad = |reason: String| FetchError::BadArchive {
        archive: archive.to_path_buf(),
        reason,
    };
    let io = |e| FetchError::io("reading", archive, e);
    let mut f = File::open(archive).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();

    // End of central directory: within the last 22 + 65535 bytes.
    let tail_len = len.min(22 + 0xFFFF);
    f.seek(SeekFrom::Start(len - tail_len)).map_err(io)?;
    let mut tail = vec![0u8; usize::try_from(tail_len).map_err(|_| bad("too large".into()))?];
    f.read_exact(&mut tail).map_err(io)?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| u32_at(&tail, i) == Some(EOCD_SIG))
        .ok_or_else(|| bad("no end-of-central-directory record".into()))?;
    let short = || bad("truncated end-of-central-directory record".into());
    let entries = u16_at(&tail, eocd + 10).ok_or_else(short)?;
    let cd_size = u32_at(&tail, eocd + 12).ok_or_else(short)?;
    let cd_offset = u32_at(&tail, eocd + 16).ok_or_else(short)?;
    if cd_offset == u32::MAX || entries == u16::MAX {
        return Err(bad("zip64 archives are not supported".into()));
    }
    if u64::from(cd_offset) + u64::from(cd_size) > len {
        return Err(bad(
            "central directory lies beyond the end of the file".into()
        ));
    }
    f.seek(SeekFrom::Start(u64::from(cd_offset))).map_err(io)?;
    let mut cd = vec![0u8; cd_size as usize];
    f.read_exact(&mut cd).map_err(io)?;

    let mut at = 0usize;
    let mut found = None;
    for _ in 0..entries {
        let short = || bad("truncated central directory".into());
        if u32_at(&cd, at) != Some(CDH_SIG) {
            return Err(bad("bad central directory signature".into()));
        }
        let name_len = usize::from(u16_at(&cd, at + 28).ok_or_else(short)?);
        let extra_len = usize::from(u16_at(&cd, at + 30).ok_or_else(short)?);
        let comment_len = usize::from(u16_at(&cd, at + 32).ok_or_else(short)?);
        let name = cd.get(at + 46..at + 46 + name_len).ok_or_else(short)?;
        if name == member.as_bytes() {
            found = Some(Entry {
                method: u16_at(&cd, at + 10).ok_or_else(short)?,
                crc: u32_at(&cd, at + 16).ok_or_else(short)?,
                compressed: u64::from(u32_at(&cd, at + 20).ok_or_else(short)?),
                uncompressed: u64::from(u32_at(&cd, at + 24).ok_or_else(short)?),
                local_offset: u64::from(u32_at(&cd, at + 42).ok_or_else(short)?),
            });
            break;
        }
        at += 46 + name_len + extra_len + comment_len;
    }
    let e = found.ok_or_else(|| FetchError::MemberNotFound {
        archive: archive.to_path_buf(),
        member: member.to_owned(),
    })?;
    if [e.compressed, e.uncompressed, e.local_offset].contains(&u64::from(u32::MAX)) {
        return Err(bad("zip64 entries are not supported".into()));
    }

    // Local file header: its name/extra lengths may differ from the central copy.
    f.seek(SeekFrom::Start(e.local_offset)).map_err(io)?;
    let mut lfh = [0u8; 30];
    f.read_exact(&mut lfh).map_err(io)?;
    if u32_at(&lfh, 0) != Some(LFH_SIG) {
        return Err(bad(format!("bad local header signature for {member}")));
    }
    let skip = u64::from(u16_at(&lfh, 26).unwrap_or(0)) + u64::from(u16_at(&lfh, 28).unwrap_or(0));
    let data_start = e.local_offset + 30 + skip;
    if data_start + e.compressed > len {
        return Err(bad(format!(
            "{member} data lies beyond the end of the file"
        )));
    }
    f.seek(SeekFrom::Start(data_start)).map_err(io)?;
    let raw = BufReader::with_capacity(1 << 20, f).take(e.compressed);
    let mut reader: Box<dyn Read> = match e.method {
        0 => Box::new(raw),
        8 => Box::new(flate2::bufread::DeflateDecoder::new(raw)),
        m => {
            return Err(bad(format!(
                "{member} uses unsupported compression method {m}"
            )));
        }
    };

    let mut crc = flate2::Crc::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|err| bad(format!("inflating {member}: {err}")))?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).unwrap_or_default();
        crc.update(chunk);
        out.write_all(chunk)
            .map_err(|err| FetchError::io("writing the extracted member of", archive, err))?;
        written += n as u64;
        if written > e.uncompressed {
            break;
        }
    }
    if written != e.uncompressed {
        return Err(bad(format!(
            "{member}: {written} bytes inflated, expected {}",
            e.uncompressed
        )));
    }
    if crc.sum() != e.crc {
        return Err(bad(format!(
            "{member}: CRC-32 {:08x}, expected {:08x}",
            crc.sum(),
            e.crc
        )));
    }
    Ok(written)
}
