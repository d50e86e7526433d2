//! gt-transport: wire messages, msgpack codec and ZeroMQ endpoints; filled by the dispatcher issue.
