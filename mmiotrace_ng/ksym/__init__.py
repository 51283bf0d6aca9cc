"""mmiotrace-ng ksym: watch reads and writes of kernel variables with the
CPU's hardware breakpoints (perf breakpoint events with a BPF program),
one line per access or counts per (access type, symbol, function) kept in
the kernel.  The design of the ksym_tracer proposed for Linux 2.6.30."""
