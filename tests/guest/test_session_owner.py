"""The session belongs to its socket, in its network namespace.

Netlink port ids are per network namespace and the tracer's is readable in
/proc/net/netlink: any user can make a socket with that port id in a new
namespace of their own and close it.  That must not end the session.
"""

from __future__ import annotations

import re
import subprocess

from ng_tracer import NgTracer, helper_status

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
BIND_AND_CLOSE = """
import socket, sys
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16)  # NETLINK_GENERIC
s.bind((int(sys.argv[1]), 0))
print(s.getsockname()[0])
s.close()
"""


def test_same_port_id_in_another_netns_does_not_end_the_session(exerciser):
    t = NgTracer(["--pci", exerciser.dev.name], "owner-netns").start()
    try:
        owner = helper_status()["owner"]
        assert owner
        res = subprocess.run([*NOBODY, "unshare", "-Urn", "python3", "-c", BIND_AND_CLOSE,
                              str(owner)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == str(owner), res.stdout
        st = helper_status()
        assert (st["owner"], st["filters"]) == (owner, 1), st
        text = t.section(lambda: exerciser.run("readl"))
        ident = rf"^R 4 \S+ \d+ 0x{exerciser.bar0[0]:x} 0x10000ed "
        assert re.search(ident, text, re.M), f"nothing traced after the close:\n{text}"
    finally:
        assert t.stop() == 0, t.stderr()
