#!/usr/bin/env python3
"""Checks the Helm chart with real Helm 4 (helm-python-sdk), kubernetes-validate
and promtool. Run by scripts/test inside its venv; exits non-zero on any
failure, printing each check's result."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "tether"
RULES = ROOT / "alerts" / "tether.rules.yaml"
KUBE_VERSION = "1.33.0"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def render(values):
    chart = helm.Chart.load(str(CHART))
    out = chart.render(values, name="tether", namespace="monitoring")
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append(doc)
    return docs


def kubernetes_validate(docs, label):
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, doc in enumerate(d for d in docs if d["kind"] not in CRD_KINDS):
            path = Path(tmp) / f"{i:02d}-{doc['kind']}.yaml"
            path.write_text(yaml.safe_dump(doc))
            files.append(str(path))
        result = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", KUBE_VERSION, "--quiet", *files],
            capture_output=True, text=True,
        )
        check(result.returncode == 0, f"{label}: {len(files)} manifests validate strictly against Kubernetes {KUBE_VERSION}"
              + ("" if result.returncode == 0 else f"\n{result.stdout}{result.stderr}"))


def only(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    return found[0] if len(found) == 1 else None


def check_manager(label, values, pod, config):
    """The manager each way renders: the built-in one, tether inside the
    controller's image, or tether added to it by an init container."""
    exec_values = values.get("manager", {}).get("exec", {})
    command = exec_values.get("command", [])
    container = pod["containers"][0]
    if command and exec_values.get("separate", {}).get("enabled"):
        check_separate(label, values, pod, config)
        return
    if not command:
        check("manager" not in config and config.get("watch") and "initContainers" not in pod
              and container["name"] == "tether" and "command" not in container,
              f"{label}: the built-in watch manager, in tether's own image")
        return
    spec = config.get("manager", {}).get("exec", {})
    check("watch" not in config and spec.get("stopSignal") == "SIGTERM" and "gracePeriod" not in spec
          and spec.get("readiness") == exec_values.get("readiness"),
          f"{label}: the config has manager.exec, and no watch list")
    injected = exec_values.get("image", {}).get("repository")
    if injected:
        init = pod.get("initContainers", [{}])[0]
        shared = [v for v in pod["volumes"] if v["name"] == "tether-bin"]
        check(init.get("args") == ["install", "/install/tether"] and init["image"].startswith(values.get("image", {}).get("repository", "localhost/tether"))
              and shared == [{"name": "tether-bin", "emptyDir": {}}]
              and init.get("volumeMounts") == [{"name": "tether-bin", "mountPath": "/install"}]
              and {"name": "tether-bin", "mountPath": "/tether", "readOnly": True} in container["volumeMounts"],
              f"{label}: an init container from tether's image copies tether into a shared emptyDir")
        check(container["image"] == f"{injected}:{exec_values['image']['tag']}"
              and container["command"][:4] == ["/tether/tether", "run", "--config", "/etc/tether/config/config.yaml"]
              and container["command"][container["command"].index("--") + 1:] == command
              and "command" not in spec,
              f"{label}: the controller's image runs tether with its command after --, not in the config")
    else:
        check("initContainers" not in pod and container["command"] == ["/tether"]
              and container["args"][:3] == ["run", "--config", "/etc/tether/config/config.yaml"]
              and spec.get("command") == command,
              f"{label}: the controller's image runs tether, its command in the config")


def check_separate(label, values, pod, config):
    """The controller in a container of its own: tether's token in tether's
    container alone, the controller started there by `tether launcher`, and
    a ServiceAccount of its own whose tokens tether may request."""
    exec_values = values["manager"]["exec"]
    tether, controller = pod["containers"]
    spec = config["manager"]["exec"]
    socket = "/run/tether-launcher/launcher.sock"
    mounts = lambda c: {m["name"]: m for m in c.get("volumeMounts", [])}
    check([tether["name"], controller["name"]] == ["tether", "controller"] and pod["automountServiceAccountToken"] is False,
          f"{label}: two containers, tether and controller, and no token automounted in either")
    token = next(v for v in pod["volumes"] if v["name"] == "tether-token")
    sources = token["projected"]["sources"]
    check(mounts(tether)["tether-token"]["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
          and any("serviceAccountToken" in s for s in sources) and "tether-token" not in mounts(controller)
          and not any(m["mountPath"].startswith("/var/run/secrets") for m in controller.get("volumeMounts", [])),
          f"{label}: the service account token is mounted in tether's container alone")
    check(mounts(tether)["exchange"]["mountPath"] == "/run/tether" and mounts(controller)["exchange"] == {"name": "exchange", "mountPath": "/run/tether", "readOnly": True}
          and {"name": "TMPDIR", "value": "/run/tether"} in tether["env"]
          and all(v["emptyDir"].get("medium") == "Memory" for v in pod["volumes"] if v["name"] in ("exchange", "launcher")),
          f"{label}: the remotes file and kubeconfigs go in an in-memory volume the controller reads, read-only")
    check(controller["command"][1:4] == ["launcher", "--socket", socket] and spec.get("launcher") == {"socket": socket}
          and spec.get("command") == exec_values["command"] and controller["securityContext"]["readOnlyRootFilesystem"] is True
          and controller["securityContext"]["capabilities"]["drop"] == ["ALL"],
          f"{label}: the controller's container runs tether launcher, and tether's config names its socket and the command")
    account = config["manager"]["exec"]["serviceAccount"]["name"]
    docs = render(values)
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-controller-token"))
    accounts = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account]
    check(role["rules"] == [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [account], "verbs": ["create"]}]
          and len(accounts) == 1 and accounts[0]["automountServiceAccountToken"] is False,
          f"{label}: tether may request tokens for the controller's ServiceAccount {account}, and for no other")


def main():
    # The chart's copy of the rules is the source, byte for byte.
    copy = CHART / "files" / "tether.rules.yaml"
    check(copy.read_bytes() == RULES.read_bytes(), "helm/tether/files/tether.rules.yaml is identical to alerts/tether.rules.yaml")

    lint = helm.lint(str(CHART), strict=True, kube_version=KUBE_VERSION)
    check(not lint["errors"] and not lint["messages"], f"helm lint --strict is clean: {json.dumps(lint['messages'])}")

    remote = {"name": "cluster-a", "secretName": "tether-cluster-a"}
    everything = {
        "remotes": [remote, {"name": "cluster-b", "secretName": "tether-cluster-b", "key": "config", "context": "admin@b", "required": False}],
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "alerts": {"enabled": True, "labels": {"release": "prometheus"}},
        "dashboards": {"enabled": True},
        "homeCluster": {"watch": True},
    }
    # The controller docs/exec.md walks through (tests/peers/mirror-controller).
    MIRROR = ["/mirror-controller", "--remote=cluster-b", "--health-probe-bind-address=:8081"]
    cases = {
        "defaults": {},
        "one remote": {"remotes": [remote]},
        "every feature": everything,
        "two replicas": {**everything, "replicaCount": 2},
        "network policy": {**everything, "networkPolicy": {"enabled": True, "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}},
        "exec, tether in the controller's image": {"remotes": [remote], "image": {"repository": "registry.example.com/mirror-controller", "tag": "v0.1.0"},
                                                   "manager": {"exec": {"command": MIRROR, "readiness": {"httpGet": {"port": 8081, "path": "/readyz"}}}}},
        "exec with three replicas": {"remotes": [remote], "replicaCount": 3, "manager": {"exec": {"command": MIRROR}}},
        "three replicas sharing the remotes": {"remotes": [remote], "replicaCount": 3, "sharding": {"enabled": True}},
        "no Events": {"remotes": [remote], "events": {"enabled": False}},
        "remotes discovered from Secrets": {"discovery": [
            {"secrets": {"namespace": "argocd", "format": "argocd", "labelSelector": "env=prod"}},
            {"secrets": {"namespace": "argocd", "format": "kubeconfig"}},
            {"secrets": {"namespace": "capi", "format": "clusterapi", "required": False}},
        ]},
        "exec, tether added to an image": {"remotes": [remote], "manager": {"exec": {"command": MIRROR,
                                                                                      "image": {"repository": "registry.example.com/mirror-controller", "tag": "v0.1.0"}}}},
        "exec, the controller in a container of its own": {
            "discovery": [{"secrets": {"namespace": "argocd", "format": "argocd"}}],
            "manager": {"exec": {"command": MIRROR, "followsRemotesFile": True, "separate": {"enabled": True},
                                 "image": {"repository": "registry.example.com/mirror-controller", "tag": "v0.1.0"}}}},
    }
    # The README's quickstart values, as written there, are a case too.
    readme = (ROOT / "README.md").read_text()
    start = readme.index("cat > tether-values.yaml <<'EOF'\n") + len("cat > tether-values.yaml <<'EOF'\n")
    quickstart = yaml.safe_load(readme[start:readme.index("\nEOF\n", start)])
    cases["the README's quickstart"] = quickstart
    docs = render(quickstart)
    secrets = sorted(v["secret"]["secretName"] for v in only(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if "secret" in v)
    check(secrets == ["tether-cluster-a", "tether-cluster-b"]
          and any(d["kind"] == "ServiceMonitor" for d in docs) and any(d["kind"] == "PrometheusRule" for d in docs),
          f"the README's quickstart mounts both Secrets and makes the ServiceMonitor and the PrometheusRule: {secrets}")
    for label, values in cases.items():
        docs = render(values)
        kinds = sorted(d["kind"] for d in docs)
        print(f"      {label}: {', '.join(kinds)}")
        kubernetes_validate(docs, label)
        deploy = only(docs, "Deployment")
        pod = deploy["spec"]["template"]["spec"]
        container = pod["containers"][0]
        check(pod["securityContext"]["runAsNonRoot"] is True
              and container["securityContext"]["readOnlyRootFilesystem"] is True
              and container["securityContext"]["capabilities"]["drop"] == ["ALL"]
              and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault",
              f"{label}: non-root, read-only root, no capabilities, RuntimeDefault seccomp")
        mounts = [m for c in pod["containers"] + pod.get("initContainers", []) for m in c.get("volumeMounts", [])]
        check(not any("subPath" in m for m in mounts)
              and any(m["mountPath"] == "/etc/tether/config" for m in mounts),
              f"{label}: no subPath mounts, so a changed ConfigMap or Secret reaches the pod, and tether reloads it")
        check(container["livenessProbe"]["failureThreshold"] >= 3 and container["livenessProbe"]["httpGet"]["path"] == "/healthz"
              and container["readinessProbe"]["httpGet"]["path"] == "/readyz" and "startupProbe" in container,
              f"{label}: liveness on /healthz (tolerant), readiness on /readyz, a startup probe")
        replicas = values.get("replicaCount", 1)
        elected = replicas > 1
        events = values.get("events", {}).get("enabled", True)
        discovery = values.get("discovery", [])
        separate = bool(values.get("manager", {}).get("exec", {}).get("separate", {}).get("enabled"))
        check(pod["automountServiceAccountToken"] == ((bool(values.get("homeCluster", {}).get("watch")) or bool(discovery) or elected or events) and not separate),
              f"{label}: the service account token is mounted only when the home cluster is watched or its Secrets read, a Lease is elected on, or Events are recorded")
        namespaces = sorted({d["secrets"]["namespace"] for d in discovery})
        reads = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-discovery")]
        binds = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-discovery")]
        check(sorted(r["metadata"]["namespace"] for r in reads) == namespaces
              and sorted(b["metadata"]["namespace"] for b in binds) == namespaces
              and all(r["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}] for r in reads)
              and not any(d["kind"] == "ClusterRole" and any("secrets" in rule.get("resources", []) for rule in d["rules"]) for d in docs),
              f"{label}: get, list and watch on Secrets in exactly the discovery namespaces {namespaces} (a Role and RoleBinding each), nothing cluster-wide")
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container.get("env", [])}
        events_role = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-events")]
        pod_env = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid"}
        if events:
            events_ok = (pod_env.items() <= env.items() and len(events_role) == 1
                         and events_role[0]["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
                         and any(d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-events") for d in docs))
        else:
            events_ok = not events_role and "POD_NAMESPACE" not in env
        check(events_ok,
              f"{label}: Events on the Pod (POD_NAME, POD_NAMESPACE, POD_UID; create and patch on events.k8s.io Events in its namespace) exactly when events.enabled")
        pdb = only(docs, "PodDisruptionBudget")
        check((pdb is not None) == elected and (pdb is None or pdb["spec"] == {"maxUnavailable": 1, "selector": deploy["spec"]["selector"]}),
              f"{label}: a PodDisruptionBudget (maxUnavailable 1) exactly when replicas > 1")
        sharded = values.get("sharding", {}).get("enabled", False)
        verbs = ["get", "list", "create", "update", "delete"] if sharded else ["get", "create", "update"]
        roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election")]
        role = roles[0] if roles else None
        check((role is not None) == elected
              and (role is None or role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": verbs}])
              and any(d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-leader-election") for d in docs) == elected,
              f"{label}: a Role and RoleBinding on leases exactly when replicas > 1 (list and delete too when sharding)")

        policy = only(docs, "NetworkPolicy")
        wanted = values.get("networkPolicy", {}).get("enabled", False)
        check((policy is not None) == wanted, f"{label}: a NetworkPolicy exactly when enabled")
        if policy is not None:
            rule = policy["spec"]["ingress"][0]
            check(policy["spec"]["policyTypes"] == ["Ingress"]
                  and rule["ports"] == [{"port": "admin", "protocol": "TCP"}]
                  and rule["from"] == values["networkPolicy"]["from"]
                  and policy["spec"]["podSelector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"],
                  f"{label}: the NetworkPolicy admits only the admin port, from the peers given, to tether's pods")
        config_map = next((d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})), None)
        config = yaml.safe_load(config_map["data"]["config.yaml"]) if config_map else None
        check(config is not None and [r["name"] for r in config["remotes"]] == [r["name"] for r in values.get("remotes", [])],
              f"{label}: the config lists the remotes")

        check(config is not None and config.get("discovery", []) == discovery,
              f"{label}: the config has the discovery sources as given")
        check_manager(label, values, pod, config)
        election = config.get("leaderElection") if config else None
        pod_name = [e for e in container.get("env", []) if e["name"] == "POD_NAME"]
        check((election is not None) == elected
              and (not elected or (election["enabled"] is True and election["leaseName"] == deploy["metadata"]["name"]
                                   and pod_name == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
                                   and pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname")),
              f"{label}: leader election, POD_NAME and a spread across nodes exactly when replicas > 1")
        shards = config.get("sharding") if config else None
        check((shards is not None) == sharded
              and (not sharded or shards == {"enabled": True, "leasePrefix": deploy["metadata"]["name"] + "-shard"}),
              f"{label}: sharding in the config exactly when enabled, its Leases named after the release")

        rule = only(docs, "PrometheusRule")
        if rule is not None:
            source = yaml.safe_load(RULES.read_text())
            check(rule["spec"] == source, f"{label}: the PrometheusRule carries exactly the groups of alerts/tether.rules.yaml")
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
                yaml.safe_dump(rule["spec"], f)
                f.flush()
                result = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
                check(result.returncode == 0, f"{label}: the PrometheusRule's spec passes promtool check rules" + ("" if result.returncode == 0 else result.stdout + result.stderr))
        monitor = only(docs, "ServiceMonitor")
        if monitor is not None:
            service = only(docs, "Service")
            selector = monitor["spec"]["selector"]["matchLabels"]
            labels = service["metadata"]["labels"]
            ports = {p["name"] for p in service["spec"]["ports"]}
            check(all(labels.get(k) == v for k, v in selector.items()), f"{label}: the ServiceMonitor selects the Service's labels")
            check(all(e["port"] in ports for e in monitor["spec"]["endpoints"]), f"{label}: the ServiceMonitor's port is the Service's port name")
        dashboard = next((d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")), None)
        if dashboard is not None:
            board = json.loads(dashboard["data"]["tether.json"])
            check(dashboard["metadata"]["labels"].get("grafana_dashboard") == "1" and len(board["panels"]) >= 5,
                  f"{label}: the dashboard ConfigMap is labelled for the sidecar and has its panels")

    # values.schema.json rejects bad values, naming the key.
    chart = helm.Chart.load(str(CHART))
    bad = {
        "a negative interval": ({"config": {"probe": {"interval": "-1s"}}}, "interval"),
        "a bad port": ({"adminPort": 70000}, "adminPort"),
        "an unknown key": ({"config": {"probe": {"intervall": "10s"}}}, "intervall"),
        "a wrong type": ({"replicaCount": "two"}, "replicaCount"),
        "a bad enum": ({"logFormat": "xml"}, "logFormat"),
        "a bad pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        "a remote without a Secret": ({"remotes": [{"name": "a"}]}, "secretName"),
        "an unknown stop signal": ({"manager": {"exec": {"stopSignal": "SIGFOO"}}}, "stopSignal"),
        "a shell line for a command": ({"manager": {"exec": {"command": "/manager --x"}}}, "command"),
        "a discovery source without a namespace": ({"discovery": [{"secrets": {"format": "argocd"}}]}, "namespace"),
        "a discovery format tether does not read": ({"discovery": [{"secrets": {"namespace": "a", "format": "rancher"}}]}, "format"),
    }
    for label, (values, key) in bad.items():
        try:
            chart.validate_schema(values)
            check(False, f"the schema rejects {label}")
        except helm.HelmError as err:
            message = " ".join(str(err).split())
            check(key in message, f"the schema rejects {label}, naming {key}: {message[:200]}")
    try:
        chart.validate_schema({"remotes": [remote]})
        check(True, "the schema accepts good values")
    except helm.HelmError as err:
        check(False, f"the schema accepts good values: {err}")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
