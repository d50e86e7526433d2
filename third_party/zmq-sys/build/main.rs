//! Builds the vendored libzmq with libsodium, so that the CURVE mechanism exists.
//!
//! Upstream zmq-sys 0.12.0 calls `with_libsodium(None)`, which compiles libzmq without
//! `ZMQ_HAVE_CURVE`. libsodium itself is built from its signed release tarball by
//! `libsodium-sys-stable`, whose build script exports where it put the headers and the
//! static library (its `links = "sodium"` metadata).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build/main.rs");
    println!("cargo:rerun-if-env-changed=PROFILE");

    // libzmq's own C++ warnings are upstream's to fix; a path dependency would print every one
    // of them on each fresh build.
    let mut cxxflags = env::var("CXXFLAGS").unwrap_or_default();
    cxxflags.push_str(" -w");
    env::set_var("CXXFLAGS", cxxflags.trim_start());

    let lib_dir = sodium_dir("DEP_SODIUM_LIB");
    let include_dir = sodium_dir("DEP_SODIUM_INCLUDE");
    zeromq_src::Build::new()
        .with_libsodium(Some(zeromq_src::LibLocation::new(lib_dir, include_dir)))
        .build();
}

fn sodium_dir(var: &str) -> PathBuf {
    match env::var_os(var) {
        Some(dir) => PathBuf::from(dir),
        None => panic!("{var} is not set: libsodium-sys-stable did not build libsodium from source"),
    }
}
