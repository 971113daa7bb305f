"""Object names in the config follow Kubernetes' own rules, anchored at both ends: a runtimeClassName (and every
other DNS-1123 subdomain field) that the apiserver would refuse is refused by `config --check` with one line naming
the field, not later by the cluster when the first reservation pod is created."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_hostile_inputs import one_line_error

from kai_opt.config import parse_config

SUBDOMAIN_FIELDS = [
    ("runtime", "gpu_sharing", "runtime_class_name"),
    ("runtime", "gpu_sharing", "reservation_service_account"),
    ("usage_db", "ledger", "config_map_name"),
    ("autoscaler", "priority_class_name"),
]
BAD = ["BAD/nvidia", "Nvidia", "nvidia_gpu", "nvidia/", "-nvidia", "nvidia-", "a..b", "a.-b", ".a", "a.", "a b",
       "x" * 254, "ok\nbad"]
GOOD = ["nvidia", "nvidia.com", "a", "0", "a-b.c-d", "a" * 63 + "." + "b" * 63, "x" * 253]


def _nested(path: tuple[str, ...], value: str) -> dict[str, object]:
    data: dict[str, object] = {path[-1]: value}
    for key in reversed(path[:-1]):
        data = {key: data}
    return data


@pytest.mark.parametrize("value", BAD)
def test_runtime_class_name_outside_dns_1123_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        value: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"runtime:\n  gpu_sharing:\n    runtime_class_name: {value!r}\n")
    err = one_line_error(capsys, "config", "--check", str(path))
    assert str(path) in err and "field runtime.gpu_sharing.runtime_class_name" in err


@pytest.mark.parametrize("value", [*GOOD, ""])
def test_runtime_class_name_valid_names_and_none(value: str) -> None:
    assert parse_config(_nested(SUBDOMAIN_FIELDS[0], value)).runtime.gpu_sharing.runtime_class_name == value


@pytest.mark.parametrize("field", SUBDOMAIN_FIELDS, ids=".".join)
def test_every_subdomain_field_is_anchored(field: tuple[str, ...]) -> None:
    from kai_opt.errors import ConfigError

    for value in BAD:
        with pytest.raises(ConfigError, match=f"field {'.'.join(field)}"):
            parse_config(_nested(field, value))
    for value in GOOD:
        parse_config(_nested(field, value))
    if field[-1] != "runtime_class_name":  # only the runtime class may be '' (none)
        with pytest.raises(ConfigError):
            parse_config(_nested(field, ""))
