"""mmiotrace-ng: an eBPF-based mmiotrace that prints the kernel's 20070824 format."""

__version__ = "0.1.0"
