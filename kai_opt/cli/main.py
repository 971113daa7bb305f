"""Entry point of the `kai-opt` console script: user errors are one line on stderr and exit code 2."""

from __future__ import annotations

import sys

from kai_opt.cli.app import app
from kai_opt.errors import KaiOptError


def _register() -> None:
    # importing a command module registers its command on `app`
    from kai_opt.cli import show  # noqa: F401


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
