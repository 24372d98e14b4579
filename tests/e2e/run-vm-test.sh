#!/usr/bin/env bash
# End-to-end test of the packaged daemon on a real systemd host: builds (or reuses) a Debian trixie
# VM image with the trixie-backports kernel (sched_ext, BTF), builds the .deb from this tree, boots
# the image under QEMU (KVM where it is really usable, else software emulation) and runs
# tests/e2e/guest-steps.sh inside: apt install ./temperd_*.deb, systemctl enable --now, temperctl
# status, memcached under its own unit treated by a profile dropped into /etc/temper/profiles.d,
# a tier binding through systemd, reload, a broken profile, a crash restart, stop restoring every
# thread, systemd-analyze security, sched_ext detection, backend "scx" without the
# scx-privileges.conf drop-in and beside another BPF scheduler, the scx backend on the real
# scx_layered (--scx-layered: loaded, its layers and CPU masks, a batched restart, the crash limit
# and safe mode, recovery, stop), the bcc programs of bpf/ (standalone, and inside temperd.service
# with the bpf-telemetry.conf drop-in: redis and spinners, the latency histograms filled), and
# removal. Prints each step's result and time; exits 1 on a failure. Opt-in (--bench): benchmarks
# in the guest after the steps.
#
# usage: tests/e2e/run-vm-test.sh [--cache DIR] [--deb FILE] [--scx-layered FILE] [--timeout MIN] [--keep]
#                                  [--rebuild-image] [--only STEPS] [--skip STEPS] [--bench "NAME..."] [--bench-ladder N,N..]
#                                  [--bench-servers NAME,NAME..] [--bench-arms ARM,ARM..] [--bench-out DIR]
#        tests/e2e/run-vm-test.sh --check-console LOG
#   --cache DIR      image cache (default $TEMPERD_E2E_CACHE or /var/cache/temperd-e2e)
#   --deb FILE       test this .deb instead of building one with scripts/build-packages.sh
#   --scx-layered FILE  the real scx_layered (x86_64, glibc >= 2.38) for the scx_* steps, installed in
#                    the guest as /usr/bin/scx_layered (default: $TEMPERD_SCX_LAYERED, else
#                    ../shared/scx/scx_layered beside the repository; checked against the SHA256SUMS
#                    beside it). Without one the scx_* steps say SKIP and why.
#   --timeout MIN    overall limit, image build included (default 25)
#   --keep           keep the run directory (console log, guest logs) and print its path
#   --rebuild-image  build the image even if a fresh one is cached
#   --only "STEP..." run only these guest steps (names as in guest-steps.sh, or shell patterns), e.g.
#                    "install enable tier" or "boot install enable scx_*"
#   --skip "STEP..." run every guest step but these (names or patterns). With --only and --skip, two
#                    runs side by side can share the steps (CI runs the scx_* steps in a VM of their own)
#   --bench "NAME..."  also run these benchmarks in the guest, after the steps (tens of minutes under
#                    software emulation: give --timeout room, e.g. 120; not part of CI):
#                    isolation  bench/isolation.py's ladder: redis, spinners 0/1/2/4 in the background
#                               tier, 50 clients, 3 repetitions, arms stock / temperd+bg (native) /
#                               scx+bg (the real scx_layered, when there is one)
#                    overhead   bench/overhead.py --bpf both --switch-load 1 --threads 0: the bcc
#                               telemetry on against off, same load
#   --bench-ladder N,N..  the isolation benchmark's spinner counts (default 0,1,2,4)
#   --bench-servers NAME,NAME..  the isolation benchmark's servers, one run each (default redis;
#                    memcached's load generator, memcaslap, is installed in the guest when asked)
#   --bench-arms ARM,ARM..  the isolation benchmark's arms (bench/isolation.py --arms; default
#                    stock,temperd+bg and scx+bg where there is a real scx_layered)
#   --bench-out DIR  copy the benchmarks' output (text and JSON) into DIR
#   --check-console LOG  boot nothing: print the kernel panic or oops a guest console log shows, on
#                    one line, and exit 0, or exit 1 if it shows none (the check behind a panic retry)
# A guest kernel panic (under multi-threaded TCG, registering a sched_ext scheduler can panic the
# guest) is retried once, under TCG single-threaded; a stuck boot or qemu failing is retried apart.
# env: E2E_BOOT_LIMIT (s, default 300): a boot not "running" by then is stuck.
#      E2E_TCG=single: boot under single-threaded TCG from the start (slower, without the panic
#      race: for benchmarks that start and stop a sched_ext scheduler many times).
#      E2E_INJECT_PANIC=STEP, a test knob of the panic retry only: the guest crashes its kernel
#      (sysrq c) as STEP begins, on the first boot (E2E_INJECT_PANIC_BOOTS=N: on the first N boots).
# Needs root (the image build) and the Debian packages:
#   qemu-system-x86 qemu-utils mmdebstrap e2fsprogs zstd, and to build the .deb:
#   dpkg-dev debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools
# The image holds the package's dependencies, their .debs in apt's archive cache and apt's binary
# caches; step deps_purged purges the dependencies, so that the install pulls them (from that cache:
# no network). The guest reaches the Debian mirror through QEMU's user networking only if apt needs
# something more.
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C.UTF-8

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

# guest_panic CONSOLE_LOG: when the guest's console shows a kernel panic or oops, print it on one
# line (the oops, the function it hit in, the panic) and succeed; else fail.
guest_panic() {
  # The serial console has CRLF line ends and escape sequences; the kernel's timestamps are dropped.
  # An oops header is "Oops: int3: 0000 [#1] ..." (before Linux 6.9 "int3: 0000 [#1] ..."); its RIP
  # line, not an earlier WARNING's, says where it hit.
  tr -d '\r\033' <"$1" | awk '
    { sub(/^.*\[ *[0-9]+\.[0-9]+\] /, "") }
    oops == "" && /Oops: |: [0-9a-f][0-9a-f][0-9a-f][0-9a-f] \[#[0-9]+\]/ { oops = $0; next }
    oops != "" && rip == "" && /RIP: 0010:/ { rip = $0; sub(/^.*RIP: 0010:/, "", rip) }
    panic == "" && /Kernel panic - not syncing/ { panic = $0; sub(/^.*Kernel panic/, "Kernel panic", panic) }
    END {
      if (oops == "" && panic == "") exit 1
      line = oops
      if (rip != "") line = line " in " rip
      if (panic != "") line = line (line == "" ? "" : "; ") panic
      print line
    }'
}
# panic_excerpt CONSOLE_LOG: the console from the oops or panic on, without the code and register
# dumps: where it hit and the call trace.
panic_excerpt() {
  tr -d '\r\033' <"$1" | awk '
    /Oops: |: [0-9a-f][0-9a-f][0-9a-f][0-9a-f] \[#[0-9]+\]|Kernel panic - not syncing/ { on = 1 }
    on && !/Code: |\] (R[ABCDS][XPI]|RBP|RSI|RDI|R[0-9]+|[CDEFG]S|CR[0-9]|DR[0-9]): |\]  \? / && n++ < 20'
}
cache="${TEMPERD_E2E_CACHE:-/var/cache/temperd-e2e}"
deb="" timeout_min=25 keep=0 only="" skip="" scx_layered="${TEMPERD_SCX_LAYERED:-}" bench="" bench_out="" bench_ladder=0,1,2,4
bench_servers=redis bench_arms=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache="${2:?}"; shift ;;
    --deb) deb="$(realpath "${2:?}")"; shift ;;
    --scx-layered) scx_layered="$(realpath "${2:?}")"; shift ;;
    --timeout) timeout_min="${2:?}"; shift ;;
    --keep) keep=1 ;;
    --only) only="${2:?}"; shift ;;
    --skip) skip="${2:?}"; shift ;;
    --bench) bench="${2:?}"; shift ;;
    --bench-out) bench_out="$(realpath -m "${2:?}")"; shift ;;
    --bench-ladder) bench_ladder="${2:?}"; shift
      [[ "$bench_ladder" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "run-vm-test.sh: --bench-ladder: expected N,N,... (e.g. 0,4), found $bench_ladder" >&2; exit 2; } ;;
    --bench-arms) bench_arms="${2:?}"; shift
      [[ "$bench_arms" =~ ^stock(,[a-z+-]+)*$ ]] ||
        { echo "run-vm-test.sh: --bench-arms: expected stock,ARM,... (bench/isolation.py's arm names), found $bench_arms" >&2; exit 2; } ;;
    --bench-servers) bench_servers="${2:?}"; shift
      [[ "$bench_servers" =~ ^(redis|memcached)(,(redis|memcached))*$ ]] ||
        { echo "run-vm-test.sh: --bench-servers: expected redis and/or memcached (e.g. redis,memcached), found $bench_servers" >&2; exit 2; } ;;
    --rebuild-image) export E2E_REBUILD=1 ;;
    --check-console) if guest_panic "${2:?}"; then exit 0; else exit 1; fi ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-vm-test.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

deadline=$((SECONDS + timeout_min * 60))
left() { echo $((deadline - SECONDS)); }
say() { printf '[vm-test %4d s] %s\n' "$SECONDS" "$*"; }
declare -a TIMES=()
timed() { TIMES+=("$(printf '%-34s %6d s' "$1" "$2")"); }

missing=()
for name in $bench; do
  case "$name" in
    isolation|overhead) ;;
    *) echo "run-vm-test.sh: unknown benchmark $name (isolation, overhead)" >&2; exit 2 ;;
  esac
done
for tool in qemu-system-x86_64 mmdebstrap mke2fs zstd timeout; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ -z "$deb" ]; then
  for tool in dpkg-buildpackage dh; do command -v "$tool" >/dev/null || missing+=("$tool"); done
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "run-vm-test.sh: missing ${missing[*]}; install: apt-get install qemu-system-x86 qemu-utils mmdebstrap" \
       "e2fsprogs zstd dpkg-dev debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools" >&2
  exit 1
fi

run="$(mktemp -d /tmp/temperd-e2e.XXXXXX)"
share="$run/share"
mkdir -p "$share"
qemu_pid=""
cleanup() {
  [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null
  if [ "$keep" = 1 ]; then echo "run directory kept: $run"; else rm -rf "$run"; fi
}
trap cleanup EXIT

# 1. The image (cached; rebuilt when older than a week or when its recipe changes).
t=$SECONDS
say "image: $cache"
image="$(timeout "$(left)" bash "$here/build-image.sh" "$cache")" || { say "FAIL: image build"; exit 1; }
timed "image (build or reuse)" $((SECONDS - t))
say "image ready: $image (kernel $(cat "$image/kernel-version"))"

# 2. The package.
t=$SECONDS
if [ -z "$deb" ]; then
  say "building the .deb"
  if ! timeout "$(left)" bash "$root/scripts/build-packages.sh" --deb-only --no-lint --out "$run/dist" >"$run/build.log" 2>&1; then
    tail -n 40 "$run/build.log"
    say "FAIL: .deb build"
    exit 1
  fi
  deb="$(ls "$run"/dist/temperd_*_all.deb)"
fi
cp "$deb" "$share/"
timed "build the .deb" $((SECONDS - t))
say "package: ${deb##*/}"

# 3. What the guest runs and needs.
cp "$here/guest-steps.sh" "$here/guest_helper.py" "$share/"
mkdir -p "$share/bpf"
find "$root/bpf" -maxdepth 1 -type f \( -name '*.c' -o -name '*.py' \) -exec cp {} "$share/bpf/" \;
if [ -z "$scx_layered" ] && [ -f "$root/../shared/scx/scx_layered" ]; then
  scx_layered="$(realpath "$root/../shared/scx/scx_layered")"
fi
if [ -n "$scx_layered" ]; then
  [ -f "$scx_layered" ] || { say "FAIL: --scx-layered $scx_layered: no such file"; exit 1; }
  sums="$(dirname "$scx_layered")/SHA256SUMS"
  if [ -f "$sums" ]; then
    (cd "$(dirname "$scx_layered")" && grep " \*\{0,1\}$(basename "$scx_layered")\$" SHA256SUMS | sha256sum -c --quiet -) ||
      { say "FAIL: $scx_layered does not match $sums"; exit 1; }
  fi
  cp "$scx_layered" "$share/scx_layered"
  say "real scx_layered for the scx_* steps: $scx_layered (sha256 $(sha256sum "$scx_layered" | cut -c1-16)...)"
else
  say "no real scx_layered (--scx-layered, \$TEMPERD_SCX_LAYERED, ../shared/scx/): the scx_* steps will SKIP"
fi
printf '#!/bin/sh\nexec /bin/bash /mnt/host/guest-steps.sh\n' >"$share/run.sh"
[ -z "$only" ] || echo "$only" >"$share/only"
[ -z "$skip" ] || echo "$skip" >"$share/skip"
if [ -n "$bench" ]; then
  # The benchmarks as in the checkout (bench/, and tests/servers.py they start servers with); they
  # run the packaged temperd.
  mkdir -p "$share/checkout/bench" "$share/checkout/tests"
  cp "$root"/bench/*.py "$share/checkout/bench/"
  cp "$root/tests/servers.py" "$share/checkout/tests/"
  echo "$bench" >"$share/bench"
  echo "$bench_ladder" >"$share/bench-ladder"
  echo "$bench_servers" >"$share/bench-servers"
  [ -z "$bench_arms" ] || echo "$bench_arms" >"$share/bench-arms"
  say "benchmarks in the guest after the steps: $bench"
fi
chmod 755 "$share/run.sh" "$share/guest-steps.sh"

# 4. Boot. KVM only where it really is: hardware virtualization flags, a writable /dev/kvm, and not
# the kvm_pvm nested hypervisor (which cannot run an unmodified kernel).
if grep -qwE 'vmx|svm' /proc/cpuinfo && [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then
  accel=(-accel kvm -cpu host) accel_name=KVM
  say "accelerator: KVM"
elif [ "${E2E_TCG:-multi}" = single ]; then
  accel=(-accel tcg,thread=single -cpu max) accel_name="single-threaded TCG"
  say "accelerator: TCG (software emulation, single-threaded: E2E_TCG=single)"
else
  accel=(-accel tcg,thread=multi -cpu max) accel_name="multi-threaded TCG"
  say "accelerator: TCG (software emulation)"
fi
# A boot that has not reached systemd's "running" within boot_limit seconds is stuck (seen, rarely,
# in early kernel boot under software emulation): it is killed and booted once more.
boot_limit="${E2E_BOOT_LIMIT:-300}"
# A guest kernel panic is retried on its own count, so that a stuck boot cannot have used up its
# retry. Under multi-threaded TCG, registering a sched_ext scheduler can panic the guest ("Oops:
# int3" in put_prev_task_idle, "Fatal exception in interrupt"): sched_ext flips static branches,
# and the kernel's int3-based live patching of them races with QEMU's parallel vCPU threads. So the
# retry under TCG runs single-threaded (slower, but without that race); a panic there too is a FAIL
# that names it. panic=-1 reboots a panicked guest at once, oops=panic makes every oops a panic (an
# oops in the scheduler would otherwise leave a hung guest to eat the time left), and -no-reboot
# makes that reboot end qemu.
panic_retries=1
inject="${E2E_INJECT_PANIC:-}" inject_boots="${E2E_INJECT_PANIC_BOOTS:-1}"
t=$SECONDS
qemu_rc=0 attempt=0 boot_failures=0 panics=0 panicked_s=0 panic="" panic_step=""
while true; do
  attempt=$((attempt + 1))
  limit=$(left)
  if [ "$limit" -lt 120 ]; then
    say "FAIL: only $limit s left for the VM${panic:+ after a guest kernel panic ($panic)}"
    exit 1
  fi
  say "booting (attempt $attempt, $accel_name, limit $limit s)"
  # Nothing an earlier attempt wrote may pass for this one's results (its disk is gone: -snapshot).
  rm -rf "$share/boot-state" "$share/out.log" "$share/rc" "$share/results.tsv" "$share/exposure" \
    "$share/journal.txt" "$share/guest-work" "$share/inject-panic" "$share/bench-results"
  if [ -n "$inject" ] && [ "$panics" -lt "$inject_boots" ]; then
    echo "$inject" >"$share/inject-panic"
    say "E2E_INJECT_PANIC (test knob): the guest crashes its kernel as step $inject begins"
  fi
  echo "$accel_name" >"$share/accel"  # the guest's steps read how it is emulated
  panic="" panic_step=""
  attempt_t=$SECONDS
  boot_start=$(date +%s)
  # Two cores with two SMT threads each, so exclusive groups and idle siblings are real.
  timeout --kill-after=15 "$limit" qemu-system-x86_64 "${accel[@]}" -m 4096 \
    -smp 4,sockets=1,cores=2,threads=2 -nographic -no-reboot \
    -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 panic=-1 oops=panic loglevel=4 systemd.show_status=0" \
    -drive "file=$image/img.raw,if=virtio,format=raw,cache=unsafe" -snapshot \
    -virtfs "local,path=$share,mount_tag=host,security_model=none,id=host" \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0 \
    </dev/null >"$run/console.log" 2>&1 &
  qemu_pid=$!
  stuck=0
  while kill -0 "$qemu_pid" 2>/dev/null && [ ! -f "$share/boot-state" ]; do
    if [ $(( $(date +%s) - boot_start )) -ge "$boot_limit" ]; then stuck=1; break; fi
    sleep 2
  done
  if [ "$stuck" = 1 ]; then
    kill "$qemu_pid" 2>/dev/null
    wait "$qemu_pid" 2>/dev/null || true
    qemu_pid=""
    cp "$run/console.log" "$run/console-stuck-$attempt.log"
    say "boot did not reach systemd within $boot_limit s; console tail:"
    tail -c 600 "$run/console.log" | tr -d '\033' | tail -n 5
    boot_failures=$((boot_failures + 1))
    [ "$boot_failures" -ge 2 ] || continue
    break
  fi
  qemu_rc=0
  wait "$qemu_pid" || qemu_rc=$?
  qemu_pid=""
  # A panic after the steps finished (while powering off) does not touch their results.
  if [ ! -f "$share/rc" ] && panic="$(guest_panic "$run/console.log")"; then
    panics=$((panics + 1))
    panic_step="$(sed -n 's/^=== step \([a-z_]*\):.*/\1/p' "$share/out.log" 2>/dev/null | tail -n 1 || true)"
    cp "$run/console.log" "$run/console-panic-$panics.log"
    [ ! -f "$share/out.log" ] || cp "$share/out.log" "$run/out-panic-$panics.log"
    panicked_s=$((panicked_s + SECONDS - attempt_t))
    say "guest kernel panic on attempt $attempt ($accel_name${panic_step:+, in step $panic_step}): $panic"
    say "the console from there (all of it: console-panic-$panics.log in the run directory, see --keep):"
    panic_excerpt "$run/console.log"
    [ "$panics" -le "$panic_retries" ] || break
    if [ "$accel_name" = "multi-threaded TCG" ]; then
      accel=(-accel tcg,thread=single -cpu max) accel_name="single-threaded TCG"
    fi
    say "retrying that boot ($accel_name)"
    continue
  fi
  if [ ! -f "$share/boot-state" ] && [ "$qemu_rc" != 124 ] && [ "$qemu_rc" != 137 ]; then
    # qemu itself gave up before the guest booted (an image it could not open, a crash):
    # say why, and try once more.
    cp "$run/console.log" "$run/console-exit-$attempt.log"
    say "qemu exited ($qemu_rc) before the guest booted; console tail:"
    tail -c 1200 "$run/console.log" | tr -d '\033' | tail -n 10
    boot_failures=$((boot_failures + 1))
    [ "$boot_failures" -ge 2 ] || continue
  fi
  break
done
timed "VM: boot, steps, power off" $((SECONDS - t))
[ "$panics" = 0 ] || timed "  of which boots that panicked ($panics)" "$panicked_s"
if [ -f "$share/boot-state" ]; then
  timed "  of which boot to $(cat "$share/boot-state")" $(( $(stat -c %Y "$share/boot-state") - boot_start ))
fi
if [ -f "$share/rc" ] && late_panic="$(guest_panic "$run/console.log")"; then
  say "note: the guest kernel panicked after its steps had finished: $late_panic"
fi

# 5. Results.
echo
if [ -f "$share/out.log" ]; then
  cat "$share/out.log"
fi
echo
echo "=== times (host)"
printf '%s\n' "${TIMES[@]}"
echo
echo "=== results"
if [ -s "$share/results.tsv" ]; then
  awk -F '\t' '{ printf "%-5s %7.1f s  %-22s %s\n", $1, $2, $3, $4 }' "$share/results.tsv"
fi
[ -f "$share/exposure" ] && echo "systemd-analyze security exposure: $(cat "$share/exposure") (goal <= 2.5)"
if [ -n "$bench" ] && [ -d "$share/bench-results" ]; then
  if [ -n "$bench_out" ]; then
    mkdir -p "$bench_out" && cp -r "$share/bench-results/." "$bench_out/"
    echo "benchmark output: $bench_out ($(ls "$bench_out" | tr '\n' ' '))"
  else
    echo "benchmark output: $share/bench-results (kept with --keep, or name a directory with --bench-out)"
  fi
fi

fail=0
if [ -n "$panic" ]; then
  say "FAIL: the guest kernel panicked again on the retry (attempt $attempt, $accel_name${panic_step:+, in step $panic_step}): $panic"
  fail=1
elif [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
  say "FAIL: the VM ran out of time (overall limit ${timeout_min} min); console tail:"
  tail -n 30 "$run/console.log"
  fail=1
elif [ ! -f "$share/boot-state" ]; then
  say "FAIL: the VM did not boot in two attempts (each stuck for $boot_limit s or ended by qemu, see above)"
  fail=1
elif [ ! -f "$share/rc" ]; then
  say "FAIL: the guest did not finish its steps (qemu exit $qemu_rc); console tail:"
  tail -n 40 "$run/console.log"
  fail=1
elif [ "$(cat "$share/rc")" != 0 ] || grep -q '^FAIL' "$share/results.tsv"; then
  say "FAIL: see the steps above"
  fail=1
elif [ "$panics" -gt 0 ]; then
  say "all steps passed, on a retry after a guest kernel panic (see above)"
else
  say "all steps passed"
fi
exit "$fail"
