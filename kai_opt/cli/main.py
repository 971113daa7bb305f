"""Entry point of the `kai-opt` console script: user errors are one line on stderr and exit code 2."""

from __future__ import annotations

import sys

from kai_opt.cli.app import app
from kai_opt.errors import KaiOptError

_NOT_COMMANDS = {"app", "main", "render"}


def _register() -> None:
    """Import every command module of this package: each registers its command(s) on `app`."""
    import importlib
    import pkgutil

    import kai_opt.cli as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if mod not in _NOT_COMMANDS and not mod.startswith("_"):
            importlib.import_module(f"kai_opt.cli.{mod}")


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        app(args=argv, prog_name="kai-opt")
    except KaiOptError as exc:
        print(f"kai-opt: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("kai-opt: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
