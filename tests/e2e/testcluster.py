"""A real kube-apiserver + etcd on loopback for end-to-end tests, started the way controller-runtime's envtest does
(DESIGN.md section 7), and an optional kwok that plays kubelet for every node.

Auth is a static token file: an admin token (group system:masters) and one token per test identity; authorization
is RBAC. Serving certificates come from a throwaway CA generated here. All processes die with the test session
(terminated at `stop()`, and by PR_SET_PDEATHSIG if the test process itself is killed).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import install_crds, make_api_client, object_path, request

REPO = Path(__file__).resolve().parents[2]
BINARIES = ("etcd", "kube-apiserver", "kwok")
DEFAULT_IDENTITIES = ("kai-opt", "reader")  # users with a token and no RBAC until a test grants some
START_TIMEOUT = 90.0
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")  # kwok has no built-in stages without kwokctl


class ClusterStartError(RuntimeError):
    """A test-cluster process failed to start or become ready (message carries its log tail)."""


# -- binaries, ports, certificates -----------------------------------------------------------------------------------
def find_testbin() -> Path:
    """The directory holding etcd/kube-apiserver/kwok: $KAI_OPT_TESTBIN when it holds them, else the directory
    `scripts/build-testbin` prints (it builds what is missing; a no-op when built)."""
    env = os.environ.get("KAI_OPT_TESTBIN")
    if env and all(os.access(Path(env) / b, os.X_OK) for b in BINARIES):
        return Path(env)
    proc = subprocess.run([str(REPO / "scripts" / "build-testbin")], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ClusterStartError(f"scripts/build-testbin failed ({proc.returncode}):\n{_tail(proc.stderr)}")
    return Path(lines[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def write_certs(directory: Path) -> dict[str, Path]:
    """A CA, a serving certificate for 127.0.0.1/localhost signed by it, and a service-account key pair."""
    now = dt.datetime.now(dt.UTC)
    ca_key, srv_key, sa_key = _key(), _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kai-opt-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
           .issuer_name(ca_name).public_key(srv_key.public_key()).serial_number(x509.random_serial_number())
           .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=7))
           .add_extension(x509.SubjectAlternativeName([
               x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"),
               x509.DNSName("kubernetes.default.svc"), x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]),
               critical=False)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
           .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
           .sign(ca_key, hashes.SHA256()))
    files = {"ca": directory / "ca.crt", "cert": directory / "apiserver.crt", "key": directory / "apiserver.key",
             "sa_key": directory / "sa.key", "sa_pub": directory / "sa.pub"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(_pem_key(srv_key))
    files["sa_key"].write_bytes(_pem_key(sa_key))
    files["sa_pub"].write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    for name in ("key", "sa_key"):
        files[name].chmod(0o600)
    return files


def write_kubeconfig(path: Path, *, host: str, token: str, ca_file: Path, user: str = "user") -> Path:
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": host, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
    return path


# -- processes -------------------------------------------------------------------------------------------------------
def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux only)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


class Process:
    """One child process with its output in a log file; `stop()` terminates it (then kills)."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name, self.argv, self.log = name, list(argv), log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return _tail(self.log.read_text(encoding="utf-8", errors="replace"), lines)
        except OSError:
            return "(no log)"

    def failure(self, why: str) -> ClusterStartError:
        return ClusterStartError(f"{self.name} {why}; last lines of {self.log}:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)


class LocalCluster:
    """etcd + kube-apiserver on loopback. `start()` returns when /readyz says ok; `stop()` ends both and removes
    the work directory (set KAI_OPT_KEEP_TESTCLUSTER=1 to keep it for the logs)."""

    def __init__(self, bin_dir: Path, *, identities: Sequence[str] = DEFAULT_IDENTITIES,
                 workdir: Path | None = None, apiserver_args: Sequence[str] = ()) -> None:
        self.bin_dir = bin_dir
        self.apiserver_args = list(apiserver_args)  # more kube-apiserver flags (e.g. --runtime-config)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kai-opt-testcluster-"))
        self.admin_token = secrets.token_hex(16)
        self.tokens: dict[str, str] = {name: secrets.token_hex(16) for name in identities}
        self.port = 0
        self.processes: list[Process] = []
        self._certs: dict[str, Path] = {}
        self._stopped = False

    # -- addresses and credentials --
    @property
    def host(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self._certs["ca"]

    def token(self, user: str | None = None) -> str:
        """The bearer token of `user` (None: the admin)."""
        return self.admin_token if user is None else self.tokens[user]

    def api_client(self, user: str | None = None) -> ApiClient:
        """A `kubernetes.client.ApiClient` as the admin (None) or as a test identity."""
        return make_api_client(host=self.host, token=self.token(user), ca_file=self.ca_file)

    def service_account_token(self, namespace: str, name: str, *, seconds: int = 3600) -> str:
        """A bound token of ServiceAccount `namespace/name` from the TokenRequest API (the ServiceAccount must
        exist): it authenticates as `system:serviceaccount:<namespace>:<name>` with the groups
        system:serviceaccounts, system:serviceaccounts:<namespace> and system:authenticated."""
        with self.api_client() as api:
            out = request(api, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                          body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": {"expirationSeconds": seconds}})
        return str(out["status"]["token"])

    def service_account_client(self, namespace: str, name: str) -> ApiClient:
        """A `kubernetes.client.ApiClient` authenticated as ServiceAccount `namespace/name`."""
        return make_api_client(host=self.host, token=self.service_account_token(namespace, name),
                               ca_file=self.ca_file)

    def kubeconfig(self, user: str | None = None, path: Path | None = None) -> Path:
        """A kubeconfig file for the admin or a test identity."""
        name = user or "admin"
        return write_kubeconfig(path or self.workdir / f"kubeconfig-{name}", host=self.host, token=self.token(user),
                                ca_file=self.ca_file, user=name)

    # -- lifecycle --
    def start(self, timeout: float = START_TIMEOUT) -> LocalCluster:
        atexit.register(self.stop)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        self._certs = write_certs(certs)
        tokens = self.workdir / "tokens.csv"
        rows = [f'{self.admin_token},admin,admin,"system:masters"']
        rows += [f"{tok},{user},{user}" for user, tok in self.tokens.items()]
        tokens.write_text("\n".join(rows) + "\n", encoding="utf-8")
        tokens.chmod(0o600)

        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        etcd = self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync=true", "--log-level=warn",
        ])
        deadline = time.monotonic() + timeout
        self._wait(etcd, f"{etcd_url}/health", deadline, ok=lambda body: json.loads(body).get("health") == "true")

        self.port = free_port()
        apiserver = self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={certs}", f"--tls-cert-file={self._certs['cert']}",
            f"--tls-private-key-file={self._certs['key']}",
            f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self._certs['sa_pub']}",
            f"--service-account-signing-key-file={self._certs['sa_key']}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--allow-privileged=true", "--profiling=false", "--v=1", *self.apiserver_args,
        ])
        self._wait(apiserver, f"{self.host}/readyz", deadline, ok=lambda body: body.strip() == "ok")

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = Process(name, argv, self.workdir / f"{name}.log")
        self.processes.append(proc)
        return proc

    def _wait(self, proc: Process, url: str, deadline: float, ok: Any) -> None:
        ctx = ssl.create_default_context(cafile=str(self._certs["ca"]))
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.admin_token}"})
        last = ""
        while True:
            if not proc.running():
                raise proc.failure(f"exited with code {proc.proc.returncode}")
            try:
                with urllib.request.urlopen(req, timeout=2, context=ctx if url.startswith("https") else None) as r:
                    body = r.read().decode()
                if ok(body):
                    return
                last = body
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = getattr(exc, "read", lambda: b"")().decode(errors="replace") or str(exc)
            if time.monotonic() > deadline:
                raise proc.failure(f"not ready at {url} (last answer: {_tail(last, 5)!r})")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for proc in reversed(self.processes):
            proc.stop()
        if not os.environ.get("KAI_OPT_KEEP_TESTCLUSTER"):
            shutil.rmtree(self.workdir, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    # -- conveniences for tests --
    def install_crds(self) -> None:
        with self.api_client() as api:
            install_crds(api)

    @contextlib.contextmanager
    def kwok(self) -> Iterator[Process]:
        """Run kwok as the kubelet of every node (nodes become Ready, bound pods Running, deletions complete)."""
        kubeconfig = self.kubeconfig(path=self.workdir / "kubeconfig-kwok")
        proc = self._spawn("kwok", [
            str(self.bin_dir / "kwok"), f"--kubeconfig={kubeconfig}", f"--config={KWOK_STAGES}",
            "--manage-all-nodes=true", "--cidr=10.244.0.0/16", "--node-ip=10.96.0.1",
        ])
        try:
            time.sleep(0.5)
            if not proc.running():
                raise proc.failure(f"exited with code {proc.proc.returncode}")
            yield proc
        finally:
            proc.stop()
            self.processes.remove(proc)


# -- cleaning between tests ------------------------------------------------------------------------------------------
_RESET_KINDS = (  # (apiVersion, plural); pods first so nothing is left bound to a deleted node
    ("v1", "pods"),
    ("scheduling.run.ai/v2alpha2", "podgroups"),
    ("scheduling.run.ai/v2", "queues"),
    ("kai.scheduler/v1alpha1", "topologies"),
    ("scheduling.k8s.io/v1", "priorityclasses"),
    ("v1", "nodes"),
    ("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"),  # kai-opt's, left by a test
)


def reset_cluster(cluster: LocalCluster) -> None:
    """Delete every object tests create (grace period 0, so bound pods go without a kubelet); system priority
    classes and namespaces stay (namespaces cannot finish deleting without a controller-manager)."""
    with cluster.api_client() as api:
        for api_version, plural in _RESET_KINDS:
            items = request(api, "GET", object_path(api_version, plural, None))["items"]
            for item in items:
                meta = item["metadata"]
                if plural == "priorityclasses" and meta["name"].startswith("system-"):
                    continue
                path = object_path(api_version, plural, meta.get("namespace"), meta["name"])
                with contextlib.suppress(ApiException):  # already gone
                    request(api, "DELETE", path, query={"gracePeriodSeconds": 0})


def delete_cluster_rbac(api: ApiClient, name: str) -> None:
    """Delete the ClusterRoleBinding and ClusterRole `name` (cluster-scoped: a namespace reset leaves them)."""
    for path in (f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
                 f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}"):
        with contextlib.suppress(ApiException):
            request(api, "DELETE", path)


def ensure_namespace(api: ApiClient, name: str) -> None:
    """Create namespace `name` unless it exists."""
    try:
        request(api, "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise
