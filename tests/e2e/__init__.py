"""End-to-end tests against a real kube-apiserver + etcd (see testcluster.py); all are marked `e2e`."""
