//! gt's observability tools, the readers of the events the runtime emits: the instruction
//! log ([`tape`]), and what the `gt` subcommands draw from it.

pub mod tape;
pub mod visualize;
