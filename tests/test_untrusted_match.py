"""An untrusted match is lowered only where its profile lowers anyone: a memcached run by nobody
outside a system unit keeps its workers and its main thread as they were (in no layer, now or as
threads that appear later), and only its maintenance threads, the catch-all yield group, yield."""

from facts_builder import FactsHost
from fixture_shapes import load_fixture_shape

from temperd.backends.native.membership import Membership, ThreadRef
from temperd.backends.scx.render import render_plan
from temperd.config.daemon_config import DaemonConfig
from temperd.config.profileset import load_builtin_profiles
from temperd.decide.matcher import Matcher
from temperd.decide.planner import plan
from temperd.decide.trust import TrustPolicy
from temperd.plan import YIELD

NOBODY = 65534
TRUST = TrustPolicy(uid_min=1000, nobody_uids=frozenset((NOBODY,)))
SHAPE = load_fixture_shape("gcp-c2-standard-8")
PROFILES = {p.id: p for p in load_builtin_profiles() if p.id == "memcached"}
MAINTENANCE = ("mc-lrumaint", "mc-slabmaint", "mc-assocmaint", "mc-itemcrawler", "mc-log")


def _memcached(uid):
    host = FactsHost()
    proc = host.process("memcached", exe="/usr/bin/memcached", uid=uid, cgroup="/user.slice/session-3.scope",
                        threads=["memcached", *(["mc-worker"] * 4), *MAINTENANCE])
    return host, proc


def _planned(uid):
    host, proc = _memcached(uid)
    matched = Matcher(DaemonConfig(), PROFILES, trust=TRUST).match(host.processes)
    return proc, matched.workload_of(proc.pid), plan(SHAPE, matched.workloads, PROFILES)


def _layers_by_comm(membership, proc, extra=()):
    threads = [ThreadRef(t.tid, proc.pid, 1, t.comm, False) for t in proc.threads.values()]
    threads += [ThreadRef(9_000_000 + i, proc.pid, 1, comm, False) for i, comm in enumerate(extra)]
    out = {}
    for t in threads:
        layer = membership.layer_for(t)
        out.setdefault(t.comm, set()).add(layer.name if layer else None)
    return out


def test_an_untrusted_memcached_lowers_only_its_maintenance_threads():
    proc, workload, layer_plan = _planned(NOBODY)
    assert workload is not None and workload.profile_id == "memcached"
    by_comm = {}
    for t in workload.threads:
        by_comm.setdefault(t.comm, set()).add(t.group)
    assert by_comm["mc-worker"] == {None} and by_comm["memcached"] == {None}
    assert all(by_comm[name] == {"maintenance"} for name in MAINTENANCE)
    (layer,) = [l for l in layer_plan.layers if l.workload == workload.key]
    assert layer.group == "maintenance" and layer.treatment == YIELD
    assert sorted(layer.selector.tids) == sorted(t.tid for t in proc.threads.values() if t.comm in MAINTENANCE)
    # What the native backend applies: the plan's members, then its rules for threads it meets
    # later (a worker thread started after the plan, a maintenance thread, a name no group has).
    placed = _layers_by_comm(Membership(layer_plan), proc, extra=("mc-worker", "memcached", "mc-lrumaint"))
    assert placed["mc-worker"] == {None} and placed["memcached"] == {None}
    assert all(placed[name] == {layer.name} for name in MAINTENANCE)
    # scx_layered's rules: the catch-all cannot say "but not these", so it names its members.
    rendered = render_plan(layer_plan, 8).config
    (matches,) = [entry["matches"] for entry in rendered if entry["name"] == layer.name]
    assert sorted(m[0]["PIDEquals"] for m in matches) == sorted(layer.selector.tids)


def test_a_trusted_memcached_keeps_every_group():
    proc, workload, layer_plan = _planned(0)
    groups = {layer.group for layer in layer_plan.layers if layer.workload == workload.key}
    assert groups == {"workers", "dispatch", "maintenance"}
    placed = _layers_by_comm(Membership(layer_plan), proc, extra=("mc-worker", "mc-newmaint"))
    names = {layer.group: layer.name for layer in layer_plan.layers}
    assert placed["mc-worker"] == {names["workers"]} and placed["mc-newmaint"] == {names["maintenance"]}

