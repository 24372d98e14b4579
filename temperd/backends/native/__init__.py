"""The native backend: a LayerPlan carried out with the kernel's own controls.

backend.py         NativeBackend: one apply, stop or recover over the parts below
membership.py      which layer each thread belongs to; which threads are kernel threads
treatment.py       per-thread affinity, policy, nice and slice under the plan
inheritance.py     treatment a new thread or process inherited from its creator, and the way back
restore_ledger.py  each thread's originals and temperd's changes; the state file
held.py            held host settings: original first, drift, restore, adopt
autogroup.py       the nice of whole sessions (autogroups)
idle_cgroup.py     yield threads of mixed sessions in an idle cpu cgroup (cgroup v1)
pmqos.py           the per-CPU idle-resume bound (PM QoS)
cgroup_weight.py   tier weights: cgroup v2 cpu.weight, through systemd or the cgroupfs
result.py          what a call did (ApplyResult) and the drift found (DriftRecord)
sched.py           the scheduler syscalls and policy ids
"""
