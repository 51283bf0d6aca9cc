"""ksym requests: the proposal's syntax, and one clear error for each of
its malformed forms (nothing is armed before all requests resolve)."""

from __future__ import annotations

import pytest

from mmiotrace_ng.common.symbols import Kallsyms, SymbolError
from mmiotrace_ng.ksym import request as rq
from mmiotrace_ng.ksym.request import RequestError, parse, resolve

KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81001000 T proc_dointvec
ffffffff81001100 T do_sysctl
ffffffff82000000 D pid_max
ffffffff82000004 D pid_max_min
ffffffff82000010 D jiffies_64
ffffffff82000020 d twin
ffffffff82000030 d twin
ffffffff82000040 D odd_var
ffffffff82000043 D next_after_odd
ffffffffc0000000 t e1000_probe\t[e1000]
ffffffffc0001000 d e1000_driver_name\t[e1000]
ffffffffc0001009 d e1000_copyright_odd\t[e1000]
ffffffffc0001010 d e1000_copyright\t[e1000]
ffffffffc0002000 b edu_watched\t[edu_exerciser]
ffffffffc0002004 b edu_watch_sink\t[edu_exerciser]
"""


@pytest.fixture
def btf_sizes(monkeypatch) -> dict[tuple[str, str], int]:
    """The variables' sizes in the kernel's BTF: none unless a test adds them
    (not this host's BTF)."""
    sizes: dict[tuple[str, str], int] = {}
    monkeypatch.setattr(rq, "btf_variable_size",
                        lambda name, module="": sizes.get((module, name)))
    monkeypatch.setattr(rq.btf, "present", lambda module="": False)
    return sizes


@pytest.fixture
def syms(monkeypatch, btf_sizes) -> Kallsyms:
    sizes = {("e1000", "e1000_driver_name"): 6, ("edu_exerciser", "edu_watched"): 4,
             ("e1000", "e1000_copyright_odd"): 5}
    monkeypatch.setattr(rq, "module_object_size", lambda mod, name: sizes.get((mod, name)))
    return Kallsyms(KALLSYMS)


def test_kernel_symbol_length_from_the_next_symbol(syms):
    (w,) = resolve(["pid_max:rw-"], syms)
    assert (w.addr, w.len, w.type, w.text, w.module) == (0xFFFFFFFF82000000, 4, "RW",
                                                           "pid_max", "")
    assert "no size" in w.note and "/LEN" in w.note


def test_explicit_length_offset_and_writes(syms):
    (w,) = resolve(["jiffies_64+4/4:-w-"], syms)
    assert (w.addr, w.len, w.type, w.note) == (0xFFFFFFFF82000014, 4, "W", "")


def test_module_symbol_sizes_from_the_module(syms):
    a, b = resolve(["edu_exerciser:edu_watched:-w-", "e1000:e1000_driver_name:rw-"], syms)
    assert (a.len, a.module, a.note) == (4, "edu_exerciser", "")
    assert (b.len, b.text) == (8, "e1000:e1000_driver_name")   # 6 bytes: 8 by default
    (c,) = resolve(["e1000:e1000_copyright_odd:rw-"], syms)    # 5 bytes at an odd address
    assert c.len == 1 and "watching the first 1" in c.note


def test_btf_sizes_come_first(syms, btf_sizes):
    btf_sizes.update({("", "pid_max"): 2, ("", "jiffies_64"): 8, ("", "odd_var"): 3,
                      ("edu_exerciser", "edu_watched"): 2})
    a, b, c = resolve(["pid_max:rw-", "jiffies_64+4:rw-", "edu_exerciser:edu_watched:-w-"],
                      syms)
    assert (a.len, a.note) == (2, "")             # not the 4 bytes to the next symbol
    assert (b.addr, b.len, b.note) == (0xFFFFFFFF82000014, 4, "")   # 8 - 4 on
    assert (c.len, c.note) == (2, "")             # not the .ko's 4
    (d,) = resolve(["odd_var:rw-"], syms)         # 3 bytes: as a module's string is
    assert (d.len, d.note) == (8, "")
    (e,) = resolve(["e1000:e1000_driver_name:rw-"], syms)   # no BTF: the .ko's 6
    assert e.len == 8


def test_a_module_file_that_cannot_be_read_is_said(syms, monkeypatch):
    def unreadable(mod, name):
        raise SymbolError("/lib/modules/x/e1000.ko.zst is zstd-compressed, and neither ...")
    monkeypatch.setattr(rq, "module_object_size", unreadable)
    (w,) = resolve(["e1000:e1000_driver_name:rw-"], syms)
    assert w.len == 8 and "e1000.ko.zst is zstd-compressed" in w.note and "/LEN" in w.note
    monkeypatch.setattr(rq, "module_object_size", lambda mod, name: None)
    (w,) = resolve(["e1000:e1000_driver_name:rw-"], syms)
    assert "no .ko file of e1000" in w.note and ".ko.zst" in w.note


@pytest.mark.parametrize(("req", "why"), [
    ("pid_max", "expected [MODULE:]SYMBOL"),
    ("a:b:c:rw-", "expected [MODULE:]SYMBOL"),
    (":pid_max:rw-", "expected [MODULE:]SYMBOL"),
    ("pid_max:", "expected [MODULE:]SYMBOL"),
    ("pid_max:r--", "no read-only data breakpoint"),
    ("pid_max:rwx", "OP must be rw-"),
    ("pid_max:--x", "OP must be rw-"),
    ("pid_max/3:rw-", "LEN must be 1, 2, 4 or 8"),
    ("pid_max/16:rw-", "LEN must be 1, 2, 4 or 8"),
    ("pid_max+x:rw-", "is not SYMBOL[+OFF][/LEN]"),
    ("no_such_thing:rw-", "no symbol no_such_thing in the kernel"),
    ("e1000_driver_name:rw-", "it is in e1000: MODULE:SYMBOL"),
    ("e1000:pid_max:rw-", "no symbol pid_max in module e1000"),
    ("proc_dointvec:rw-", "is a function"),
    ("twin:rw-", "2 symbols named twin"),
    ("pid_max+2/4:rw-", "must be 4-byte aligned"),
    ("odd_var+1/2:rw-", "must be 2-byte aligned"),
])
def test_malformed_request_one_clear_error(syms, req, why):
    with pytest.raises(RequestError) as exc:
        resolve([req], syms)
    assert why in str(exc.value)
    assert "\n" not in str(exc.value)


def test_duplicate_and_fifth_request(syms):
    with pytest.raises(RequestError, match="watched twice"):
        resolve(["pid_max:rw-", "pid_max/4:-w-"], syms)
    five = ["pid_max:rw-", "jiffies_64:rw-", "odd_var/1:rw-", "pid_max_min:rw-",
            "edu_exerciser:edu_watched:rw-"]
    with pytest.raises(RequestError, match="at most 4 at a time"):
        resolve(five, syms)
    assert len(resolve(five[:4], syms)) == 4


def test_parse_keeps_the_parts():
    spec = parse("e1000:e1000_driver_name+0x8/2:-w-")
    assert (spec.module, spec.symbol, spec.offset, spec.len, spec.type) == (
        "e1000", "e1000_driver_name", 8, 2, "W")


def test_function_column_as_the_kernel_prints_it(syms):
    assert syms.function(0xFFFFFFFF81001010) == "proc_dointvec+0x10/0x100"
    assert syms.function(0xFFFFFFFFC0000010).endswith(" [e1000]")
    assert syms.function(0x1000) == "0x1000"


def test_module_object_sizes_agree_with_readelf():
    """The .ko reader against binutils, on the exerciser tests/setup.sh builds."""
    import shutil
    import subprocess
    from pathlib import Path

    from ng_require import missing

    from mmiotrace_ng.common.symbols import elf_object_sizes

    ko = Path(__file__).resolve().parents[1] / "drivers" / "edu_exerciser" / "edu_exerciser.ko"
    if not ko.exists() or not shutil.which("readelf"):
        missing(f"{ko} (tests/setup.sh builds it) and readelf")
    want = {}
    for line in subprocess.run(["readelf", "-sW", str(ko)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        f = line.split()
        if len(f) == 8 and f[3] == "OBJECT":
            want[f[7]] = int(f[2], 0)
    got = elf_object_sizes(ko.read_bytes())
    assert want and got == want
    assert got["edu_watched"] == 4
