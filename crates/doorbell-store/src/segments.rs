//! The journal's sealed segments: `.doorbell/journal/NNNNNNNN.jsonl`, later compressed to
//! `NNNNNNNN.jsonl.gz`. The live journal, `.doorbell/journal.jsonl`, is segment number `S`
//! (the index says which); rolling seals it under its number and starts `S + 1` empty.
//!
//! A roll happens only when the index covers the whole live journal, in three steps, each
//! safe to die after: (1) the live file is hard-linked as its sealed segment; (2) the index
//! says the live segment is `S + 1`, empty; (3) an empty file replaces the live one. A judge
//! that finds the index at `S + 1` while the live file is still sealed segment `S` finishes
//! step 3, so a record is never applied twice. Sealed segments are read again only to rebuild
//! the index; nothing else needs them, so compressing them loses nothing.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

pub const SEGMENTS_DIR: &str = "journal";

/// A sealed segment on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub number: u64,
    pub path: PathBuf,
    pub compressed: bool,
}

#[must_use]
pub fn segments_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(SEGMENTS_DIR)
}

#[must_use]
pub fn sealed_path(state_dir: &Path, number: u64) -> PathBuf {
    segments_dir(state_dir).join(format!("{number:08}.jsonl"))
}

fn compressed_path(state_dir: &Path, number: u64) -> PathBuf {
    segments_dir(state_dir).join(format!("{number:08}.jsonl.gz"))
}

/// Every sealed segment, oldest first (a segment both plain and compressed, as a compaction
/// that died between its two steps leaves it, is listed once, plain).
pub fn list(state_dir: &Path) -> Result<Vec<Sealed>> {
    let dir = segments_dir(state_dir);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list journal segments", &dir)(e)),
    };
    let mut found: std::collections::BTreeMap<u64, Sealed> = std::collections::BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let (stem, compressed) = match name.strip_suffix(".jsonl.gz") {
            Some(stem) => (stem, true),
            None => match name.strip_suffix(".jsonl") {
                Some(stem) => (stem, false),
                None => continue,
            },
        };
        let Ok(number) = stem.parse::<u64>() else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let sealed = Sealed {
            number,
            path: entry.path(),
            compressed,
        };
        match found.get(&number) {
            Some(plain) if !plain.compressed => {}
            _ => {
                found.insert(number, sealed);
            }
        }
    }
    Ok(found.into_values().collect())
}

/// Whether two paths name the same file.
#[must_use]
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::symlink_metadata(a), fs::symlink_metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io("sync folder", dir))
}

/// Step 1 of a roll: the live journal, hard-linked as sealed segment `number`.
pub fn seal(state_dir: &Path, live: &Path, number: u64) -> Result<()> {
    let dir = segments_dir(state_dir);
    crate::bridge::make_dir_in(&dir)?;
    crate::fault::check(&dir).map_err(Error::io("seal journal segment", &dir))?;
    let sealed = sealed_path(state_dir, number);
    match fs::hard_link(live, &sealed) {
        Ok(()) => {}
        // A roll that died after this step: the link is there already.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && same_file(live, &sealed) => {}
        Err(e) => return Err(Error::io("seal journal segment", &sealed)(e)),
    }
    sync_dir(&dir)
}

/// Step 3 of a roll: an empty live journal in place of the sealed one.
pub fn start_empty(live: &Path) -> Result<()> {
    crate::atomic::write_atomic(live, b"")
}

/// A sealed segment as a plain file to read from: itself, or (compressed) its contents
/// unpacked into a temporary file beside it that goes when the returned guard is dropped.
pub fn open(sealed: &Sealed) -> Result<(File, Option<tempfile_guard::Guard>)> {
    if !sealed.compressed {
        let file =
            File::open(&sealed.path).map_err(Error::io("open journal segment", &sealed.path))?;
        return Ok((file, None));
    }
    let tmp = sealed
        .path
        .with_extension(format!("unpacked.{}", std::process::id()));
    let guard = tempfile_guard::Guard(tmp.clone());
    let input =
        File::open(&sealed.path).map_err(Error::io("open journal segment", &sealed.path))?;
    let mut out = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(Error::io("unpack journal segment", &tmp))?;
    let mut decoder = flate2::read::GzDecoder::new(BufReader::new(input));
    std::io::copy(&mut decoder, &mut out)
        .map_err(Error::io("unpack journal segment", &sealed.path))?;
    Ok((out, Some(guard)))
}

/// A temporary file removed when dropped.
pub mod tempfile_guard {
    #[derive(Debug)]
    pub struct Guard(pub std::path::PathBuf);

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// What a compaction did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Compacted {
    pub segments: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Compress every sealed segment numbered below `live` (the live segment's number, which
/// may still be linked as a sealed one by a roll in progress): written beside it, synced,
/// then the plain one removed.
pub fn compress_below(state_dir: &Path, live: u64) -> Result<Compacted> {
    let mut done = Compacted::default();
    for sealed in list(state_dir)? {
        if sealed.compressed || sealed.number >= live {
            continue;
        }
        let target = compressed_path(state_dir, sealed.number);
        let before = fs::metadata(&sealed.path).map_or(0, |m| m.len());
        let mut input =
            File::open(&sealed.path).map_err(Error::io("open journal segment", &sealed.path))?;
        crate::atomic::replace_with(&target, None, |out| {
            let mut encoder =
                flate2::write::GzEncoder::new(BufWriter::new(out), flate2::Compression::default());
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = input.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                encoder.write_all(&buf[..n])?;
            }
            encoder.finish()?.flush()
        })?;
        fs::remove_file(&sealed.path).map_err(Error::io("remove journal segment", &sealed.path))?;
        done.segments += 1;
        done.bytes_before += before;
        done.bytes_after += fs::metadata(&target).map_or(0, |m| m.len());
    }
    if done.segments > 0 {
        sync_dir(&segments_dir(state_dir))?;
    }
    Ok(done)
}
