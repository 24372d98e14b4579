/* The smallest sched_ext scheduler: it only registers a name, so the kernel's default
 * operations (one global FIFO queue) schedule every task. The VM test loads it to be
 * "another BPF scheduler" that temperd must detect, name, and refuse to replace.
 *
 * No vmlinux.h is needed: libbpf matches struct_ops members by name against the kernel's
 * BTF, so a local type with only the members set here is enough (name is
 * char[SCX_OPS_NAME_LEN], 128 bytes, in every kernel with sched_ext).
 *
 * Build: clang --target=bpf -O2 -g -c scx_minimal.bpf.c -o scx_minimal.bpf.o
 * Load:  bpftool struct_ops register scx_minimal.bpf.o /sys/fs/bpf/scx_minimal
 * Unload: rm -r /sys/fs/bpf/scx_minimal
 */

#define SEC(name) __attribute__((section(name), used))

struct sched_ext_ops {
	char name[128];
};

SEC(".struct_ops.link")
struct sched_ext_ops e2e_minimal_ops = {
	.name = "e2e_minimal",
};

char _license[] SEC("license") = "GPL";
