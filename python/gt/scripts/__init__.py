"""`python -m gt.scripts visualize|top|trace`: gt's own tools (`gt visualize`, `gt top`,
`gt trace`), as the Python GT's scripts were called."""
