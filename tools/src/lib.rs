//! gt's observability tools, the readers of the events the runtime emits: the instruction
//! log ([`tape`]), and what the `gt` subcommands make of it: timeline pictures
//! ([`visualize`]), Chrome/Perfetto traces ([`perfetto`]), the live monitor ([`top`]) and
//! trace capture ([`capture`]), which find running dispatchers with [`discover`].

pub mod capture;
pub mod discover;
pub mod perfetto;
pub mod prof;
pub mod tape;
pub mod top;
pub mod visualize;
