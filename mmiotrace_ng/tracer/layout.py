"""Where the BPF programs of interrupts, DMA and processes' mappings find the kernel's struct
members: their offsets, read from the kernel's BTF when the object is
compiled, given to the compiler as -D flags.

The kernel's own headers would say the same, but including <linux/pci.h>,
<linux/irq.h> and the like makes bcc's compile six times as long (0.5 s to
3 s natively, over a minute more under TCG) for a handful of fields.  A
member the BTF does not have leaves its macro undefined; the programs that
need it are then not compiled, and the loader says what is not traced."""

from __future__ import annotations

from ..common import btf

# macro -> (struct, member path); bpf/mmiotrace_ng.bpf.c reads them
OFFSETS = {
    "NG_OFF_DEVICE_NAME": ("device", "kobj.name"),
    "NG_OFF_PCI_DEV_DEV": ("pci_dev", "dev"),
    "NG_OFF_PCI_DEV_IRQ": ("pci_dev", "irq"),
    "NG_OFF_IRQACTION_NAME": ("irqaction", "name"),
    # CONFIG_GENERIC_MSI_IRQ only
    "NG_OFF_IRQ_DESC_MSI_DESC": ("irq_desc", "irq_common_data.msi_desc"),
    "NG_OFF_MSI_DESC_DEV": ("msi_desc", "dev"),
    "NG_OFF_SG_PAGE_LINK": ("scatterlist", "page_link"),
    "NG_OFF_SG_DMA_ADDRESS": ("scatterlist", "dma_address"),
    # CONFIG_NEED_SG_DMA_LENGTH: dma_length, else length
    "NG_OFF_SG_DMA_LENGTH": ("scatterlist", "dma_length"),
    "NG_OFF_SG_LENGTH": ("scatterlist", "length"),
    # a process's mapping: its mm (the key of its map id) and its UNMAP
    "NG_OFF_TASK_MM": ("task_struct", "mm"),
    "NG_OFF_VMA_START": ("vm_area_struct", "vm_start"),
    "NG_OFF_VMA_MM": ("vm_area_struct", "vm_mm"),
    "NG_OFF_MM_USERS": ("mm_struct", "mm_users"),
}
SIZES = {"NG_SIZEOF_SCATTERLIST": "scatterlist"}


def defines(kernel: btf.BTF | None) -> list[str]:
    """-D flags for each offset and size the kernel's BTF has (none
    without BTF)."""
    if kernel is None:
        return []
    out = []
    for macro, (struct_name, path) in OFFSETS.items():
        off = kernel.member_offset(struct_name, path)
        if off is not None:
            out.append(f"-D{macro}={off}")
    for macro, struct_name in SIZES.items():
        type_id = kernel.struct_id(struct_name)
        size = kernel.size(type_id) if type_id is not None else None
        if size:
            out.append(f"-D{macro}={size}")
    return out


def kernel_defines() -> list[str]:
    """defines() of the running kernel; [] if its BTF is absent or cannot
    be read (the programs that need it are then left out)."""
    try:
        return defines(btf.load())
    except btf.BTFError:
        return []


def kernel_function(name: str) -> bool:
    """Whether the running kernel's BTF has this function (a static one
    too, unless the compiler inlined it everywhere)."""
    try:
        kernel = btf.load()
    except btf.BTFError:
        return False
    return kernel is not None and bool(kernel.ids(btf.FUNC, name))
