"""Entry point of the `kai-opt` console script (and of `kubectl kai-opt`, `python -m kai_opt`): errors are one line
on stderr; exit code 2 for usage errors and bad input, 1 for runtime failures (a request to the cluster failed).

Click's own errors (unknown option or command, bad choice, missing argument, out-of-range value) are caught here,
not printed by click, so they read like every other user error: one line with a hint to the command's help.
"""

from __future__ import annotations

import sys

import typer

from kai_opt.cli.app import app, load_all
from kai_opt.errors import KaiOptError

# click's exception classes, wherever this typer takes click from (typer >= 0.2x vendors its own copy)
_click_errors = sys.modules[typer.BadParameter.__module__]
ClickException: type[Exception] = _click_errors.ClickException
NoArgsIsHelpError: type[Exception] = getattr(_click_errors, "NoArgsIsHelpError", ())  # type: ignore[assignment]


def _register(argv: list[str] | None = None) -> None:
    """Import every command module, each registers its command(s) on `app` (tests walk the whole command tree;
    `main` imports only the command asked for, through the lazy registry of kai_opt/cli/app.py)."""
    load_all()


def usage_line(exc: Exception) -> str:
    """`kai-opt: error: <click's message> (see <command> --help)`, always one line."""
    text = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
    text = text.replace(": Value error, ", ": ")  # typer passes pydantic's wording through for a bad choice
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        text += f" (see {ctx.command_path} --help)"
    return f"kai-opt: error: {text}"


def main(argv: list[str] | None = None) -> None:
    try:
        # standalone_mode=False: click raises its errors instead of printing usage boilerplate, and returns the
        # code of an explicit exit (typer.Exit, --help) instead of calling sys.exit
        code = app(args=argv, prog_name="kai-opt", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # `kai-opt` alone, or a group without its command: help
        exc.show()  # type: ignore[attr-defined]
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except ClickException as exc:
        print(usage_line(exc), file=sys.stderr)
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except typer.Abort:
        print("kai-opt: aborted", file=sys.stderr)
        sys.exit(1)
    except KaiOptError as exc:
        print(f"kai-opt: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)  # 2 bad input; 1 a runtime failure (ClusterRequestError)
    except KeyboardInterrupt:
        print("kai-opt: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)  # as click's standalone mode: always through SystemExit


if __name__ == "__main__":
    main()
