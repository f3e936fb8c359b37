//! The persistent executable cache: compiled programs serialized by PJRT, one file per
//! program, shared by eager ops and compiled graphs across processes.
//!
//! It never lies: an entry stores the plugin's identity (a content hash of the plugin file,
//! its API and platform versions), the compile options and the whole program text, and is
//! used only when all three equal the current ones exactly and its checksum holds. Anything
//! else (another plugin, a corrupted or truncated file) is a miss: the program is compiled
//! again and the entry rewritten. Executables from another plugin return wrong numbers
//! without an error, which is why the identity is part of the entry itself.
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: &[u8; 12] = b"TORCHTPU-X1\n";

pub static DISK_HITS: AtomicU64 = AtomicU64::new(0);
pub static DISK_WRITES: AtomicU64 = AtomicU64::new(0);
pub static DISK_REJECTED: AtomicU64 = AtomicU64::new(0);

pub fn reset_counts() {
    for c in [&DISK_HITS, &DISK_WRITES, &DISK_REJECTED] {
        c.store(0, Ordering::Relaxed);
    }
}

/// 64-bit FNV-1a, seeded: fast enough for plugin files (hundreds of MB) and cache keys.
pub fn hash64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache directory: $TORCHTPU_CACHE_DIR, else $XDG_CACHE_HOME/torchtpu or
/// ~/.cache/torchtpu; None when TORCHTPU_CACHE=0 or no directory can be made.
pub fn directory() -> Option<PathBuf> {
    if std::env::var("TORCHTPU_CACHE").map(|v| v == "0").unwrap_or(false) {
        return None;
    }
    let dir = match std::env::var_os("TORCHTPU_CACHE_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            base.join("torchtpu")
        }
    };
    fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// A content hash of the plugin file, remembered per (path, size, mtime) in the cache
/// directory so that later processes don't read hundreds of megabytes again.
pub fn plugin_fingerprint(dir: Option<&Path>, plugin: &Path) -> std::io::Result<String> {
    let meta = fs::metadata(plugin)?;
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
    let stat = format!("{}|{}|{}", plugin.display(), meta.len(), mtime);
    let memo = dir.map(|d| d.join(format!("plugin-{:016x}.id", hash64(0, stat.as_bytes()))));
    if let Some(m) = &memo {
        if let Ok(text) = fs::read_to_string(m) {
            if let Some((s, h)) = text.split_once('\n') {
                if s == stat {
                    return Ok(h.trim().to_string());
                }
            }
        }
    }
    let mut f = fs::File::open(plugin)?;
    let (mut a, mut b) = (0u64, 0u64);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        a = hash64(a, &buf[..n]);
        b = hash64(b ^ 0x9e37_79b9_7f4a_7c15, &buf[..n]);
    }
    let h = format!("{a:016x}{b:016x}-{}", meta.len());
    if let Some(m) = &memo {
        let _ = write_atomic(m, format!("{stat}\n{h}\n").as_bytes());
    }
    Ok(h)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all().ok();
    fs::rename(&tmp, path)
}

fn entry_path(dir: &Path, identity: &str, options: &[u8], text: &str) -> PathBuf {
    let mut key = Vec::with_capacity(identity.len() + options.len() + text.len());
    key.extend_from_slice(identity.as_bytes());
    key.extend_from_slice(options);
    key.extend_from_slice(text.as_bytes());
    dir.join(format!("{:016x}{:016x}.xla", hash64(1, &key), hash64(2, &key)))
}

fn push_field(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u64).to_le_bytes());
    out.extend_from_slice(field);
}

fn read_field<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
    if bytes.len() < 8 {
        return None;
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let rest = &bytes[8..];
    if rest.len() < n {
        return None;
    }
    let (field, tail) = rest.split_at(n);
    *bytes = tail;
    Some(field)
}

/// The serialized executable stored for exactly this program, if there is a valid one.
pub fn load(dir: &Path, identity: &str, options: &[u8], text: &str) -> Option<Vec<u8>> {
    let path = entry_path(dir, identity, options, text);
    let bytes = fs::read(&path).ok()?;
    let valid = (|| {
        let body = bytes.strip_prefix(MAGIC.as_slice())?;
        let (body, sum) = body.split_at(body.len().checked_sub(8)?);
        if hash64(3, body) != u64::from_le_bytes(sum.try_into().ok()?) {
            return None;
        }
        let mut rest = body;
        let (id, opts, txt, payload) = (read_field(&mut rest)?, read_field(&mut rest)?, read_field(&mut rest)?, read_field(&mut rest)?);
        (id == identity.as_bytes() && opts == options && txt == text.as_bytes() && rest.is_empty()).then(|| payload.to_vec())
    })();
    if valid.is_none() {
        DISK_REJECTED.fetch_add(1, Ordering::Relaxed);
    }
    valid
}

/// Stores a serialized executable for this program (best effort: a full disk is not an error).
pub fn store(dir: &Path, identity: &str, options: &[u8], text: &str, payload: &[u8]) {
    let mut out = Vec::with_capacity(MAGIC.len() + identity.len() + options.len() + text.len() + payload.len() + 48);
    out.extend_from_slice(MAGIC);
    let start = out.len();
    push_field(&mut out, identity.as_bytes());
    push_field(&mut out, options);
    push_field(&mut out, text.as_bytes());
    push_field(&mut out, payload);
    let sum = hash64(3, &out[start..]);
    out.extend_from_slice(&sum.to_le_bytes());
    if write_atomic(&entry_path(dir, identity, options, text), &out).is_ok() {
        DISK_WRITES.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("torchtpu-cache-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn roundtrip_and_exact_match_only() {
        let d = tmpdir("roundtrip");
        store(&d, "plugin-a", b"opts", "module text", b"payload");
        assert_eq!(load(&d, "plugin-a", b"opts", "module text").as_deref(), Some(&b"payload"[..]));
        assert_eq!(load(&d, "plugin-a", b"opts", "other text"), None);
        assert_eq!(load(&d, "plugin-a", b"other", "module text"), None);
    }

    #[test]
    fn another_plugins_entry_is_rejected_even_under_our_name() {
        let d = tmpdir("identity");
        store(&d, "plugin-a", b"opts", "text", b"payload-from-a");
        // Put plugin A's entry where plugin B would look for the same program.
        fs::rename(entry_path(&d, "plugin-a", b"opts", "text"), entry_path(&d, "plugin-b", b"opts", "text")).unwrap();
        assert_eq!(load(&d, "plugin-b", b"opts", "text"), None);
    }

    #[test]
    fn corrupted_or_truncated_entries_are_rejected() {
        let d = tmpdir("corrupt");
        store(&d, "p", b"o", "t", b"0123456789");
        let path = entry_path(&d, "p", b"o", "t");
        let good = fs::read(&path).unwrap();
        for i in [0, MAGIC.len() + 3, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            fs::write(&path, &bad).unwrap();
            assert_eq!(load(&d, "p", b"o", "t"), None, "flipped byte {i}");
        }
        fs::write(&path, &good[..good.len() - 5]).unwrap();
        assert_eq!(load(&d, "p", b"o", "t"), None);
        fs::write(&path, &good).unwrap();
        assert!(load(&d, "p", b"o", "t").is_some());
    }

    #[test]
    fn plugin_fingerprint_follows_content() {
        let d = tmpdir("fingerprint");
        let f = d.join("plugin.so");
        fs::write(&f, b"one").unwrap();
        let a = plugin_fingerprint(Some(&d), &f).unwrap();
        assert_eq!(plugin_fingerprint(Some(&d), &f).unwrap(), a);
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&f, b"two").unwrap();
        assert_ne!(plugin_fingerprint(Some(&d), &f).unwrap(), a);
    }
}
