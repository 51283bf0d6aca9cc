"""The live MMIO tracer: its BPF programs, the helper module (loading,
netlink), the PCI devices and mappings it traces, the in-kernel histogram."""
