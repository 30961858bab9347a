#!/usr/bin/env python3
"""Installs the chart into a real apiserver with Helm 4 (helm-python-sdk),
once per shape, then reads every object of each release back from the
apiserver with the official `kubernetes` client.

    helm_install.py KUBECONFIG CHART

Prints one JSON object: by release, its namespace, its service account, the
objects it made (kind/name) and the ones the apiserver does not have.
Run by tests/integration/tests/chart_server_side.rs."""

import json
import sys

import helm_python as helm
import yaml
from kubernetes import client, config, dynamic

KUBECONFIG, CHART = sys.argv[1], sys.argv[2]

REMOTES = [{"name": "cluster-a", "secretName": "tether-cluster-a"},
           {"name": "cluster-b", "secretName": "tether-cluster-b", "required": False}]

# release -> values
SHAPES = {
    "one": {"remotes": REMOTES, "homeCluster": {"watch": True}},
    "ha": {"remotes": REMOTES, "replicaCount": 3},
    "shards": {"remotes": REMOTES, "replicaCount": 3, "sharding": {"enabled": True}},
    # Remotes from the Secrets of two namespaces; two sources share one.
    "fleet": {"discovery": [
        {"secrets": {"namespace": "argocd", "format": "argocd"}},
        {"secrets": {"namespace": "argocd", "format": "kubeconfig", "labelSelector": "tier=edge"}},
        {"secrets": {"namespace": "capi", "format": "clusterapi", "required": False}},
    ]},
}
# The namespaces discovery reads are the fleet's tools', made before tether.
DISCOVERED = ["argocd", "capi"]

api = dynamic.DynamicClient(config.new_client_from_config(config_file=KUBECONFIG))
for namespace in DISCOVERED:
    api.resources.get(api_version="v1", kind="Namespace").create(
        body={"metadata": {"name": namespace}})
out = {}
for release, values in SHAPES.items():
    namespace = f"tether-{release}"
    helm_config = helm.Config(kubeconfig_path=KUBECONFIG, namespace=namespace)
    installed = helm_config.install(
        helm.Chart.load(CHART), release, values, namespace=namespace,
        create_namespace=True, timeout=60,
    )
    manifest = installed["manifest"] if isinstance(installed, dict) else installed.manifest
    objects, missing, service_account = [], [], None
    for doc in yaml.safe_load_all(manifest):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        objects.append(f"{kind}/{name}")
        if kind == "ServiceAccount":
            service_account = name
        resource = api.resources.get(api_version=doc["apiVersion"], kind=kind)
        try:
            if resource.namespaced:
                resource.get(name=name, namespace=doc["metadata"].get("namespace", namespace))
            else:
                resource.get(name=name)
        except client.exceptions.ApiException as err:
            missing.append(f"{kind}/{name}: {err.status}")
    out[release] = {"namespace": namespace, "serviceAccount": service_account,
                    "objects": sorted(objects), "missing": missing}
print(json.dumps(out))
