//! The one integration-test binary: filetests with snapshots, `gt-run` CLI tests and tidy checks.

mod cli;
mod cluster;
mod distributed;
mod filetests;
mod fusion;
mod kernels;
mod ptx;
mod tidy;
