"""CLI usage errors (unknown option or command, bad choice, missing argument, out-of-range value) are one line on
stderr, `kai-opt: error: ...` with a hint to the command's help, and exit code 2, for every command."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from builders import run_cli

from kai_opt.cli.main import _register, app

_register()


def _leaf_commands(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    subs = getattr(cmd, "commands", None)
    if not subs:
        return [(path, cmd)]
    return [leaf for name, sub in sorted(subs.items()) for leaf in _leaf_commands(sub, (*path, name))]


COMMANDS = _leaf_commands(typer.main.get_command(app))
WITH_ARGUMENT = [(path, cmd) for path, cmd in COMMANDS if any(p.required for p in cmd.params)]


run = run_cli


def assert_usage_error(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], hint: str, *needles: str) -> str:
    code, out, err = run(capsys, *args)
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), repr(err)
    assert err.startswith("kai-opt: error: ")
    assert err.rstrip().endswith(f"(see {hint} --help)"), err
    assert "Usage:" not in err and "Try '" not in err and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_every_command_is_found() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"solve", "simulate", "show", "fairshare", "explain", "config", "conformance", "bench run"} <= names


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: "-".join(p))
def test_unknown_option(capsys: pytest.CaptureFixture[str], path: tuple[str, ...]) -> None:
    assert_usage_error(capsys, (*path, "--no-such-option"), " ".join(("kai-opt", *path)),
                       "No such option: --no-such-option")


@pytest.mark.parametrize("path", [p for p, _ in WITH_ARGUMENT], ids=lambda p: "-".join(p))
def test_missing_argument(capsys: pytest.CaptureFixture[str], path: tuple[str, ...]) -> None:
    assert_usage_error(capsys, path, " ".join(("kai-opt", *path)), "Missing argument")


@pytest.mark.parametrize("args", [
    ("solve", "x.yaml", "-e", "nope"),
    ("solve", "x.yaml", "-o", "xml"),
    ("simulate", "x.yaml", "-o", "xml"),
    ("show", "x.yaml", "-o", "xml"),
    ("explain", "x.yaml", "-e", "nope"),
    ("conformance", "cases", "-e", "nope"),
])
def test_bad_choice(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> None:
    err = assert_usage_error(capsys, args, f"kai-opt {args[0]}", "Invalid value for", "nope" if "nope" in args
                             else "xml")
    assert "Value error" not in err


@pytest.mark.parametrize("args", [
    ("simulate", "x.yaml", "--cycles", "0"),
    ("simulate", "x.yaml", "--cycles", "-5"),
    ("run", "--metrics-port", "70000"),
    ("bench", "trace", "--seeds", "0"),
])
def test_out_of_range(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> None:
    hint = "kai-opt bench trace" if args[0] == "bench" else f"kai-opt {args[0]}"
    assert_usage_error(capsys, args, hint, "Invalid value for")


@pytest.mark.parametrize("args, hint", [(("frob",), "kai-opt"), (("bench", "frob"), "kai-opt bench")])
def test_unknown_command(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], hint: str) -> None:
    assert_usage_error(capsys, args, hint, "No such command 'frob'")


def test_help_and_version_still_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "solve", "--help")
    assert code == 0 and "Usage: kai-opt solve" in out and err == ""
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("kai-opt ")


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 2 and "Commands:" in out + err
