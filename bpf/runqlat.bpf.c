// temperd's scheduling-delay telemetry, loaded by temperd (temperd/sources/runqlat.py) through
// the distribution's bcc (python3-bpfcc / python3-bcc). Licence: Apache-2.0 (the program is
// GPL-compatible-only where the kernel requires it: it uses no GPL-only helper).
//
// Per layer of temperd's plan: a log2 histogram of the delay between a member thread becoming
// runnable (woken, or preempted while still runnable) and it running, in microsecond slots; the
// sum of those delays; their maximum since temperd last read it; and why members left the CPU
// (preempted, voluntary sleep, uninterruptible sleep).
//
// Filter in the kernel: temperd writes the plan's members into member_bits (one bit per tid, an
// array the JIT indexes directly) and layer_of (tid -> layer id), on every apply. A thread that is
// not a member costs one array lookup and a bit test per wakeup and per switch side (no hashing),
// and nothing is stored for it; only members go on to the hash lookup of their layer.
//
// MAX_MEMBERS, MAX_LAYERS, SLOTS and BITMAP_WORDS (pid_max / 64, rounded up) come from temperd's
// cflags.

#include <uapi/linux/ptrace.h>

#ifndef MAX_MEMBERS
#define MAX_MEMBERS 16384
#endif
#ifndef MAX_LAYERS
#define MAX_LAYERS 256
#endif
#ifndef SLOTS
#define SLOTS 26
#endif
#ifndef BITMAP_WORDS
#define BITMAP_WORDS 65536  // pid_max 4194304
#endif

#define OFF_PREEMPTED 0
#define OFF_VOLUNTARY 1
#define OFF_UNINTERRUPTIBLE 2

struct hist_key {
    u32 layer;
    u32 slot;
};

struct off_key {
    u32 layer;
    u32 reason;
};

BPF_ARRAY(member_bits, u64, BITMAP_WORDS);     // bit (tid % 64) of word (tid / 64): a member
BPF_HASH(layer_of, u32, u32, MAX_MEMBERS);     // tid -> layer id (1..MAX_LAYERS-1), from the plan
BPF_HASH(queued_at, u32, u64, MAX_MEMBERS);    // tid -> when it became runnable (ns)
BPF_HASH(hist, struct hist_key, u64, MAX_LAYERS * SLOTS);
BPF_ARRAY(sum_ns, u64, MAX_LAYERS);
BPF_ARRAY(max_ns, u64, MAX_LAYERS);
BPF_HASH(offcpu, struct off_key, u64, MAX_LAYERS * 3);

static __always_inline u32 *layer_of_member(u32 tid)
{
    int word = tid >> 6;
    u64 *bits = member_bits.lookup(&word);
    if (!bits || !(*bits & (1ULL << (tid & 63))))
        return 0;
    return layer_of.lookup(&tid);
}

static __always_inline int queued(u32 tid)
{
    u32 *layer = layer_of_member(tid);
    if (!layer)
        return 0;
    u64 now = bpf_ktime_get_ns();
    queued_at.update(&tid, &now);
    return 0;
}

// The sched tracepoints' own fields (their format files), not task_struct: the program does not
// depend on the layout of kernel structures, only on these stable tracepoint fields.
TRACEPOINT_PROBE(sched, sched_wakeup)
{
    return queued(args->pid);
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    return queued(args->pid);
}

// prev_state as the tracepoint reports it: TASK_REPORT_MAX (0x100 since 4.14) when preempted,
// 0 when it left the CPU runnable without being preempted (sched_yield), else 1 << (state index - 1):
// 1 sleeping (S), 2 uninterruptible (D), ...
#define REPORT_PREEMPTED 0x100
#define REPORT_UNINTERRUPTIBLE 0x2

TRACEPOINT_PROBE(sched, sched_switch)
{
    u32 prev_tid = args->prev_pid;
    u32 next_tid = args->next_pid;

    u32 *prev_layer = layer_of_member(prev_tid);
    if (prev_layer) {
        long state = args->prev_state;
        struct off_key off = {.layer = *prev_layer};
        if (state == 0 || (state & REPORT_PREEMPTED)) {
            // still runnable: it waits on the runqueue again from now
            u64 now = bpf_ktime_get_ns();
            queued_at.update(&prev_tid, &now);
            off.reason = OFF_PREEMPTED;
        } else if (state & REPORT_UNINTERRUPTIBLE) {
            off.reason = OFF_UNINTERRUPTIBLE;
        } else {
            off.reason = OFF_VOLUNTARY;
        }
        offcpu.atomic_increment(off);
    }

    u32 *next_layer = layer_of_member(next_tid);
    if (!next_layer)
        return 0;
    u64 *since = queued_at.lookup(&next_tid);
    if (!since)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *since;
    queued_at.delete(&next_tid);
    u32 layer = *next_layer;
    if (layer >= MAX_LAYERS)
        return 0;
    u32 slot = bpf_log2l(delta / 1000);
    if (slot >= SLOTS)
        slot = SLOTS - 1;
    struct hist_key key = {.layer = layer, .slot = slot};
    hist.atomic_increment(key);
    int idx = layer;
    sum_ns.atomic_increment(idx, delta);
    u64 *peak = max_ns.lookup(&idx);
    if (peak && delta > *peak)
        *peak = delta;
    return 0;
}
