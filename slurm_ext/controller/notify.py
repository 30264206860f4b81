"""systemd's sd_notify protocol: one datagram to $NOTIFY_SOCKET (no dependency)."""

from __future__ import annotations

import os
import socket


def sd_notify(*lines: str) -> bool:
    """Send e.g. "READY=1", "WATCHDOG=1", "STATUS=..."; False when not
    under systemd (no NOTIFY_SOCKET) or the send failed."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr or not lines:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    msg = "\n".join(line.replace("\n", " ") for line in lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(msg)
        return True
    except OSError:
        return False
