"""The records and what they become: the helper's and the BPF programs'
record layouts (mirrors of kmod/ and bpf/ headers), the kernel's 20070824
text, recordings and their symbol snapshots."""
