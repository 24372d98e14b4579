"""How the VM test reads its guest's console (tests/e2e/run-vm-test.sh --check-console): a kernel
panic or oops is found and named on one line, which decides a retry of the boot; an ordinary boot,
a WARNING or a sched_ext scheduler coming and going is not taken for one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "run-vm-test.sh"

BOOT = """\
[    0.000000] Linux version 7.3.4+deb13-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 7.3.4-1~bpo13+1
[    0.000000] Command line: root=/dev/vda rw console=ttyS0 panic=-1 oops=panic loglevel=4 systemd.show_status=0
\x1b[0;1;31mWARNING: unsupported ACPI table\x1b[0m
[    9.412003] sched_ext: BPF scheduler "e2e_minimal" enabled
[   12.100431] sched_ext: BPF scheduler "e2e_minimal" disabled (unregistered from user space)
"""

# A WARNING prints a RIP line too: the oops's own RIP line is the one that says where it hit.
WARNING = """\
[   10.500000] ------------[ cut here ]------------
[   10.500100] WARNING: CPU: 1 PID: 812 at kernel/sched/ext.c:1234 scx_ops_enable+0x2a/0x40
[   10.500200] RIP: 0010:scx_ops_enable+0x2a/0x40
[   10.500300] ---[ end trace 0000000000000000 ]---
"""

# The shape of the panic seen under multi-threaded TCG as the test's sched_ext scheduler was registered.
INT3_PANIC = """\
[  412.803322] sched_ext: BPF scheduler "e2e_minimal" enabled
[  412.811045] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[  412.811502] CPU: 2 UID: 0 PID: 0 Comm: swapper/2 Not tainted 7.3.4+deb13-amd64 #1 PREEMPT(lazy)
[  412.812040] Hardware name: QEMU Standard PC (i440FX + PIIX, 1996), BIOS 1.16.3-debian-1.16.3-2 04/01/2014
[  412.812470] RIP: 0010:put_prev_task_idle+0x1/0x20
[  412.813900] Call Trace:
[  412.814010]  <IRQ>
[  412.815100] Kernel panic - not syncing: Fatal exception in interrupt
[  412.816300] ---[ end Kernel panic - not syncing: Fatal exception in interrupt ]---
"""

# E2E_INJECT_PANIC's crash (sysrq c), its first line after the getty's prompt.
SYSRQ_PANIC = """\
temperd-e2e login: [   93.794432] sysrq: Trigger a crash
[   93.796290] Kernel panic - not syncing: sysrq triggered crash
[   93.799312] CPU: 1 UID: 0 PID: 368 Comm: bash Not tainted 7.3.4+deb13-amd64 #1 PREEMPT(lazy)  Debian 7.3.4-1~bpo13+1
[   93.800019] Call Trace:
[   93.807840] Kernel Offset: 0x38000000 from 0xffffffff81000000 (relocation range: 0xffffffff80000000-0xffffffffbfffffff)
"""


def check_console(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    log = tmp_path / "console.log"
    log.write_bytes(text.replace("\n", "\r\n").encode())  # a serial console's line ends
    return subprocess.run(["bash", str(SCRIPT), "--check-console", str(log)],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("text", [BOOT, BOOT + WARNING, ""], ids=["boot", "warning", "empty"])
def test_no_panic(tmp_path, text):
    done = check_console(tmp_path, text)
    assert done.returncode == 1, done
    assert done.stdout == ""


def test_int3_oops_and_panic_on_one_line(tmp_path):
    done = check_console(tmp_path, BOOT + WARNING + INT3_PANIC)
    assert done.returncode == 0, done
    assert done.stdout == ("Oops: int3: 0000 [#1] PREEMPT SMP NOPTI in put_prev_task_idle+0x1/0x20; "
                           "Kernel panic - not syncing: Fatal exception in interrupt\n")


def test_panic_without_oops(tmp_path):
    done = check_console(tmp_path, BOOT + SYSRQ_PANIC)
    assert done.returncode == 0, done
    assert done.stdout == "Kernel panic - not syncing: sysrq triggered crash\n"


def test_oops_of_an_older_kernel(tmp_path):
    # Before Linux 6.9 the oops header has no "Oops: " prefix.
    done = check_console(tmp_path, BOOT + "[  3.1] int3: 0000 [#1] SMP NOPTI\n[  3.2] RIP: 0010:put_prev_task_idle+0x1/0x20\n")
    assert done.returncode == 0, done
    assert done.stdout == "int3: 0000 [#1] SMP NOPTI in put_prev_task_idle+0x1/0x20\n"
