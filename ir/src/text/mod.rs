//! The `.gtir` text format: lexer, parser and printer.
