//! The judge's seal on the lines it writes itself (rings, escalations, refusal notices,
//! report notes): a keyed hash of the line under a key kept in `.doorbell/seal.key`.
//!
//! The journal says which lines are the judge's own. When the journal is lost or damaged, the
//! seal still does: a line with a reserved id and a seal made with this bridge's key is the
//! judge's own line, so a rebuild accepts it (never `borrowed-name`) and knows that the ring,
//! notice or note was already written, instead of writing it a second time. Anyone can
//! predict a reserved id; only a process that reads the key can seal a line.
//!
//! The seal is the line's last field, `"seal":"<32 hex>"`, over every byte before it.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{Error, Result};

pub const KEY_FILE: &str = "seal.key";
const KEY_LEN: usize = 32;
const HEX_LEN: usize = 32;
const FIELD: &[u8] = b",\"seal\":\"";

/// The bridge's sealing key.
#[derive(Clone)]
pub struct Seal {
    key: [u8; KEY_LEN],
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(..)")
    }
}

impl Seal {
    /// The key in `state` (the `.doorbell` folder), made the first time, and whether it was
    /// made now. A key file that is not a key (damaged, the wrong length) is kept aside under
    /// another name and replaced.
    pub fn open(state: &Path) -> Result<(Seal, bool)> {
        let path = state.join(KEY_FILE);
        match read_key(&path) {
            Ok(Some(key)) => return Ok((Seal { key }, false)),
            Ok(None) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("read seal key", &path)(e)),
        }
        if path.exists() {
            let aside = state.join(format!("{KEY_FILE}.damaged"));
            tracing::warn!(path = %path.display(), aside = %aside.display(), "the seal key is damaged: a new one is made");
            std::fs::rename(&path, &aside).map_err(Error::io("move damaged seal key", &path))?;
        }
        let mut key = [0u8; KEY_LEN];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .map_err(Error::io("read", Path::new("/dev/urandom")))?;
        crate::atomic::write_atomic(&path, &key)?;
        Ok((Seal { key }, true))
    }

    fn mac(&self, bytes: &[u8]) -> [u8; HEX_LEN] {
        let hash = blake3::keyed_hash(&self.key, bytes);
        let hex = hash.to_hex();
        let mut out = [0u8; HEX_LEN];
        out.copy_from_slice(&hex.as_bytes()[..HEX_LEN]);
        out
    }

    /// `line` (one JSON object) with the seal added as its last field.
    #[must_use]
    pub fn seal(&self, line: &str) -> String {
        let Some(body) = line.strip_suffix('}') else {
            return line.to_owned();
        };
        let mut out = String::with_capacity(line.len() + FIELD.len() + HEX_LEN + 2);
        out.push_str(body);
        out.push_str(",\"seal\":\"");
        let mac = self.mac(out.as_bytes());
        out.push_str(std::str::from_utf8(&mac).expect("hex"));
        out.push_str("\"}");
        out
    }

    /// Whether `line` carries a seal made with this key over every byte before it.
    #[must_use]
    pub fn verifies(&self, line: &[u8]) -> bool {
        let Some((signed, mac)) = split_seal(line) else {
            return false;
        };
        // A comparison in constant time: the key is the secret here.
        let expected = self.mac(signed);
        expected
            .iter()
            .zip(mac)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// Whether `line` ends with a seal field of the right shape, whatever key made it: a line the
/// judge wrote under a key that is lost since.
#[must_use]
pub fn carries_seal(line: &[u8]) -> bool {
    split_seal(line)
        .is_some_and(|(_, mac)| mac.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// A sealed line's signed bytes (through the seal field's opening quote) and its seal.
fn split_seal(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_suffix(b"\"}")?;
    let split = rest.len().checked_sub(HEX_LEN)?;
    let (signed, mac) = rest.split_at(split);
    signed.ends_with(FIELD).then_some((signed, mac))
}

/// The key at `path`, `None` when the file is not one; never through a symlink.
fn read_key(path: &Path) -> std::io::Result<Option<[u8; KEY_LEN]>> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let mut bytes = Vec::with_capacity(KEY_LEN + 1);
    file.by_ref()
        .take(KEY_LEN as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(<[u8; KEY_LEN]>::try_from(bytes.as_slice()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal() -> (tempfile::TempDir, Seal) {
        let dir = tempfile::tempdir().unwrap();
        let (seal, _) = Seal::open(dir.path()).unwrap();
        (dir, seal)
    }

    #[test]
    fn a_sealed_line_verifies_and_stays_one_json_object() {
        let (_dir, seal) = seal();
        let line = seal.seal(r#"{"id":"ring:00:0:1","from":"debt-loop"}"#);
        assert!(line.starts_with(r#"{"id":"ring:00:0:1","from":"debt-loop","seal":""#));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["seal"].as_str().unwrap().len(), HEX_LEN);
        assert!(seal.verifies(line.as_bytes()));
    }

    #[test]
    fn any_changed_byte_or_another_key_fails() {
        let (dir, seal) = seal();
        let line = seal.seal(r#"{"id":"ring:00:0:1","text":"hello"}"#);
        for at in 0..line.len() {
            let mut bytes = line.clone().into_bytes();
            bytes[at] ^= 0x01;
            assert!(
                !seal.verifies(&bytes),
                "byte {at} changed and it still verifies"
            );
        }
        assert!(!seal.verifies(br#"{"id":"ring:00:0:1"}"#));
        assert!(!seal.verifies(b""));
        // The same key is read back; a new folder's key is another.
        assert!(Seal::open(dir.path()).unwrap().0.verifies(line.as_bytes()));
        let (_other_dir, other) = super::tests::seal();
        assert!(!other.verifies(line.as_bytes()));
    }

    #[test]
    fn a_damaged_key_is_set_aside_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        let (seal, _) = Seal::open(dir.path()).unwrap();
        assert!(dir.path().join("seal.key.damaged").exists());
        assert_eq!(
            std::fs::read(dir.path().join(KEY_FILE)).unwrap().len(),
            KEY_LEN
        );
        let line = seal.seal(r#"{"a":1}"#);
        assert!(Seal::open(dir.path()).unwrap().0.verifies(line.as_bytes()));
    }
}
