"""CLI pieces that need no kernel: arguments, raw files, vmallocinfo parsing."""
# ruff: noqa: E501  (vmallocinfo lines are long)

from __future__ import annotations

import pytest

from mmiotrace_ng import cli, rawfile, vmalloc
from mmiotrace_ng.render import Renderer, synthetic_access_records

VMALLOCINFO = """\
0xffffc90000000000-0xffffc90000002000    8192 acpi_os_map_iomem+0x1c6/0x1f0 phys=0x00000000fed00000 ioremap
0xffffc90000600000-0xffffc90000701000 1052672 pci_iomap_range+0x5e/0x80 phys=0x00000000fea00000 ioremap
0xffffc90000800000-0xffffc90000802000    8192 alloc_thread_stack_node+0x44/0x1b0 pages=1 vmalloc N0=1
0xffffc90000a00000-0xffffc90000b01000 1052672 ng_filter_add+0x9d/0x160 [mmiotng] phys=0x00000000fea00000 ioremap
"""


def test_existing_mappings_picks_the_traced_ranges():
    found = vmalloc.existing_mappings([(0xFEA00000, 0xFEB00000)], VMALLOCINFO)
    assert found == [vmalloc.Existing(0xFFFFC90000600000, 0x100000, 0xFEA00000)]
    assert vmalloc.existing_mappings([(0x1000, 0x2000)], VMALLOCINFO) == []


def test_raw_file_round_trip(tmp_path):
    recs = synthetic_access_records(100)
    path = tmp_path / "t.raw"
    w = rawfile.RawWriter(str(path))
    w.header("VERSION 20070824\n")
    w.records(recs[:60])
    w.records(recs[60:])
    w.close()
    header, back = rawfile.read_raw(str(path))
    assert header == "VERSION 20070824\n" and back == recs
    assert Renderer().feed_batch(back) == Renderer().feed_batch(recs)


def test_raw_file_rejects_other_files(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("VERSION 20070824\n")
    with pytest.raises(rawfile.NotRawFile):
        rawfile.read_raw(str(path))


@pytest.mark.parametrize("argv,words", [
    ([], "nothing to trace"),
    (["--pci", "01:00.0", "modprobe"], "put the command after --"),
    (["--pci", "01:00.0", "--buffer-size-kb", "1"], "at least 4"),
])
def test_usage_errors_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_command_after_double_dash():
    args = cli.parse_args(["--pci", "01:00.0", "--", "modprobe", "-v", "nouveau"])
    assert args.cmd == ["modprobe", "-v", "nouveau"] and args.pci == ["01:00.0"]


def test_version(capsys) -> None:
    from mmiotrace_ng import __version__
    from mmiotrace_ng.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"mmiotrace-ng {__version__}\n"


def test_existing_mappings_with_hidden_addresses() -> None:
    """kptr_restrict=2: vmallocinfo shows 0 for every address; such entries
    come back with virt 0, for the caller to say why they are not traced."""
    info = ("0x0000000000000000-0x0000000000000000  1052672 pci_iomap_range+0x5e/0x80 "
            "phys=0x00000000fea00000 ioremap\n")
    found = vmalloc.existing_mappings([(0xFEA00000, 0xFEB00000)], info)
    assert [(m.virt, m.phys) for m in found] == [(0, 0xFEA00000)]
