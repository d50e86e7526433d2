//! Builds the vendored libzmq with libsodium, so that the CURVE mechanism exists, and on Linux
//! with eventfd signalers.
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
    // A thread waiting on a socket is woken through its "signaler": zeromq-src leaves
    // ZMQ_HAVE_EVENTFD undefined, so on Linux that is a socketpair, and every wake-up a unix
    // socket send and receive. An eventfd is one counter: an embedded submit + sync round trip
    // (four wake-ups) drops from about 22 to 17 µs on the 2-core VM
    // (bench/results/transport-vm-xeon-eventfd.txt); a test in gt-transport's socket.rs
    // fails if this is lost.
    if matches!(env::var("CARGO_CFG_TARGET_OS").as_deref(), Ok("linux" | "android")) {
        cxxflags.push_str(" -DZMQ_HAVE_EVENTFD=1 -DZMQ_HAVE_EVENTFD_CLOEXEC=1");
    }
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
