"""The native backend: a LayerPlan carried out with the kernel's own controls.

backend.py         NativeBackend: one apply, stop or recover over the parts below
universe.py        the host threads it last saw, by (tid, start time), their ids indexed
membership.py      which layer each thread belongs to; which threads are kernel threads; a
                   process's threads as the backend reads them (scan_threads)
treatment.py       per-thread affinity, policy, nice and slice under the plan
inheritance.py     treatment a new thread or process inherited from its creator, and the way back
given_back.py      values it replaced or gave back, remembered for threads made before
restore_ledger.py  the ledger: every held setting, threads' and host's, and the way back
thread_settings.py a thread's held affinity, policy, nice and slice, keyed by (tid, start time)
state_file.py      the ledger on disk, a journal, for the next start
held.py            held settings, the one set of rules: original first, drift, restore, adopt
autogroup.py       the nice of whole sessions (autogroups)
idle_cgroup.py     yield threads of mixed sessions in an idle cpu cgroup (cgroup v1)
thread_cgroup.py   a thread's cgroup v1 cpu cgroup, as a held setting of the idle cgroup
cgroup_moves.py    a batch's moves into a v1 cgroup, made on a thread of their own
pmqos.py           the per-CPU idle-resume bound (PM QoS)
cgroup_weight.py   tier weights: cgroup v2 cpu.weight, through systemd or the cgroupfs
sched.py           the per-thread scheduler syscalls (affinity, policy, nice, slice), policy ids

What a call did (ApplyResult) is in temperd/backends/result.py.
"""
