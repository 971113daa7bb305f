"""Entry point of the `kai-opt` console script: user errors are one line on stderr and exit code 2."""

from __future__ import annotations

import sys

from kai_opt.cli.app import app
from kai_opt.errors import KaiOptError

_NOT_COMMANDS = {"app", "main", "render"}


def _register(argv: list[str] | None = None) -> None:
    """Import the command modules of this package, each registers its command(s) on `app`: only those of the
    command asked for (`solve` -> solve, `config` -> config_cmd, `bench` -> bench*), else (help, an unknown name)
    all. Importing all costs about 2 s (SciPy, OR-Tools, pandas), far more than refusing a bad input takes."""
    import importlib
    import pkgutil

    import kai_opt.cli as pkg

    modules = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)
                     if m.name not in _NOT_COMMANDS and not m.name.startswith("_"))
    args = sys.argv[1:] if argv is None else argv
    first = next((a for a in args if not a.startswith("-")), None)
    wanted = [m for m in modules if first is not None and (m == first or m.startswith(f"{first}_"))]
    for mod in wanted or modules:
        importlib.import_module(f"kai_opt.cli.{mod}")


def main(argv: list[str] | None = None) -> None:
    _register(argv)
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
