"""Workload labels (observe/workload_labels.py): unit, binding, own cgroup, else profile and the
instance (program and a digest of its command line: tests/test_label_secrets.py); stable whatever
order workloads appear in, bounded, never a pid."""

from __future__ import annotations

import re

from temperd.decide.matcher import Workload
from temperd.observe.workload_labels import MAX_INSTANCE_CHARS, workload_labels


def workload(key, pids, *, unit=None, cgroup="/", source="fingerprint", profile="redis", instance=""):
    return Workload(key=key, profile_id=profile, tier="standard", budget=None, budget_reason="", source=source,
                    reason="test", unit=unit, cgroup=cgroup, pids=tuple(pids), threads=(), instance=instance)


def shared(w):
    return False


def test_unit_then_binding_then_own_cgroup_then_profile_and_instance():
    ws = [workload("redis.service", [10], unit="redis.service", cgroup="/system.slice/redis.service"),
          workload("tier:pid20", [20], source="binding", cgroup="/batch/job"),
          workload("redis:pid30", [30], cgroup="/containers/c1"),
          workload("redis:pid40", [40], instance="redis-server 5f0c2a91")]
    labels = workload_labels(ws, lambda w: w.cgroup == "/containers/c1")
    assert labels == {"redis.service": "redis.service", "tier:pid20": "/batch/job", "redis:pid30": "/containers/c1",
                      "redis:pid40": "redis: redis-server 5f0c2a91"}


def test_two_hand_started_instances_keep_their_labels_when_restarted_in_the_other_order():
    first = [workload("redis:pid100", [100], instance="redis-server 5f0c2a91"),
             workload("redis:pid200", [200], instance="redis-server 0b7d13e4")]
    again = [workload("redis:pid300", [300], instance="redis-server 0b7d13e4"),
             workload("redis:pid400", [400], instance="redis-server 5f0c2a91")]
    before, after = workload_labels(first, shared), workload_labels(list(reversed(again)), shared)
    assert before["redis:pid100"] == after["redis:pid400"] == "redis: redis-server 5f0c2a91"
    assert before["redis:pid200"] == after["redis:pid300"] == "redis: redis-server 0b7d13e4"
    # a cgroup with another process in it (the root, a login session's) names no workload
    assert workload_labels([workload("redis:pid5", [5], cgroup="/user.slice/session-2.scope",
                                     instance="redis-server 5f0c2a91")], shared)["redis:pid5"].startswith("redis: ")


def test_labels_are_bounded_and_carry_no_pid():
    long = "python3 /srv/app.py " + "--flag=value " * 40
    labels = workload_labels([workload("app:pid4242", [4242], profile="app", instance=long)], shared)
    label = labels["app:pid4242"]
    assert len(label) <= len("app: ") + MAX_INSTANCE_CHARS and "4242" not in label
    assert label != workload_labels([workload("app:pid1", [1], profile="app", instance=long + "x")], shared)["app:pid1"]
    same = workload_labels([workload("app:pid9", [9], profile="app", instance="worker"),
                            workload("app:pid7", [7], profile="app", instance="worker")], shared)
    assert sorted(same.values()) == ["app: worker", "app: worker#2"]
    assert not any(re.search(r"pid\d", v) for v in same.values())
