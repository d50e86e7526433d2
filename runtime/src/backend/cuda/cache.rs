//! The on-disk cache of compiled kernels: the machine code (cubin) the driver made of a PTX
//! module, filed under a SHA-256 of the PTX text and the device (its name, compute capability
//! and driver version), so that a second process on the same machine loads each kernel
//! instead of compiling it again (10-110 ms per kernel on an H100). The cache is only ever a
//! shortcut: a file that cannot be read, written or loaded means compiling as if it were not
//! there, never an error.
//!
//! `GT_KERNEL_CACHE` names the directory (`off` turns it off); the default is
//! `$XDG_CACHE_HOME/gt/kernels`, else `$HOME/.cache/gt/kernels`.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where compiled kernels are kept, if anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// The cache `GT_KERNEL_CACHE` names, or the default one.
    pub fn from_env() -> KernelCache {
        match std::env::var_os("GT_KERNEL_CACHE") {
            Some(v) if v == "off" || v.is_empty() => KernelCache::off(),
            Some(v) => KernelCache::at(v),
            None => {
                let home = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")));
                KernelCache { dir: home.map(|h| h.join("gt").join("kernels")) }
            }
        }
    }

    /// A cache in `dir` (made when first written).
    pub fn at(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache { dir: Some(dir.into()) }
    }

    /// No cache: every kernel is compiled.
    pub fn off() -> KernelCache {
        KernelCache { dir: None }
    }

    /// The directory, when on.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The file name of `ptx` compiled for `device` (a string naming the device, its compute
    /// capability and the driver's version).
    pub fn key(ptx: &str, device: &str) -> String {
        let mut h = Sha256::new();
        h.update(device.as_bytes());
        h.update([0]);
        h.update(ptx.as_bytes());
        let digest = h.finalize();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{hex}.cubin")
    }

    /// The cubin kept under `key`, if any.
    pub fn load(&self, key: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.dir.as_ref()?.join(key)).ok()?;
        (!bytes.is_empty()).then_some(bytes)
    }

    /// Keeps `cubin` under `key`: written to a temporary file and renamed, so that a reader
    /// (another process) sees the whole file or none. Failures are ignored (the next process
    /// compiles again).
    pub fn store(&self, key: &str, cubin: &[u8]) {
        let Some(dir) = &self.dir else { return };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let tmp = dir.join(format!(".{key}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, cubin)?;
            std::fs::rename(&tmp, dir.join(key)).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        };
        if let Err(e) = write() {
            tracing::debug!("kernel cache: cannot write {}: {e}", dir.display());
        }
    }

    /// Forgets `key` (a file the driver refused to load).
    pub fn remove(&self, key: &str) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(dir.join(key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_the_text_and_the_device() {
        let a = KernelCache::key(".entry a", "H100 sm_90 driver 12080");
        assert_eq!(a, KernelCache::key(".entry a", "H100 sm_90 driver 12080"));
        assert_ne!(a, KernelCache::key(".entry b", "H100 sm_90 driver 12080"));
        assert_ne!(a, KernelCache::key(".entry a", "H100 sm_90 driver 12090"));
        assert!(a.ends_with(".cubin") && a.len() == 64 + 6);
    }

    #[test]
    fn stores_and_loads_and_ignores_what_it_cannot_do() {
        let dir = std::env::temp_dir().join(format!("gt-kernel-cache-{}", std::process::id()));
        let cache = KernelCache::at(dir.join("nested"));
        assert_eq!(cache.load("k.cubin"), None);
        cache.store("k.cubin", b"machine code");
        assert_eq!(cache.load("k.cubin").as_deref(), Some(&b"machine code"[..]));
        cache.remove("k.cubin");
        assert_eq!(cache.load("k.cubin"), None);
        // Off, or a directory that cannot be made (under a file): nothing kept, no error.
        KernelCache::off().store("k.cubin", b"x");
        assert_eq!(KernelCache::off().load("k.cubin"), None);
        std::fs::write(dir.join("file"), b"").unwrap();
        let blocked = KernelCache::at(dir.join("file").join("sub"));
        blocked.store("k.cubin", b"x");
        assert_eq!(blocked.load("k.cubin"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
