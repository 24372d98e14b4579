"""Two redis-server instances started by hand (no units) on two ports, one under load and one
idle: two workloads in classify and rightsize, each under a label that names the instance
(its own cgroup where each has one; the profile and its command line where they share one), the
loaded one needing more CPUs — and after both restart in the other order, the same labels with
their histories. `rightsize --pid P` answers with P's own workload."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

import cgroup_fixtures as F
import servers as S
from test_daemon_e2e import wait_for
from test_rightsize_fixtures import WatchTemperd

pytestmark = [pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
PHASE_S = 8.0


def start_redis(cgroup, binary, port, workdir):
    proc = cgroup.spawn([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", workdir,
                         "--appendonly", "no", "--daemonize", "no"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    S.wait_for_port(port, proc, "redis-server")
    return proc


def load(port, seconds, workdir):
    bench = S.require("redis-benchmark", "redis-tools")
    return S.Load("redis-benchmark", [[bench, "-h", "127.0.0.1", "-p", str(port), "-t", "set,get", "-r", "10000",
                                       "-c", "20", "-n", "100000000", "-q"]], seconds, workdir, self_limited=False)


@pytest.mark.parametrize("layout", ["two-cgroups", "one-cgroup"])
def test_two_hand_started_redis_keep_their_labels_and_histories_across_a_restart_in_the_other_order(tmp_path, layout):
    try:
        binary = S.require("redis-server", "redis-server")
        S.require("redis-benchmark", "redis-tools")
    except S.ServerUnavailable as exc:
        pytest.skip(str(exc))
    busy_port, idle_port = S.free_port(), S.free_port()
    workdir = str(tmp_path / "redis")
    os.makedirs(workdir)
    with F.cgroup_parent("temperd-instances") as make:
        if layout == "two-cgroups":
            cgroups = {busy_port: make(f"redis-{busy_port}"), idle_port: make(f"redis-{idle_port}")}
        else:
            shared = make("both")
            cgroups = {busy_port: shared, idle_port: shared}
        daemon = WatchTemperd(tmp_path, f'[rightsizing]\nhistory_file = "{tmp_path}/history.json"\n')
        shutil.copy(os.path.join(HERE, "..", "profiles", "redis.toml"), daemon.profiles)
        daemon.start()
        rounds = []
        try:
            for order in ((busy_port, idle_port), (idle_port, busy_port)):
                procs = {port: start_redis(cgroups[port], binary, port, workdir) for port in order}
                wait_for(lambda: len(daemon.ask("rightsize")) >= 2, 20, "two redis workloads")
                load(busy_port, PHASE_S, workdir).wait()
                got = daemon.ask("rightsize")
                mine = daemon.ask("rightsize", "--pid", str(procs[idle_port].pid))
                rounds.append((got, mine))
                print(daemon.temperctl("rightsize").stdout)
                for proc in procs.values():
                    proc.terminate()
                    proc.wait(timeout=20)
        finally:
            daemon.stop()
    labels = []
    for got, mine in rounds:
        assert len(got) == 2, sorted(got)
        (idle_label,) = list(mine)  # --pid: that process's own workload
        busy_label = next(label for label in got if label != idle_label)
        busy, idle = got[busy_label], got[idle_label]
        assert idle["workload"] == idle_label and busy["workload"] == busy_label
        assert busy["needed_cpus"] > idle["needed_cpus"], (busy["reason"], idle["reason"])
        assert busy["profile"] == idle["profile"] == "redis"
        if layout == "two-cgroups":  # each in a cgroup of its own: named by it
            assert busy_label.endswith(f"/redis-{busy_port}") and idle_label.endswith(f"/redis-{idle_port}")
        labels.append((busy_label, idle_label))
        assert not any(re.search(r"pid\d", label) for label in labels[-1])
    assert labels[0] == labels[1], labels  # stable across the restart in the other order
    if layout == "one-cgroup":  # profile, program and a digest: never an argument (the port)
        assert all(label.startswith("redis: ") and str(port) not in label
                   for label in labels[0] for port in (busy_port, idle_port)), labels
    # the history continued under each label: the second round's history is longer than the first's
    first, second = rounds[0][0], rounds[1][0]
    for label in labels[0]:
        assert "history" in second[label]["reason"]
        assert int(second[label]["reason"].split("history ")[1].split(" s")[0]) > \
            int(first[label]["reason"].split("history ")[1].split(" s")[0])
