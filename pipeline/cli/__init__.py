"""The `changewatch` command: its parser and one module per command that needs more than a
few lines (demo, sql, eval, digest, resume), and the in-process runs they share."""
