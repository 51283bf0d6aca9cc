"""What the tools share: errors and output, child processes, start-up phases,
kernel symbols and BTF, BPF objects, system calls and ring buffers."""
