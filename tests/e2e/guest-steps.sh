#!/bin/bash
# The VM test's steps, run as root inside the guest (Debian trixie, systemd as PID 1, a
# sched_ext kernel) from the 9p share at /mnt/host. Each step prints what it did and checked and
# ends with one result line in results.tsv (STATUS, seconds, step, summary); a failed step does
# not stop the run, and steps that need a failed one are skipped.
#   PASS: every check held   FAIL: a check failed or the step timed out
#   WARN: works, but misses a goal (the exposure score)   SKIP: nothing to do, or a prerequisite failed
set -u
export LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export H=/mnt/host W=/root/e2e
export HELPER="python3 $H/guest_helper.py"
mkdir -p "$W"

# ---- helpers (exported for the steps, which run in their own bash under timeout) -------------------

# wait_for SECONDS WHAT COMMAND...: poll every half second until COMMAND succeeds.
wait_for() {
  local limit=$1 what=$2 start=$SECONDS out
  shift 2
  while true; do
    if out="$("$@" 2>&1)"; then
      echo "ok after $((SECONDS - start)) s: $what"
      return 0
    fi
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      echo "NOT within $limit s: $what; last check said:"
      echo "$out" | tail -n 15 | sed 's/^/    /'
      return 1
    fi
    sleep 0.5
  done
}
status_json() { temperctl status --json; }
# status_is EXPR: the daemon's status JSON satisfies the Python expression EXPR (on d).
status_is() { status_json >"$W/status.now.json" 2>&1 && $HELPER json "$1" <"$W/status.now.json"; }
generation() { status_json | $HELPER json 'd["generation"]'; }
memcached_pid() { systemctl show -p MainPID --value memcached.service; }
temperd_pid() { systemctl show -p MainPID --value temperd.service; }
check() {  # check WHAT COMMAND...: run COMMAND, print ok/FAILED with WHAT, return its status
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; return 1; fi
}
has_words() {  # has_words TEXT WORD...: every WORD is a whole word of TEXT
  local text=" $1 " word
  shift
  for word in "$@"; do [[ "$text" == *" $word "* ]] || return 1; done
}
export -f wait_for status_json status_is generation memcached_pid temperd_pid check has_words

# ---- steps ------------------------------------------------------------------------------------------

step_boot() {
  local state
  state="$(cat "$H/boot-state")"
  echo "systemctl is-system-running: $state"
  systemd-analyze time || true
  systemctl --failed --no-legend --no-pager
  [ "$state" = running ] || [ "$state" = degraded ]
}

step_kernel() {
  local kernel
  kernel="$(uname -r)"
  echo "kernel $kernel"
  grep -E '^CONFIG_(SCHED_CLASS_EXT|DEBUG_INFO_BTF)=' "/boot/config-$kernel"
  echo "sched_ext: $(ls /sys/kernel/sched_ext 2>&1 | tr '\n' ' ')"
  echo "cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "${c##*/}: core $(cat "$c/topology/core_id"), siblings $(cat "$c/topology/thread_siblings_list")"
  done
  check "sched_ext state is disabled" test "$(cat /sys/kernel/sched_ext/state 2>/dev/null)" = disabled &&
    check "kernel BTF" test -f /sys/kernel/btf/vmlinux &&
    check "tracefs with sched events" test -d /sys/kernel/tracing/events/sched &&
    check "cgroup v2 has the cpu controller" grep -qw cpu /sys/fs/cgroup/cgroup.controllers
}

step_baseline() {
  local pid
  check "memcached.service is active" systemctl is-active --quiet memcached.service || return 1
  pid="$(memcached_pid)"
  echo "memcached (pid $pid) before temperd is installed:"
  $HELPER show "$pid"
  $HELPER snap "$pid" "$W/memcached-before.json"
  systemctl show -p CPUWeight --value memcached.service | tee "$W/cpuweight-before"
}

step_install() {
  local deb before
  deb="$(ls "$H"/temperd_*_all.deb | head -n1)"
  cp "$deb" /root/
  cd /root || return 1
  before="$(dpkg-query -W -f '${Package}\n' | sort)"
  echo "\$ apt install ./${deb##*/}"
  # The image has the dependencies and apt lists: the mirror is asked only when something is missing.
  if ! apt install -y -q "./${deb##*/}" >"$W/apt.log" 2>&1; then
    cat "$W/apt.log"
    echo "apt install failed; refreshing the apt lists and retrying"
    for attempt in 1 2 3; do timeout 240 apt-get update -q && break; sleep 5; done
    apt install -y -q "./${deb##*/}" >"$W/apt.log" 2>&1
  fi
  grep -v '^\(Get\|Selecting\|Preparing\|Unpacking\):' "$W/apt.log"
  echo "installed with it: $(comm -13 <(echo "$before") <(dpkg-query -W -f '${Package}\n' | sort) | tr '\n' ' ')"
  check "temperd installed" test "$(dpkg-query -W -f '${Status}' temperd)" = "install ok installed" || return 1
  check "conffile /etc/temper/temperd.toml" grep -q '^ /etc/temper/temperd.toml ' /var/lib/dpkg/status &&
    check "empty /etc/temper/profiles.d" test -d /etc/temper/profiles.d &&
    check "group temper created" getent group temper &&
    check "man pages temperd(8) temperctl(8) temper-profile(5)" \
      test -f /usr/share/man/man8/temperd.8.gz -a -f /usr/share/man/man8/temperctl.8.gz -a -f /usr/share/man/man5/temper-profile.5.gz &&
    check "temperd --check" temperd --check --config /etc/temper
}

step_enable() {
  systemctl enable --now temperd.service || return 1
  check "enabled" systemctl is-enabled --quiet temperd.service &&
    wait_for 90 "temperd.service active (READY=1 sent)" systemctl is-active --quiet temperd.service || return 1
  systemctl show temperd.service -p Type -p ActiveState -p SubState -p StatusText -p WatchdogUSec -p MainPID -p NRestarts
  ls -la /run/temper
  check "STATUS= sent" test -n "$(systemctl show -p StatusText --value temperd.service)" &&
    check "control socket root:temper srw-rw----" \
      test "$(stat -c '%A %U:%G' /run/temper/temperd.sock)" = "srw-rw---- root:temper"
}

step_status() {
  temperctl status || return 1
  check "state running" status_is 'd["state"] == "running"' || return 1
  id op >/dev/null 2>&1 || useradd -M -G temper op
  id outsider >/dev/null 2>&1 || useradd -M outsider
  check "a member of group temper may ask" runuser -u op -- temperctl status >/dev/null || return 1
  if runuser -u outsider -- temperctl status >"$W/outsider.out" 2>&1; then
    echo "FAILED: a user outside group temper got the status"
    return 1
  fi
  echo "ok: refused to a user outside group temper: $(head -n1 "$W/outsider.out")"
}

step_http() {
  python3 - <<'EOF'
import json, urllib.request
metrics = urllib.request.urlopen("http://127.0.0.1:9477/metrics", timeout=20).read().decode()
names = sorted({line.split("{")[0].split(" ")[0] for line in metrics.splitlines() if line.startswith("temperd_")})
print(f"/metrics: {len(names)} temperd_ series: {' '.join(names[:12])} ...")
observe = json.loads(urllib.request.urlopen("http://127.0.0.1:9477/observe", timeout=20).read())
print(f"/observe: keys {sorted(observe)}")
assert names and "machine_shape" in observe, "missing metrics or /observe fields"
EOF
}

step_trace() {
  # Through the daemon under the hardened unit (tracefs is its only writable part of /sys),
  # asked by a member of group temper; the file is copied out of /run/temper/traces.
  id op >/dev/null 2>&1 || useradd -M -G temper op
  local out=/tmp/e2e-trace.txt
  rm -f "$out"
  runuser -u op -- temperctl trace --duration 1s -o "$out" || return 1
  check "ftrace text header" grep -q '^# tracer: nop' "$out" &&
    check "sched_switch events" grep -q ' sched_switch: ' "$out" &&
    check "no tracefs instance left" test -z "$(ls /sys/kernel/tracing/instances | grep '^temperd-' || true)"
}

step_builtin() {
  local pid cpus
  pid="$(memcached_pid)"
  wait_for 60 "memcached.service matched by the builtin profile" \
    status_is 'any(w["key"] == "memcached.service" and w["profile"] == "memcached" for w in d["workloads"])' || return 1
  $HELPER json '[l for l in d["layers"] if l["name"].startswith("memcached")]' <"$W/status.now.json"
  temperctl plan || return 1
  temperctl explain "$pid" | tee "$W/explain.txt" || return 1
  check "temperctl explain names the profile" grep -q 'profile memcached' "$W/explain.txt" || return 1
  $HELPER show "$pid"
  cpus="$($HELPER json '",".join(str(c) for c in [l for l in d["layers"] if l["name"].endswith(".workers")][0]["cpus"])' <"$W/status.now.json")"
  check "mc-worker threads on the workers layer's CPUs ($cpus)" $HELPER expect "$pid" 'mc-worker' "affinity=$cpus" &&
    check "main thread: latency, nice -10" $HELPER expect "$pid" memcached nice=-10 &&
    check "maintenance threads: yield, SCHED_BATCH nice 19" $HELPER expect "$pid" 'mc-*maint' policy=batch nice=19
}

step_profile() {
  local pid all
  pid="$(memcached_pid)"
  all="$($HELPER json '",".join(str(c) for c in list(d.values())[0]["affinity"])' <"$W/memcached-before.json")"
  cat >/etc/temper/profiles.d/memcached.toml <<'EOF'
# VM test: replaces the builtin memcached profile.
schema_version = 1
id = "memcached"
description = "VM test: workers latency nice -5, everything else SCHED_IDLE"

[fingerprint]
units = ["memcached.service"]

[[thread_groups]]
name = "workers"
thread_names = ["mc-worker"]
treatment = "latency"
nice = -5

[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
EOF
  echo "dropped /etc/temper/profiles.d/memcached.toml"
  wait_for 60 "new plan applied: mc-worker nice -5, back on every CPU" \
    $HELPER expect "$pid" 'mc-worker' nice=-5 "affinity=$all" || return 1
  $HELPER show "$pid"
  check "every other thread yields (SCHED_IDLE)" $HELPER expect "$pid" 'mc-[!w]*' policy=idle &&
    check "file profile in force" status_is 'any(w["key"] == "memcached.service" and "rest" in w["groups"] for w in d["workloads"])'
}

step_tier() {
  cp /etc/temper/temperd.toml "$W/temperd.toml.orig"
  printf '\n[[binding]]\nunit = "memcached.service"\ntier = "critical"\n' >>/etc/temper/temperd.toml
  echo "added a [[binding]] of memcached.service to tier critical"
  if ! wait_for 60 "memcached.service CPUWeight=1000 (set through systemd)" \
    sh -c '[ "$(systemctl show -p CPUWeight --value memcached.service)" = 1000 ]'; then
    echo "CPUWeight now: $(systemctl show -p CPUWeight --value memcached.service)"
    temperctl plan --json | $HELPER json 'd["plan"]["cgroup_weights"]'
    status_json | $HELPER json 'd["last_apply"]'
    return 1
  fi
  check "the kernel's cgroup cpu.weight is 1000" test "$(cat /sys/fs/cgroup/system.slice/memcached.service/cpu.weight)" = 1000 &&
    check "workload in tier critical" status_is 'any(w["key"] == "memcached.service" and w["tier"] == "critical" for w in d["workloads"])'
}

step_reload() {
  local gen pid
  gen="$(generation)" pid="$(temperd_pid)"
  systemctl reload temperd.service || return 1
  wait_for 60 "generation after $gen, reloaded by SIGHUP" \
    status_is "d['generation'] > $gen and d['last_reload']['trigger'] == 'SIGHUP' and d['last_reload']['ok']" || return 1
  check "same process ($pid), still active" test "$(temperd_pid)" = "$pid" -a "$(systemctl is-active temperd.service)" = active
}

step_bad_profile() {
  local gen pid
  gen="$(generation)" pid="$(memcached_pid)"
  printf 'schema_version = 1\nid = "broken"\nbogus_key = 1\n\n[[thread_groups]]\nname = "x"\nthread_names = ["x"]\ntreatment = "latency"\n' \
    >/etc/temper/profiles.d/broken.toml
  echo "dropped /etc/temper/profiles.d/broken.toml (an unknown key)"
  wait_for 60 "reload refused, the error names broken.toml" \
    status_is "not d['last_reload']['ok'] and any('broken.toml' in p for p in d['last_reload']['problems'])" || return 1
  temperctl status | sed -n '1,12p'
  check "generation $gen keeps running" status_is "d['generation'] == $gen" &&
    check "previous plan still applied (mc-worker nice -5)" $HELPER expect "$pid" 'mc-worker' nice=-5 || return 1
  rm /etc/temper/profiles.d/broken.toml
  wait_for 60 "reload ok again once the file is gone" status_is "d['last_reload']['ok']"
}

step_crash_restart() {
  local old pid
  old="$(temperd_pid)" pid="$(memcached_pid)"
  kill -9 "$old"
  echo "killed temperd (pid $old) with SIGKILL"
  wait_for 90 "restarted by systemd (Restart=on-failure) and active" \
    sh -c "p=\$(systemctl show -p MainPID --value temperd.service); [ \"\$p\" != 0 ] && [ \"\$p\" != $old ] && systemctl is-active --quiet temperd.service" || return 1
  systemctl show temperd.service -p NRestarts -p MainPID
  ls -la /run/temper
  journalctl -u temperd.service -b --no-pager -n 200 | grep -iE 'recover|restor|left behind' | tail -n 5
  wait_for 60 "plan applied again (mc-worker nice -5)" $HELPER expect "$pid" 'mc-worker' nice=-5
}

step_stop_restores() {
  local pid
  pid="$(memcached_pid)"
  systemctl stop temperd.service || return 1
  journalctl -u temperd.service -b --no-pager -n 5
  $HELPER show "$pid"
  check "every memcached thread as before temperd (policy, nice, affinity)" $HELPER same "$W/memcached-before.json" "$pid" &&
    check "CPUWeight back to $(cat "$W/cpuweight-before")" \
      test "$(systemctl show -p CPUWeight --value memcached.service)" = "$(cat "$W/cpuweight-before")"
}

step_security() {
  local score
  systemd-analyze security --no-pager temperd.service | tee "$W/security.txt"
  score="$(sed -n 's/.*Overall exposure level for temperd.service: \([0-9.]*\).*/\1/p' "$W/security.txt")"
  [ -n "$score" ] || return 1
  echo "EXPOSURE $score (goal <= 2.5)"
  echo "$score" >"$H/exposure"
  awk -v s="$score" 'BEGIN { exit !(s <= 2.5) }' || return 3
}

step_sched_ext() {
  temperctl scx detect
  temperctl scx detect --json >"$W/detect.json"
  check "sched_ext in the kernel, state disabled, nothing loaded" \
    $HELPER json 'd["kernel_supported"] and d["state"] == "disabled" and not d["loaded_ops"] and not d["usable"]' <"$W/detect.json"
}

scx_cleanup() {
  systemctl stop temperd.service 2>/dev/null
  rm -rf /sys/fs/bpf/e2e /usr/local/bin/scx_layered /etc/systemd/system/temperd.service.d
  systemctl daemon-reload
  [ -f "$W/temperd.toml.orig" ] && cp "$W/temperd.toml.orig" /etc/temper/temperd.toml
  for _ in $(seq 40); do [ "$(cat /sys/kernel/sched_ext/state)" = disabled ] && break; sleep 0.5; done
  echo "cleanup: sched_ext state $(cat /sys/kernel/sched_ext/state)"
}
# A stand-in scx_layered (Debian ships none) that says so in the journal if it is ever run.
install_standin_scx_layered() {
  printf '#!/bin/sh\necho "stand-in scx_layered was started: $*" >&2\nexit 1\n' >/usr/local/bin/scx_layered
  chmod 755 /usr/local/bin/scx_layered
}
standin_never_started() { ! journalctl -u temperd.service -b --no-pager | grep "stand-in scx_layered was started"; }
export -f scx_cleanup install_standin_scx_layered standin_never_started

step_scx_privileges() {
  [ -f "$W/temperd.toml.orig" ] || cp /etc/temper/temperd.toml "$W/temperd.toml.orig"
  trap scx_cleanup EXIT
  install_standin_scx_layered
  sed -i 's/^#backend = "auto"$/backend = "scx"/' /etc/temper/temperd.toml
  grep -n '^backend' /etc/temper/temperd.toml
  echo "sched_ext state $(cat /sys/kernel/sched_ext/state); no scx-privileges.conf drop-in"
  systemctl restart temperd.service || return 1
  wait_for 90 "temperd active" systemctl is-active --quiet temperd.service || return 1
  temperctl status | sed -n '1,2p'
  check "backend native, the reason names the missing capabilities and the drop-in" \
    status_is 'd["backend"]["active"] == "native" and "CAP_BPF" in d["backend"]["reason"] and "scx-privileges.conf" in d["backend"]["reason"]' &&
    check "scx_layered was never started" standin_never_started
}

step_scx_refusal() {
  [ -f "$W/temperd.toml.orig" ] || cp /etc/temper/temperd.toml "$W/temperd.toml.orig"
  trap scx_cleanup EXIT
  mkdir -p /sys/fs/bpf/e2e
  bpftool struct_ops register /usr/local/lib/scx_minimal.bpf.o /sys/fs/bpf/e2e || return 1
  wait_for 30 "e2e_minimal enabled" sh -c '[ "$(cat /sys/kernel/sched_ext/state)" = enabled ] && [ "$(cat /sys/kernel/sched_ext/root/ops)" = e2e_minimal ]' || return 1
  dmesg | grep -i 'sched_ext' | tail -n 2
  # temperd must refuse to start scx_layered beside it, not try and fail.
  install_standin_scx_layered
  temperctl scx detect | tee "$W/detect-loaded.txt"
  check "temperctl scx detect names the loaded scheduler" grep -q e2e_minimal "$W/detect-loaded.txt" &&
    check "and finds scx_layered" grep -q /usr/local/bin/scx_layered "$W/detect-loaded.txt" || return 1
  sed -i 's/^#backend = "auto"$/backend = "scx"/' /etc/temper/temperd.toml
  grep -n '^backend' /etc/temper/temperd.toml
  # What an administrator of the scx backend does: the package's drop-in with scx_layered's privileges.
  install -D -m 0644 /usr/share/temperd/scx-privileges.conf /etc/systemd/system/temperd.service.d/scx.conf
  systemctl daemon-reload
  caps="$(systemctl show -p CapabilityBoundingSet --value temperd.service)"
  echo "CapabilityBoundingSet: $caps"
  check "the drop-in adds cap_bpf, cap_perfmon, cap_sys_admin" has_words "$caps" cap_bpf cap_perfmon cap_sys_admin &&
    check "and the bpf system call" has_words "$(systemctl show -p SystemCallFilter --value temperd.service)" bpf || return 1
  systemd-analyze security --no-pager temperd.service | tail -n 1
  systemctl restart temperd.service || return 1
  wait_for 90 "temperd active" systemctl is-active --quiet temperd.service || return 1
  temperctl status >"$W/status-scx.txt"
  sed -n '1,3p' "$W/status-scx.txt"
  check "temperctl status names e2e_minimal" grep -q e2e_minimal "$W/status-scx.txt" &&
    check "backend native, the reason names e2e_minimal" \
    status_is 'd["backend"]["active"] == "native" and "e2e_minimal" in d["backend"]["reason"]' &&
    check "sched_ext still runs e2e_minimal (temperd did not replace it)" test "$(cat /sys/kernel/sched_ext/root/ops)" = e2e_minimal &&
    check "scx_layered was never started" standin_never_started
}

step_bcc() {
  local found=0 failed=0
  python3 -c 'import bcc; print("python3-bpfcc importable:", bcc.__file__)' || echo "python3-bpfcc not importable"
  shopt -s nullglob
  for prog in "$H"/bpf/*.c; do
    found=1
    if timeout 300 python3 -c "import sys; from bcc import BPF; BPF(src_file=sys.argv[1]); print('loaded', sys.argv[1])" "$prog"; then
      echo "ok: $prog loads"
    else
      echo "FAILED: $prog does not load"
      failed=1
    fi
  done
  if [ "$found" = 0 ]; then
    echo "bpf/ ships no BPF programs (see bpf/README.md): nothing to load"
    return 4
  fi
  return "$failed"
}

step_journal() {
  journalctl -u temperd.service -b --no-pager -o short-monotonic | tail -n 60
  if journalctl -u temperd.service -b --no-pager | grep -q 'Traceback'; then
    echo "FAILED: a Python traceback in temperd's journal:"
    journalctl -u temperd.service -b --no-pager | grep -A 25 'Traceback' | head -n 60
    return 1
  fi
  echo "ok: no traceback in temperd's journal"
}

step_remove() {
  apt-get remove -y -q temperd || return 1
  check "service stopped and gone" sh -c '! systemctl is-active --quiet temperd.service && ! pgrep -x temperd' || return 1
  apt-get purge -y -q temperd || return 1
  check "conffile purged" test ! -e /etc/temper/temperd.toml &&
    check "memcached untouched, still active" systemctl is-active --quiet memcached.service
}

export -f $(declare -F | awk '$3 ~ /^step_/ {print $3}')

# ---- runner -----------------------------------------------------------------------------------------

RESULTS="$H/results.tsv"
: >"$RESULTS"
ONLY="$(cat "$H/only" 2>/dev/null || true)"
declare -A RESULT

# run_step NAME TIMEOUT_S "PREREQUISITES" DESCRIPTION
run_step() {
  local name=$1 limit=$2 needs=$3 desc=$4 status rc start elapsed summary
  # --only: run just these steps (a prerequisite that was left out counts as met).
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  echo
  echo "=== step $name: $desc"
  for need in $needs; do
    case "${RESULT[$need]:-${ONLY:+PASS}}" in
      PASS|WARN) ;;
      *) RESULT[$name]=SKIP
         printf 'SKIP\t0.0\t%s\t%s\n' "$name" "needs $need (${RESULT[$need]:-not run})" >>"$RESULTS"
         echo "--- SKIP $name: needs $need"
         return ;;
    esac
  done
  # Test knob of the host's panic retry only (run-vm-test.sh's E2E_INJECT_PANIC, which writes the
  # step's name into inject-panic): crash the kernel as this step begins, as registering a sched_ext
  # scheduler can under multi-threaded TCG (root may write /proc/sysrq-trigger whatever kernel.sysrq says).
  if [ "$(cat "$H/inject-panic" 2>/dev/null)" = "$name" ]; then
    echo "E2E_INJECT_PANIC: crashing the kernel (sysrq c)"
    sync
    echo c >/proc/sysrq-trigger
  fi
  start=$(date +%s.%N)
  timeout --kill-after=10 "$limit" bash -c "step_$name" 2>&1 | tee "$W/$name.log"
  rc=${PIPESTATUS[0]}
  elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  case $rc in
    0) status=PASS ;;
    3) status=WARN ;;
    4) status=SKIP ;;
    124|137) status=FAIL; echo "timed out after $limit s" ;;
    *) status=FAIL ;;
  esac
  summary="$desc"
  [ "$name" = security ] && [ -f "$H/exposure" ] && summary="$desc: exposure $(cat "$H/exposure")"
  RESULT[$name]=$status
  printf '%s\t%s\t%s\t%s\n' "$status" "$elapsed" "$name" "$summary" >>"$RESULTS"
  echo "--- $status $name (${elapsed} s)"
  sync
}

run_step boot 30 "" "systemd booted as PID 1"
run_step kernel 30 "" "sched_ext, BTF, tracefs and cgroup v2 in the kernel"
run_step baseline 30 "" "memcached running under its own unit; its threads recorded"
run_step install 600 "" "apt install ./temperd_*.deb"
run_step enable 180 "install" "systemctl enable --now temperd"
run_step status 120 "enable" "temperctl status (root, group temper, outsider refused)"
run_step http 60 "enable" "GET /metrics and /observe on 127.0.0.1:9477"
run_step trace 90 "status" "temperctl trace through the daemon, as a member of group temper"
run_step builtin 120 "enable baseline" "memcached treated by the builtin profile"
run_step profile 120 "enable baseline" "a profile dropped into /etc/temper/profiles.d is applied"
run_step tier 120 "enable baseline" "[[binding]] tier critical: CPUWeight through systemd"
run_step reload 120 "enable" "systemctl reload temperd"
run_step bad_profile 180 "profile" "a broken profile is reported, the running plan stays"
run_step crash_restart 180 "profile" "SIGKILL: systemd restarts temperd, /run/temper kept, plan reapplied"
run_step stop_restores 120 "enable baseline" "systemctl stop temperd restores every thread and the weight"
run_step security 60 "install" "systemd-analyze security temperd.service"
run_step sched_ext 60 "install" "temperctl scx detect: sched_ext available, state disabled"
run_step scx_privileges 180 "install" "backend scx without the scx-privileges.conf drop-in: native, and says why"
run_step scx_refusal 240 "install" "another sched_ext scheduler loaded: temperd names it, keeps native"
run_step bcc 600 "" "bcc programs in bpf/ load"
run_step journal 60 "enable" "temperd's journal has no traceback"
run_step remove 240 "install" "apt remove/purge temperd"

# For a failure's diagnosis on the host (kept with --keep): temperd's journal and the steps' logs.
journalctl -b --no-pager -o short-monotonic >"$H/journal.txt" 2>&1
cp -r "$W" "$H/guest-work" 2>/dev/null
echo
echo "=== results"
column -t -s $'\t' "$RESULTS" 2>/dev/null || cat "$RESULTS"
! grep -q '^FAIL' "$RESULTS"
