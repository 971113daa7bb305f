"""DeviceTaintRule (`resource.k8s.io/v1beta2`): an admin's taint on the devices a selector picks.

Kubernetes 1.36 serves it only with the beta API `resource.k8s.io/v1beta2` and the `DRADeviceTaintRules` gate on
(both off by default); where it is served, kube-scheduler's slice tracker adds each rule's taint to the devices it
selects as if the driver had put it in the ResourceSlice. The same here (`apply_taint_rules`, called when a
snapshot is read), so every engine, the checker, explain and the bind-time choice see those taints through the
devices. Rules, as the tracker (k8s.io/dynamic-resource-allocation resourceslice/tracker, `applyPatches`): a set
`driver`, `pool` or `device` must equal the slice's driver, pool name or device name; unset fields (and a missing
selector) match any. NoExecute evicts nothing here: that is the device taint eviction controller's job
(kube-controller-manager).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kai_opt.api.dra import TAINT_EFFECTS, DeviceTaint, ResourceSlice
from kai_opt.api.meta import MODEL, ObjectMeta, as_dict, ident
from kai_opt.errors import InputError

API_VERSION = "resource.k8s.io/v1beta2"


class DeviceTaintRule(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    taint: DeviceTaint

    @property
    def name(self) -> str:
        return self.meta.name

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return ((self.driver is None or self.driver == driver) and (self.pool is None or self.pool == pool)
                and (self.device is None or self.device == device))

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> DeviceTaintRule:
        who = ident("DeviceTaintRule", obj)
        meta = ObjectMeta.from_k8s("DeviceTaintRule", obj, namespaced=False)
        spec = as_dict(obj.get("spec"), obj=who, field="spec")
        sel = as_dict(spec.get("deviceSelector"), obj=who, field="spec.deviceSelector")
        picks: dict[str, str | None] = {}
        for f in ("driver", "pool", "device"):
            v = sel.get(f)
            if v is not None and (not isinstance(v, str) or not v):
                raise InputError("must be a non-empty string", obj=who, field=f"spec.deviceSelector.{f}")
            picks[f] = v
        t = as_dict(spec.get("taint"), obj=who, field="spec.taint")
        if not isinstance(t.get("key"), str) or not t["key"]:
            raise InputError("key is required", obj=who, field="spec.taint.key")
        effect = t.get("effect")
        if effect not in TAINT_EFFECTS:
            raise InputError(f"unknown effect {effect!r}", obj=who, field="spec.taint.effect")
        return cls(meta=meta, taint=DeviceTaint(key=t["key"], value=str(t.get("value") or ""), effect=effect),
                   **picks)


def apply_taint_rules(slices: list[ResourceSlice], rules: list[DeviceTaintRule]) -> list[ResourceSlice]:
    """The slices with every rule's taint added to the devices it selects (slices no rule touches as they are)."""
    if not rules:
        return slices
    out = []
    for s in slices:
        touching = [r for r in rules if (r.driver is None or r.driver == s.driver)
                    and (r.pool is None or r.pool == s.pool)]
        if not touching:
            out.append(s)
            continue
        devices = []
        for d in s.devices:
            extra = tuple(r.taint for r in touching if r.selects(s.driver, s.pool, d.name))
            devices.append(d.model_copy(update={"taints": d.taints + extra}) if extra else d)
        out.append(s.model_copy(update={"devices": tuple(devices)}))
    return out
