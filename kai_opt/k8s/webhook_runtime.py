"""Running the GPU-sharing webhook beside `kai-opt run`: its certificate from (or into) the Secret, the
configuration's caBundle kept equal to its CA (checked again every `CA_RECHECK_S`: re-applying the manifests
clears it), and the HTTPS server."""

from __future__ import annotations

import logging
import threading

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import ClusterError, cluster_error
from kai_opt.k8s.webhook import WebhookServer, ensure_ca_bundle, ensure_tls, service_dns_names

log = logging.getLogger(__name__)

CA_RECHECK_S = 30.0


class RunningWebhook:
    def __init__(self, api: client.ApiClient, server: WebhookServer, ca_pem: str) -> None:
        self.api = api
        self.server = server
        self.ca_pem = ca_pem
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._recheck, name="webhook-ca", daemon=True)
        self._thread.start()

    def _recheck(self) -> None:
        while not self._stop.wait(CA_RECHECK_S):
            try:
                ensure_ca_bundle(self.api, self.ca_pem)
            except Exception as exc:  # tried again later
                log.warning("webhook caBundle check failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self.server.stop()


def start_webhook(api: client.ApiClient, namespace: str, port: int) -> RunningWebhook:
    """Serve the webhook on `port` with the certificate of Secret `kai-opt-webhook-tls` in `namespace`."""
    try:
        tls = ensure_tls(api, namespace, service_dns_names(namespace))
        ensure_ca_bundle(api, tls.ca_pem)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        raise cluster_error(exc, "set up the GPU-sharing webhook's certificate", api) from exc
    except RuntimeError as exc:  # a Secret of that name without the certificate's keys
        raise ClusterError(str(exc)) from exc
    server = WebhookServer(tls, port=port).start()
    log.info("GPU-sharing webhook on :%d (https, %s)", server.port, "/mutate-pods")
    return RunningWebhook(api, server, tls.ca_pem)
