"""The `kai-opt` command line (typer). Each command lives in its own module and registers on `app`."""
