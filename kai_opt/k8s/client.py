"""Connecting to a cluster: an `ApiClient` from a kubeconfig, in-cluster config or explicit credentials; the
kai-opt CRDs; raw JSON requests; and applying multi-document YAML (create, or replace what exists)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from kai_opt.errors import KaiOptError

# CRD, CRDS and the groups are re-exported: they live in kai_opt/k8s/kinds.py, which imports no client
from kai_opt.k8s.kinds import (  # noqa: F401
    CRD,
    CRDS,
    KAI_GROUP,
    PODGROUP,
    QUEUE,
    SCHEDULING_GROUP,
    TOPOLOGY,
    crd_manifests,
    parse_yaml,
)

DEFAULT_TIMEOUT = (5.0, 120.0)  # (connect, read) seconds for one request


class ClusterError(KaiOptError):
    """The cluster cannot be reached, refused a request, or the connection settings are wrong (one line)."""


class ClusterRequestError(ClusterError):
    """A request to the cluster failed (unreachable, refused, forbidden): a runtime failure, exit code 1 as
    kubectl's; wrong connection settings (a missing kubeconfig) stay bad input, exit code 2."""

    exit_code = 1




# -- connecting ------------------------------------------------------------------------------------------------------
def make_api_client(
    *,
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    in_cluster: bool = False,
    host: str | None = None,
    token: str | None = None,
    ca_file: str | Path | None = None,
    insecure: bool = False,
    pool_size: int | None = None,
) -> client.ApiClient:
    """An ApiClient from explicit `host` (+ bearer `token`, `ca_file` or `insecure`), in-cluster config, or a
    kubeconfig (`kubeconfig`, else $KUBECONFIG / ~/.kube/config; in-cluster when none exists and running in a pod).
    `pool_size`: most connections kept open to the server (default: urllib3's, per CPU)."""
    cfg = client.Configuration()
    try:
        if host:
            cfg.host = host.rstrip("/")
            if token:
                cfg.api_key = {"authorization": f"Bearer {token}"}
            if ca_file:
                cfg.ssl_ca_cert = str(ca_file)
            cfg.verify_ssl = not insecure
        elif kubeconfig and not Path(kubeconfig).is_file():
            raise ClusterError(f"cannot load kubeconfig {kubeconfig}: no such file")
        elif in_cluster:
            config.load_incluster_config(client_configuration=cfg)
        else:
            try:
                config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, context=context,
                                        client_configuration=cfg, persist_config=False)
            except ConfigException:
                if kubeconfig or not _in_pod():
                    if not kubeconfig and not _default_kubeconfig_exists():
                        raise ClusterError("no kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and not "
                                           "running in a pod") from None
                    raise
                config.load_incluster_config(client_configuration=cfg)
    except (ConfigException, OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "cluster configuration"
        raise ClusterError(f"cannot load {where}: {_one_line(exc)}") from exc
    cfg.retries = urllib3.Retry(total=3, connect=1, backoff_factor=0.2)  # an unreachable server fails fast
    if pool_size:  # concurrent requests (watches, binder workers) each hold a connection
        cfg.connection_pool_maxsize = pool_size
    if not cfg.verify_ssl:  # the user asked for it (insecure-skip-tls-verify); kubectl does not warn either
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    api = client.ApiClient(configuration=cfg)
    api.user_agent = "kai-opt"
    return api


def _default_kubeconfig_exists() -> bool:
    paths = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return any(Path(p).is_file() for p in paths.split(os.pathsep) if p)


def _in_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def cluster_error(exc: BaseException, what: str, api: client.ApiClient | None = None) -> ClusterRequestError:
    """A one-line `ClusterError` for a failed request (`what`: e.g. "list nodes")."""
    server = f" at {api.configuration.host}" if api is not None else ""
    if isinstance(exc, ApiException):
        detail = status_message(exc)
        return ClusterRequestError(f"{what}: the API server{server} answered {exc.status} {exc.reason}"
                            + (f": {detail}" if detail and detail != exc.reason else ""))
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, urllib3.exceptions.SSLError | urllib3.exceptions.ProtocolError
                  | urllib3.exceptions.NewConnectionError):
        return ClusterRequestError(f"{what}: cannot connect to the API server{server}: {_short_reason(exc)}")
    return ClusterRequestError(f"{what}: cannot reach the API server{server}: {_short_reason(exc)}")


def _short_reason(exc: BaseException) -> str:
    # urllib3 prefixes "<...HTTPSConnection object at 0x...>: " or "HTTPSConnection(host=..., port=...): "
    return re.sub(r"^(<[^>]*>|\w*Connection\([^)]*\)): ", "", _one_line(exc))


def status_message(exc: ApiException) -> str:
    """The `message` of the Status the server answered with, else the raw body (one line)."""
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else exc.body
    try:
        return " ".join(str(json.loads(body).get("message") or body).split())
    except (TypeError, ValueError, AttributeError):
        return " ".join(str(body or "").split())


# -- raw JSON requests -----------------------------------------------------------------------------------------------
MERGE_PATCH = "application/merge-patch+json"  # a dict body merged into the object (lists replaced whole)
JSON_PATCH = "application/json-patch+json"  # a list of RFC 6902 operations (with `test` preconditions)


def request(api: client.ApiClient, method: str, path: str, *, body: Any = None,
            query: dict[str, Any] | None = None, timeout: Any = DEFAULT_TIMEOUT,
            content_type: str | None = None) -> Any:
    """One authenticated JSON request; returns the decoded body. Errors raise `ApiException` (HTTP status)
    or urllib3 errors (connection): callers turn them into `ClusterError` with `cluster_error`.
    `content_type`: for PATCH, `MERGE_PATCH` or `JSON_PATCH` (default: application/json)."""
    resp = _send(api, method, path, body=body, query=query, timeout=timeout, content_type=content_type)
    raw = resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=raw.decode("utf-8", "replace"), data=None)
    return json.loads(raw) if raw else None


def request_status(api: client.ApiClient, method: str, path: str, *, body: Any = None,
                   query: dict[str, Any] | None = None, timeout: Any = DEFAULT_TIMEOUT,
                   content_type: str | None = None) -> tuple[int, Any]:
    """`request` that also returns the HTTP status (a server-side apply answers 201 when it created the object)."""
    resp = _send(api, method, path, body=body, query=query, timeout=timeout, content_type=content_type)
    raw = resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=raw.decode("utf-8", "replace"), data=None)
    return int(resp.status), (json.loads(raw) if raw else None)


def _send(api: client.ApiClient, method: str, path: str, *, body: Any, query: dict[str, Any] | None,
          timeout: Any, content_type: str | None) -> Any:
    params = [(k, v) for k, v in (query or {}).items() if v is not None]
    ctype = content_type or "application/json"
    method, url, headers, data, post = api.param_serialize(
        method=method, resource_path=path, query_params=params, body=body, auth_settings=["BearerToken"],
        header_params={"Accept": "application/json", **({"Content-Type": ctype} if body is not None else {})})
    return api.call_api(method, url, header_params=headers, body=data, post_params=post, _request_timeout=timeout)


def stream_lines(api: client.ApiClient, path: str, *, query: dict[str, Any] | None = None,
                 timeout: Any = DEFAULT_TIMEOUT, opened: Any = None) -> Iterator[bytes]:
    """GET `path` and yield the response body line by line as it arrives (a watch). `opened(response)` is
    called with the urllib3 response first, so another thread can `shutdown()` it to end the stream.
    A non-2xx answer raises `ApiException`."""
    resp = _send(api, "GET", path, body=None, query=query, timeout=timeout, content_type=None)
    raw = resp.response
    try:
        if not 200 <= resp.status <= 299:
            body = raw.read()
            raise ApiException.from_response(http_resp=resp, body=body.decode("utf-8", "replace"), data=None)
        if opened is not None:
            opened(raw)
        pending = b""
        for chunk in raw.stream(64 * 1024, decode_content=True):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    yield line
        if pending.strip():
            yield pending
    finally:
        raw.release_conn()


def read_json(resp: Any) -> Any:
    """Decode a `_preload_content=False` response of a typed API call."""
    return json.loads(resp.data)


# -- manifests and apply ---------------------------------------------------------------------------------------------
class Discovery:
    """kind -> (plural, namespaced) per apiVersion, asked from the server once."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._cache: dict[str, dict[str, tuple[str, bool]]] = {}

    def resource(self, api_version: str, kind: str, *, wait: float = 10.0) -> tuple[str, bool]:
        deadline = time.monotonic() + wait  # a just-established CRD can take a moment to appear in discovery
        while kind not in self._cache.get(api_version, {}):
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                found = request(self.api, "GET", path)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                found = {}
            self._cache[api_version] = {r["kind"]: (r["name"], bool(r.get("namespaced")))
                                        for r in found.get("resources", []) if "/" not in r["name"]}
            if kind in self._cache[api_version]:
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"the API server does not serve kind {kind} in {api_version}")
            time.sleep(0.2)
        return self._cache[api_version][kind]


def object_path(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{plural}" + (f"/{name}" if name else "")


def apply_objects(api: client.ApiClient, objects: Iterable[dict[str, Any]], *,
                  crd_timeout: float = 60.0) -> list[str]:
    """Create each object, or replace it when it exists (CRDs and Namespaces first; new CRDs are waited for
    until Established). Returns lines like "queue.scheduling.run.ai/team-a created". Like kubectl, this writes
    spec and metadata only: `status` of kinds with a status subresource (pods, CRs) needs a status update.
    A replace drops fields other managers set: `kai-opt manifests --apply` uses server-side apply (k8s/ssa.py)."""
    return apply_in_order(api, objects, _apply_one, crd_timeout=crd_timeout)


def apply_in_order(api: client.ApiClient, objects: Iterable[dict[str, Any]],
                   apply: Callable[[client.ApiClient, Discovery, dict[str, Any]], str], *,
                   crd_timeout: float = 60.0) -> list[str]:
    """`apply` each object, CRDs and Namespaces first; the CRDs are waited for until Established, so the objects of
    their kinds that follow are known. Returns what `apply` said of each."""
    objs = list(objects)
    first = [o for o in objs if o["kind"] in ("CustomResourceDefinition", "Namespace")]
    rest = [o for o in objs if o["kind"] not in ("CustomResourceDefinition", "Namespace")]
    disco = Discovery(api)
    done: list[str] = []
    for batch in (first, rest):
        for obj in batch:
            done.append(apply(api, disco, obj))
        crds = [o["metadata"]["name"] for o in batch if o["kind"] == "CustomResourceDefinition"]
        if crds:
            wait_crds_established(api, crds, timeout=crd_timeout)
    return done


def _apply_one(api: client.ApiClient, disco: Discovery, obj: dict[str, Any]) -> str:
    api_version, kind = obj["apiVersion"], obj["kind"]
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    label = f"{kind.lower()}.{api_version.split('/')[0]}/{name}" if "/" in api_version else f"{kind.lower()}/{name}"
    try:
        plural, namespaced = disco.resource(api_version, kind)
        namespace = (meta.get("namespace") or "default") if namespaced else None
        try:
            request(api, "POST", object_path(api_version, plural, namespace), body=obj)
            return f"{label} created"
        except ApiException as exc:
            if exc.status != 409:
                raise
        current = request(api, "GET", object_path(api_version, plural, namespace, name))
        body = {**obj, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
        request(api, "PUT", object_path(api_version, plural, namespace, name), body=body)
        return f"{label} configured"
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        raise cluster_error(exc, f"apply {label}", api) from exc


def wait_crds_established(api: client.ApiClient, names: Iterable[str], *, timeout: float = 60.0) -> None:
    """Block until every named CRD has condition Established=True (or raise `ClusterError`)."""
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending:
        for name in sorted(pending):
            try:
                crd = request(api, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            except (ApiException, urllib3.exceptions.HTTPError) as exc:
                raise cluster_error(exc, f"read CRD {name}", api) from exc
            conds = (crd.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                pending.discard(name)
        if pending and time.monotonic() > deadline:
            raise ClusterError(f"CRDs not established after {timeout:g}s: {', '.join(sorted(pending))}")
        if pending:
            time.sleep(0.1)


def install_crds(api: client.ApiClient, *, timeout: float = 60.0) -> list[str]:
    """Create or replace kai-opt's CRDs and wait until they are served."""
    return apply_objects(api, parse_yaml(crd_manifests()), crd_timeout=timeout)
