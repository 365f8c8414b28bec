#!/bin/sh
# policy-vmlinux.sh OUT KERNEL_VMLINUX
#
# Writes OUT, the vmlinux.h every policy object is compiled against, and
# OUT.source, one line saying where its types came from.  In order:
#   1. the running kernel's BTF, when it has cache_ext_ops (a cache_ext host);
#   2. the patched tree's vmlinux (KERNEL_VMLINUX, from kernel/build), whose
#      BTF has it: the objects then load in the VM;
#   3. a stand-in: the running kernel's types plus the contract's
#      (include/cache_ext_types.h), so policies compile anywhere; such
#      objects load nowhere, and OUT.source says so.
# OUT is replaced only when its content changes, so objects are rebuilt
# only when their types do.
set -eu
out=$1
kernel_vmlinux=$2
bpftool=${BPFTOOL:-bpftool}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$out.tmp

has_cache_ext() {
	"$bpftool" btf dump file "$1" 2>/dev/null | grep -q "STRUCT 'cache_ext_ops'"
}

if [ -r /sys/kernel/btf/vmlinux ] && has_cache_ext /sys/kernel/btf/vmlinux; then
	"$bpftool" btf dump file /sys/kernel/btf/vmlinux format c >"$tmp"
	source="running kernel $(uname -r) (has cache_ext)"
elif [ -f "$kernel_vmlinux" ] && has_cache_ext "$kernel_vmlinux"; then
	"$bpftool" btf dump file "$kernel_vmlinux" format c >"$tmp"
	source="patched kernel tree ($kernel_vmlinux)"
elif [ -r /sys/kernel/btf/vmlinux ]; then
	{
		echo "/* stand-in: the running kernel's types + the cache_ext contract */"
		"$bpftool" btf dump file /sys/kernel/btf/vmlinux format c |
			sed '/^#endif \/\* __VMLINUX_H__ \*\//d'
		cat "$here/include/cache_ext_types.h"
		# the kernel's list node is private to mm/cache_ext.c: opaque here
		echo "struct cache_ext_list_node { u64 opaque[6]; };"
		echo "#endif /* __VMLINUX_H__ */"
	} >"$tmp"
	source="stand-in: running kernel $(uname -r) types + cache_ext contract types (compile check only; the patched kernel is not built)"
else
	echo "policy-vmlinux.sh: no BTF: /sys/kernel/btf/vmlinux is missing and $kernel_vmlinux is not built" >&2
	exit 1
fi
if cmp -s "$tmp" "$out" 2>/dev/null; then
	rm -f "$tmp"
else
	mv "$tmp" "$out"
fi
echo "$source" >"$out.source.tmp"
cmp -s "$out.source.tmp" "$out.source" 2>/dev/null && rm -f "$out.source.tmp" ||
	mv "$out.source.tmp" "$out.source"
