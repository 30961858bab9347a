"""The official Python `kubernetes` client against the simulated apiserver.

Run by tests/integration/tests/python_client.rs with the kubeconfig as its
one argument. It prints one JSON object of what it observed; the Rust test
asserts on it, so a failure names the observation that differs.
"""

import json
import sys

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def api_error(call):
    """Runs `call`; returns the ApiException's status and reason, or None."""
    try:
        call()
    except ApiException as err:
        body = json.loads(err.body)
        return {"status": err.status, "reason": body.get("reason"), "kind": body.get("kind")}
    return None


def main(kubeconfig):
    config.load_kube_config(config_file=kubeconfig)
    core = client.CoreV1Api()
    coordination = client.CoordinationV1Api()
    seen = {}

    listed = core.list_namespaced_config_map("default")
    seen["listed"] = sorted(cm.metadata.name for cm in listed.items)
    since = listed.metadata.resource_version

    made = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="from-python"), data={"a": "1"})
    core.create_namespaced_config_map("default", made)
    seen["create_again"] = api_error(lambda: core.create_namespaced_config_map("default", made))

    # A watch from the list's version replays what happened since.
    events = []
    for event in watch.Watch().stream(
        core.list_namespaced_config_map, "default", resource_version=since, timeout_seconds=5
    ):
        events.append([event["type"], event["object"].metadata.name])
        if event["object"].metadata.name == "from-python":
            break
    seen["watched"] = events

    merged = core.patch_namespaced_config_map(
        "from-python", "default", {"data": {"b": "2"}}, _content_type="application/merge-patch+json"
    )
    seen["merge_patched"] = merged.data
    patched = core.patch_namespaced_config_map(
        "from-python", "default", [{"op": "replace", "path": "/data/a", "value": "3"}]
    )
    seen["json_patched"] = patched.data

    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="python-lease"),
        spec=client.V1LeaseSpec(holder_identity="python", lease_duration_seconds=15, lease_transitions=0),
    )
    created = coordination.create_namespaced_lease("default", lease)
    stale = created.metadata.resource_version
    created.spec.holder_identity = "python-2"
    replaced = coordination.replace_namespaced_lease("python-lease", "default", created)
    seen["replaced_holder"] = replaced.spec.holder_identity
    seen["version_moved"] = replaced.metadata.resource_version != stale
    created.metadata.resource_version = stale
    created.spec.holder_identity = "python-3"
    seen["stale_replace"] = api_error(
        lambda: coordination.replace_namespaced_lease("python-lease", "default", created)
    )
    seen["holder_after"] = coordination.read_namespaced_lease("python-lease", "default").spec.holder_identity
    seen["transitions"] = replaced.spec.lease_transitions
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
