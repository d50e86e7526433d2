//! Records the git revision gt is built from (`GT_GIT_REVISION`, for profile manifests);
//! nothing when git or the repository is missing (a crate built from a tarball).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    if let Some(rev) = git(&["rev-parse", "HEAD"]) {
        let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        println!("cargo:rustc-env=GT_GIT_REVISION={rev}{}", if dirty { "-dirty" } else { "" });
    }
    // Built again when HEAD moves (a commit, a checkout); only files that exist are named,
    // as a missing one would make every build run this again.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = Path::new(&dir);
        let head = dir.join("HEAD");
        let branch =
            std::fs::read_to_string(&head).ok().and_then(|h| h.strip_prefix("ref: ").map(|r| dir.join(r.trim())));
        for path in [Some(head), branch, Some(dir.join("index"))].into_iter().flatten() {
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
