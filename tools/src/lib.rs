//! gt's observability tools, the readers of the events the runtime emits: the instruction
//! log ([`tape`]), and what the `gt` subcommands draw from it: the live monitor ([`top`]),
//! which finds running dispatchers with [`discover`].

pub mod discover;
pub mod tape;
pub mod top;
