//! Typed ids: `ValueId` names an SSA value (a tensor) in a program or a client's stream.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An SSA value: defined by exactly one instruction, read by any later one until freed.
///
/// In a parsed program ids are dense (`0..program.names.len()`) and the program's name
/// table gives each its text name; in a client stream they are the client's own ids.
/// `Display` is the stream text form `%N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The id as an index into per-value tables.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}
