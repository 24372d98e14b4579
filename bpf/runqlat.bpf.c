// temperd's scheduling-delay telemetry, loaded by temperd (temperd/sources/runqlat.py) through
// the distribution's bcc (python3-bpfcc / python3-bcc). Licence: Apache-2.0 (the program is
// GPL-compatible-only where the kernel requires it: it uses no GPL-only helper).
//
// Per layer of temperd's plan: a log2 histogram of the delay between a member thread becoming
// runnable (woken, or preempted while still runnable) and it running, in microsecond slots; the
// sum of those delays; their maximum since temperd last read it; and why members left the CPU
// (preempted, voluntary sleep, uninterruptible sleep).
//
// Filter in the kernel: temperd writes the plan's members into layer_of (tid -> layer id, on every
// apply). A thread that is not a member costs one hash lookup per wakeup and per switch side,
// and nothing is stored for it.
//
// MAX_MEMBERS, MAX_LAYERS and SLOTS come from temperd's cflags.

#include <uapi/linux/ptrace.h>
#include <linux/sched.h>

#ifndef MAX_MEMBERS
#define MAX_MEMBERS 16384
#endif
#ifndef MAX_LAYERS
#define MAX_LAYERS 256
#endif
#ifndef SLOTS
#define SLOTS 26
#endif

#define OFF_PREEMPTED 0
#define OFF_VOLUNTARY 1
#define OFF_UNINTERRUPTIBLE 2
#define STATE_RUNNING 0x0000
#define STATE_UNINTERRUPTIBLE 0x0002

struct hist_key {
    u32 layer;
    u32 slot;
};

struct off_key {
    u32 layer;
    u32 reason;
};

BPF_HASH(layer_of, u32, u32, MAX_MEMBERS);     // tid -> layer id (1..MAX_LAYERS-1), from the plan
BPF_HASH(queued_at, u32, u64, MAX_MEMBERS);    // tid -> when it became runnable (ns)
BPF_HASH(hist, struct hist_key, u64, MAX_LAYERS * SLOTS);
BPF_ARRAY(sum_ns, u64, MAX_LAYERS);
BPF_ARRAY(max_ns, u64, MAX_LAYERS);
BPF_HASH(offcpu, struct off_key, u64, MAX_LAYERS * 3);

static __always_inline int queued(u32 tid)
{
    u32 *layer = layer_of.lookup(&tid);
    if (!layer)
        return 0;
    u64 now = bpf_ktime_get_ns();
    queued_at.update(&tid, &now);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_wakeup)
{
    struct task_struct *p = (struct task_struct *)ctx->args[0];
    return queued(p->pid);
}

RAW_TRACEPOINT_PROBE(sched_wakeup_new)
{
    struct task_struct *p = (struct task_struct *)ctx->args[0];
    return queued(p->pid);
}

// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
RAW_TRACEPOINT_PROBE(sched_switch)
{
    struct task_struct *prev = (struct task_struct *)ctx->args[1];
    struct task_struct *next = (struct task_struct *)ctx->args[2];
    u32 prev_tid = prev->pid;
    u32 next_tid = next->pid;

    u32 *prev_layer = layer_of.lookup(&prev_tid);
    if (prev_layer) {
        u32 state = (u32)ctx->args[3];
        struct off_key off = {.layer = *prev_layer};
        if (state == STATE_RUNNING) {
            // preempted while runnable: it waits on the runqueue again from now
            u64 now = bpf_ktime_get_ns();
            queued_at.update(&prev_tid, &now);
            off.reason = OFF_PREEMPTED;
        } else if (state & STATE_UNINTERRUPTIBLE) {
            off.reason = OFF_UNINTERRUPTIBLE;
        } else {
            off.reason = OFF_VOLUNTARY;
        }
        offcpu.atomic_increment(off);
    }

    u32 *next_layer = layer_of.lookup(&next_tid);
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
