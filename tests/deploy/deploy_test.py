#!/usr/bin/env python3
"""ctest deploy_manifests: checks deploy/kubernetes without a cluster.

    deploy_test.py TANDEMD SOURCE_DIR

1. Every manifest parses (yaml.safe_load_all) and every object has the
   apiVersion its kind is served at, a kind, metadata.name, and a namespace
   where the kind is namespaced (one the manifests create).
2. Pod templates: containers have names and images, volume mounts name
   declared volumes, container ports are unique in the pod.
3. The DaemonSet: privileged, hostPID, not hostNetwork; hostPath volumes of
   /sys/fs/cgroup (writable), /sys/kernel/btf (read-only) and the runtime dir
   of the ConfigMap's toml; the ConfigMap mounted at /etc/tandem/tandemd.toml
   and passed to --config; the start script the Dockerfile installs; probes on
   /metrics at the [metrics] listen port; no CPU or memory limit and a memory
   request at least [memory] tools_budget; a toleration of nvidia.com/gpu; its
   ServiceAccount.
4. The ConfigMap's tandemd.toml passes `tandemd --check-config`, and each
   listen address's port is a container port of tandemd; each engine's port
   is a port of the node-local Service tandemd-engines.
5. Each engine Deployment: its --name has an endpoint in [metrics.engines];
   its runtime dir is tandemd's and a hostPath; its uid holds the engine
   role; its metrics relay forwards a container port to that endpoint through
   tandemd-engines; it runs on tandemd's nodes, one per node.
6. The InferencePool selects the engine pods and targets their serving port;
   its EPP Service and Deployment exist; the EPP's --model-server-metrics-port
   is the relay's port (with one target port, as the EPP requires for it);
   none of the metric flags gateway-api-inference-extension v1.4+ refuses is
   given; the EPP config's plugin references resolve, and each metric name in
   the tandem engineConfig is one docs/cluster.md lists as served per engine,
   every one of which docs/metrics.md documents.
7. The NetworkPolicies select tandemd's and the engines' pods and open the
   ports above to the EPP, the engine pods and nothing wider.
Exit 1 listing every failure; 0 otherwise.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml

API = {
    "Namespace": ("v1", False),
    "ConfigMap": ("v1", True),
    "ServiceAccount": ("v1", True),
    "Service": ("v1", True),
    "DaemonSet": ("apps/v1", True),
    "Deployment": ("apps/v1", True),
    "Role": ("rbac.authorization.k8s.io/v1", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", True),
    "NetworkPolicy": ("networking.k8s.io/v1", True),
    "InferencePool": ("inference.networking.k8s.io/v1", True),
}
# gateway-api-inference-extension pkg/epp/server/options.go (v1.4.0, v1.5.0):
# "flag %q is deprecated and cannot be used".
REFUSED_EPP_FLAGS = ["--total-queued-requests-metric", "--total-running-requests-metric",
                     "--kv-cache-usage-percentage-metric", "--lora-info-metric", "--cache-info-metric"]
CONFIG_PATH = "/etc/tandem/tandemd.toml"

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return bool(cond)


def port_of(addr):
    m = re.fullmatch(r"(.*):(\d+)", addr)
    return int(m.group(2)) if m else None


def byte_size(text):
    m = re.fullmatch(r"(\d+)([KMGT]?)i?", str(text))
    if not m:
        return None
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_ports(pod):
    return {p["containerPort"]: p.get("name") for c in pod["containers"] for p in c.get("ports", [])}


def resolve(port, pod):
    """A Service or probe port (number or name) as a container port number."""
    if isinstance(port, int):
        return port
    for c in pod["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == port:
                return p["containerPort"]
    return None


def load(kdir):
    objs = []
    files = sorted(glob.glob(os.path.join(kdir, "*.yaml")))
    check(files, f"no manifests in {kdir}")
    for f in files:
        try:
            with open(f) as fh:
                docs = [d for d in yaml.safe_load_all(fh) if d is not None]
        except yaml.YAMLError as e:
            check(False, f"{f}: not YAML: {e}")
            continue
        for d in docs:
            where = f"{os.path.basename(f)}: {d.get('kind')} {d.get('metadata', {}).get('name')}"
            kind = d.get("kind")
            if not check(kind in API, f"{where}: kind {kind!r} is not one this test knows"):
                continue
            api, namespaced = API[kind]
            check(d.get("apiVersion") == api, f"{where}: apiVersion {d.get('apiVersion')!r}, expected {api}")
            check(d.get("metadata", {}).get("name"), f"{where}: no metadata.name")
            check(bool(d.get("metadata", {}).get("namespace")) == namespaced,
                  f"{where}: metadata.namespace {'missing' if namespaced else 'set on a cluster-wide kind'}")
            d["_where"] = where
            objs.append(d)
    return objs


def find(objs, kind, name=None, namespace=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name) and
            (namespace is None or o["metadata"].get("namespace") == namespace)]


def one(objs, kind, name=None, namespace=None):
    found = find(objs, kind, name, namespace)
    check(len(found) == 1, f"expected one {kind} {name or ''} in {namespace or 'the manifests'}, found {len(found)}")
    return found[0] if found else None


def check_pod(where, pod):
    vols = {v["name"] for v in pod.get("volumes", [])}
    seen = set()
    for c in pod["containers"]:
        check(c.get("name") and c.get("image"), f"{where}: a container without a name or image")
        for m in c.get("volumeMounts", []):
            check(m["name"] in vols, f"{where}: container {c['name']} mounts undeclared volume {m['name']}")
        for p in c.get("ports", []):
            check(p["containerPort"] not in seen, f"{where}: container port {p['containerPort']} twice")
            seen.add(p["containerPort"])


def arg_after(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def main():
    tandemd, source = sys.argv[1], sys.argv[2]
    kdir = os.path.join(source, "deploy", "kubernetes")
    objs = load(kdir)
    namespaces = {o["metadata"]["name"] for o in find(objs, "Namespace")}
    for o in objs:
        ns = o["metadata"].get("namespace")
        check(ns is None or ns in namespaces, f"{o['_where']}: namespace {ns} is not created by the manifests")
        if o["kind"] in ("DaemonSet", "Deployment"):
            check_pod(o["_where"], o["spec"]["template"]["spec"])
            check(matches(o["spec"]["selector"]["matchLabels"], o["spec"]["template"]["metadata"]["labels"]),
                  f"{o['_where']}: its selector does not match its pod template")

    # ---- the ConfigMap and tandemd's own check --------------------------------------
    cm = one(objs, "ConfigMap", "tandemd-config")
    text = cm["data"]["tandemd.toml"] if cm else ""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write(text)
        path = fh.name
    try:
        r = subprocess.run([tandemd, "--check-config", "--config", path], capture_output=True, text=True, timeout=30)
    finally:
        os.unlink(path)
    print(f"$ tandemd --check-config (configmap.yaml's tandemd.toml): exit {r.returncode}")
    sys.stdout.write(r.stdout + r.stderr)
    check(r.returncode == 0, "tandemd --check-config refused configmap.yaml's tandemd.toml (output above)")
    toml = tomllib.loads(text)
    runtime_dir = toml.get("runtime_dir", "/run/tandem")
    metrics = toml.get("metrics", {})
    node_port = port_of(metrics.get("listen", "127.0.0.1:9464"))
    engines = {name: port_of(addr) for name, addr in metrics.get("engines", {}).items()}
    check(engines, "configmap.yaml: [metrics.engines] names no engine")
    budget = byte_size(toml.get("memory", {}).get("tools_budget", 0))

    # ---- the DaemonSet -----------------------------------------------------------------
    ds = one(objs, "DaemonSet", "tandemd")
    if ds:
        w = ds["_where"]
        pod = ds["spec"]["template"]["spec"]
        labels = ds["spec"]["template"]["metadata"]["labels"]
        c = pod["containers"][0]
        check(c.get("securityContext", {}).get("privileged") is True, f"{w}: not privileged")
        check(pod.get("hostPID") is True, f"{w}: no hostPID")
        check(not pod.get("hostNetwork"), f"{w}: hostNetwork (docs/cluster.md: tandemd runs in the pod network)")
        hostpaths = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        for hp, ro in (("/sys/fs/cgroup", False), ("/sys/kernel/btf", True), (runtime_dir, False)):
            names = [n for n, p in hostpaths.items() if p == hp]
            if check(names, f"{w}: no hostPath volume of {hp}"):
                m = mounts.get(hp)
                if check(m and m["name"] in names, f"{w}: hostPath {hp} not mounted at {hp}"):
                    check(bool(m.get("readOnly")) == ro, f"{w}: {hp} should be mounted {'read-only' if ro else 'writable'}")
        m = mounts.get(CONFIG_PATH)
        cfgvols = {v["name"]: v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
        check(m and cfgvols.get(m["name"]) == "tandemd-config" and m.get("subPath") == "tandemd.toml",
              f"{w}: ConfigMap tandemd-config's tandemd.toml is not mounted at {CONFIG_PATH}")
        check(arg_after(c.get("args", []), "--config") == CONFIG_PATH, f"{w}: tandemd is not given --config {CONFIG_PATH}")
        with open(os.path.join(kdir, "Dockerfile")) as fh:
            dockerfile = fh.read()
        script = c.get("command", [""])[0]
        check(script and re.search(r"COPY deploy/kubernetes/(\S+) " + re.escape(script) + r"\n", dockerfile),
              f"{w}: its command {script!r} is not a file the Dockerfile installs")
        ports = container_ports(pod)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = c.get(probe, {}).get("httpGet")
            if check(get, f"{w}: no httpGet {probe}"):
                check(get.get("path") == "/metrics" and resolve(get.get("port"), pod) == node_port,
                      f"{w}: {probe} is not GET /metrics on port {node_port} ([metrics] listen)")
        check(node_port in ports, f"{w}: [metrics] listen port {node_port} is not a container port")
        res = c.get("resources", {})
        check(not {"cpu", "memory"} & set(res.get("limits", {})),
              f"{w}: a CPU or memory limit would cap tandemd and every tool together")
        req = byte_size(res.get("requests", {}).get("memory", "0"))
        check(req is not None and req >= (budget or 0), f"{w}: memory request below [memory] tools_budget")
        check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
              f"{w}: no toleration of nvidia.com/gpu")
        check(find(objs, "ServiceAccount", pod.get("serviceAccountName"), "tandem-system"),
              f"{w}: ServiceAccount {pod.get('serviceAccountName')} is not in the manifests")
        svc = one(objs, "Service", "tandemd-engines", ds["metadata"]["namespace"])
        if svc:
            check(svc["spec"].get("internalTrafficPolicy") == "Local", f"{svc['_where']}: not internalTrafficPolicy Local")
            check(matches(svc["spec"]["selector"], labels), f"{svc['_where']}: does not select tandemd's pods")
            svc_ports = {p["port"]: resolve(p.get("targetPort", p["port"]), pod) for p in svc["spec"]["ports"]}
            for name, port in engines.items():
                check(port in ports, f"{w}: engine {name}'s port {port} is not a container port")
                check(svc_ports.get(port) == port, f"{svc['_where']}: no port {port} to tandemd's {port} (engine {name})")

    # ---- the engines ---------------------------------------------------------------------
    engine_pods = []
    uids = [int(u) for u in toml.get("roles", {}).get("engine", {}).get("uids", [])]
    for dep in find(objs, "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        eng = [c for c in pod["containers"] if "--runtime-dir" in c.get("args", [])]
        if not eng:
            continue
        w = dep["_where"]
        args = eng[0]["args"]
        name = arg_after(args, "--name")
        engine_pods.append((dep, name))
        if not check(name in engines, f"{w}: engine {name} has no endpoint in [metrics.engines]"):
            continue
        check(arg_after(args, "--runtime-dir") == runtime_dir, f"{w}: --runtime-dir is not {runtime_dir}")
        hostpaths = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
        check(any(m["mountPath"] == runtime_dir and hostpaths.get(m["name"]) == runtime_dir
                  for m in eng[0].get("volumeMounts", [])), f"{w}: the hostPath {runtime_dir} is not mounted there")
        uid = pod.get("securityContext", {}).get("runAsUser", 0)
        check(uid == 0 or uid in uids, f"{w}: uid {uid} is not granted [roles.engine]")
        ports = container_ports(pod)
        relays = []
        for c in pod["containers"]:
            cmd = " ".join(c.get("command", []) + c.get("args", []))
            m = re.search(r"TCP-LISTEN:(\d+)\S*\s+TCP:([^:\s]+):(\d+)", cmd)
            if m and m.group(2).startswith("tandemd-engines.tandem-system.svc"):
                relays.append((int(m.group(1)), int(m.group(3))))
        if check(len(relays) == 1, f"{w}: expected one metrics relay to tandemd-engines, found {len(relays)}"):
            listen, target = relays[0]
            check(listen in ports, f"{w}: the relay's port {listen} is not a container port")
            check(target == engines[name], f"{w}: the relay forwards to {target}, engine {name}'s endpoint is {engines[name]}")
            dep["_metrics_port"] = listen
        if ds:
            check(pod.get("nodeSelector") == ds["spec"]["template"]["spec"].get("nodeSelector"),
                  f"{w}: its nodeSelector differs from tandemd's")
        anti = pod.get("affinity", {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])
        check(any(a.get("topologyKey") == "kubernetes.io/hostname" and
                  matches(a["labelSelector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"])
                  for a in anti), f"{w}: may put two {name} engines on one node")
    check(engine_pods, "no engine Deployment (a container with --runtime-dir) in the manifests")

    # ---- the InferencePool and its EPP ---------------------------------------------------
    pool = one(objs, "InferencePool")
    docs = os.path.join(source, "docs")
    with open(os.path.join(docs, "cluster.md")) as fh:
        cluster = fh.read()
    block = re.search(r"<!-- per-engine-metrics -->(.*?)<!-- /per-engine-metrics -->", cluster, re.S)
    listed = set(re.findall(r"`(vllm:[a-z_]+)`", block.group(1))) if block else set()
    check(listed, "docs/cluster.md: no list of per-engine vLLM metrics between the per-engine-metrics markers")
    with open(os.path.join(docs, "metrics.md")) as fh:
        metrics_md = fh.read()
    for n in sorted(listed):
        check(f"`{n}`" in metrics_md, f"docs/metrics.md does not document {n}, which docs/cluster.md says tandemd serves")
    if pool:
        w = pool["_where"]
        ns = pool["metadata"]["namespace"]
        members = [(d, n) for d, n in engine_pods
                   if d["metadata"]["namespace"] == ns and matches(pool["spec"]["selector"]["matchLabels"],
                                                                    d["spec"]["template"]["metadata"]["labels"])]
        check(members, f"{w}: selects no engine pod of its namespace")
        targets = [p["number"] for p in pool["spec"]["targetPorts"]]
        for d, _ in members:
            check(set(targets) <= set(container_ports(d["spec"]["template"]["spec"])),
                  f"{w}: target ports {targets} are not all container ports of {d['_where']}")
        ref = pool["spec"]["endpointPickerRef"]
        svc = one(objs, "Service", ref["name"], ns)
        epp = [d for d in find(objs, "Deployment", namespace=ns)
               if svc and matches(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        if check(svc and len(epp) == 1, f"{w}: endpointPickerRef {ref['name']} is not a Service of one Deployment"):
            epod = epp[0]["spec"]["template"]["spec"]
            sp = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]]
            check(sp and resolve(sp[0].get("targetPort", sp[0]["port"]), epod) in container_ports(epod),
                  f"{svc['_where']}: port {ref['port']['number']} does not reach an EPP container port")
            args = epod["containers"][0].get("args", [])
            check(arg_after(args, "--pool-name") == pool["metadata"]["name"], f"{epp[0]['_where']}: --pool-name is not {pool['metadata']['name']}")
            check(arg_after(args, "--pool-namespace") == ns, f"{epp[0]['_where']}: --pool-namespace is not {ns}")
            for f in REFUSED_EPP_FLAGS:
                check(not any(a == f or a.startswith(f + "=") for a in args),
                      f"{epp[0]['_where']}: {f} makes gateway-api-inference-extension v1.4+ refuse to start")
            mport = arg_after(args, "--model-server-metrics-port")
            check(mport is not None and len(targets) == 1,
                  f"{epp[0]['_where']}: --model-server-metrics-port is honoured only with one target port")
            for d, n in members:
                check(mport is not None and int(mport) == d.get("_metrics_port"),
                      f"{epp[0]['_where']}: --model-server-metrics-port {mport} is not {d['_where']}'s metrics relay")
            cfgfile = arg_after(args, "--config-file") or ""
            mounts = {m["mountPath"]: m["name"] for m in epod["containers"][0].get("volumeMounts", [])}
            vols = {v["name"]: v["configMap"]["name"] for v in epod.get("volumes", []) if "configMap" in v}
            cmname = vols.get(mounts.get(os.path.dirname(cfgfile)))
            ecm = one(objs, "ConfigMap", cmname, ns) if cmname else None
            if check(ecm and os.path.basename(cfgfile) in ecm["data"], f"{epp[0]['_where']}: --config-file {cfgfile} is not a mounted ConfigMap key"):
                cfg = yaml.safe_load(ecm["data"][os.path.basename(cfgfile)])
                plugins = {p.get("name", p["type"]): p for p in cfg["plugins"]}
                refs = [r["pluginRef"] for prof in cfg["schedulingProfiles"] for r in prof["plugins"]]
                for s in cfg.get("dataLayer", {}).get("sources", []):
                    refs += [s["pluginRef"]] + [e["pluginRef"] for e in s.get("extractors", [])]
                for r in refs:
                    check(r in plugins, f"{ecm['_where']}: pluginRef {r} names no plugin")
                ext = [p for p in cfg["plugins"] if p["type"] == "core-metrics-extractor"]
                src = [p for p in cfg["plugins"] if p["type"] == "metrics-data-source"]
                check(src and src[0].get("parameters", {}).get("path", "/metrics") == "/metrics",
                      f"{ecm['_where']}: the metrics-data-source does not scrape /metrics")
                if check(ext, f"{ecm['_where']}: no core-metrics-extractor"):
                    params = ext[0].get("parameters", {})
                    key = params.get("engineLabelKey", "inference.networking.k8s.io/engine-type")
                    configs = {e["name"]: e for e in params.get("engineConfigs", [])}
                    for d, n in members:
                        kind = d["spec"]["template"]["metadata"]["labels"].get(key, params.get("defaultEngine", "vllm"))
                        if check(kind in configs, f"{d['_where']}: engine type {kind} has no engineConfig in {ecm['_where']}"):
                            for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec"):
                                spec = configs[kind].get(field, "")
                                family = spec.split("{")[0]
                                check(spec == "" or family in listed,
                                      f"{ecm['_where']}: {field} {spec!r} is not a metric tandemd serves per engine (docs/cluster.md)")
                            check(all(configs[kind].get(f) for f in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")),
                                  f"{ecm['_where']}: engine {kind} leaves the queue, running or KV metric unset")

    # ---- NetworkPolicies -------------------------------------------------------------------
    def policy_for(labels, ns):
        return [p for p in find(objs, "NetworkPolicy", namespace=ns) if matches(p["spec"]["podSelector"]["matchLabels"], labels)]

    def allowed_from(pol, port):
        return [f for rule in pol["spec"].get("ingress", []) if any(p.get("port") == port for p in rule.get("ports", []))
                for f in rule.get("from", [])]

    if ds:
        pols = policy_for(ds["spec"]["template"]["metadata"]["labels"], ds["metadata"]["namespace"])
        if check(pols, "no NetworkPolicy selects tandemd's pods"):
            for name, port in engines.items():
                froms = [f for p in pols for f in allowed_from(p, port)]
                check(froms and all(any(matches(f.get("podSelector", {}).get("matchLabels"), d["spec"]["template"]["metadata"]["labels"]) and
                                        f.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name",
                                                                                              ds["metadata"]["namespace"]) ==
                                        d["metadata"]["namespace"] for d, _ in engine_pods) for f in froms),
                      f"{pols[0]['_where']}: port {port} ({name}) is not open to the engine pods alone")
            check(any(allowed_from(p, node_port) for p in pols), f"{pols[0]['_where']}: port {node_port} is open to no one")
    for d, n in engine_pods:
        pols = policy_for(d["spec"]["template"]["metadata"]["labels"], d["metadata"]["namespace"])
        if check(pols, f"no NetworkPolicy selects {d['_where']}'s pods") and pool and d.get("_metrics_port"):
            froms = [f for p in pols for f in allowed_from(p, d["_metrics_port"])]
            epp_labels = [e["spec"]["template"]["metadata"]["labels"] for e in find(objs, "Deployment", namespace=d["metadata"]["namespace"])
                          if "--pool-name" in e["spec"]["template"]["spec"]["containers"][0].get("args", [])]
            check(froms and all("namespaceSelector" not in f and any(matches(f.get("podSelector", {}).get("matchLabels"), l) for l in epp_labels)
                                for f in froms),
                  f"{pols[0]['_where']}: the metrics port {d['_metrics_port']} is not open to the EPP alone")

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print(f"OK: {len(objs)} objects in deploy/kubernetes checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
