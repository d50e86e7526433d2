//! gt: facade crate re-exporting the user API.
