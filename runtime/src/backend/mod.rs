//! Backends: where instructions execute. `cpu` holds the reference interpreter.

pub mod cpu;
