"""Keep gloo on this machine's loopback interface when every rank runs on this machine.

Without ``GLOO_SOCKET_IFNAME``, gloo binds each rank to the address this machine's host name
resolves to (``ProcessGroupGloo::createDefaultDevice`` in torch), and that need not be an address
the ranks can reach each other on (a VPN's, a container bridge's). torch reads the variable when a
gloo process group is created (``ProcessGroupGloo::Options::create_default``), as a
comma-separated list of interface names. The course's ranks always meet on this machine
(``Ranks``, ``torchrun --standalone``), so the loopback interface always works for them; a value
the user set is left alone.
"""

from __future__ import annotations

import socket
from typing import MutableMapping

__all__ = ["GLOO_IFNAME", "loopback_interface", "gloo_on_loopback"]

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
LOOPBACK_NAMES = ("lo", "lo0")  # Linux, then macOS and the BSDs


def loopback_interface() -> str | None:
    """This machine's loopback interface by name (``"lo"`` on Linux, ``"lo0"`` on macOS), or None.

    Read from ``socket.if_nameindex()``, the interfaces the operating system lists; None where it
    lists neither name or cannot list them (then gloo is left to choose, as before)."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (AttributeError, OSError):  # no if_nameindex on this platform, or the call failed
        return None
    return next((name for name in LOOPBACK_NAMES if name in names), None)


def gloo_on_loopback(env: MutableMapping[str, str]) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` in ``env`` to the loopback interface unless ``env`` already names one.

    A user's own value wins; an empty one counts as unset (torch ignores it too). Returns the value
    ``env`` holds afterwards, or None when it holds none (no loopback interface was found)."""
    if env.get(GLOO_IFNAME):
        return env[GLOO_IFNAME]
    name = loopback_interface()
    if name is not None:
        env[GLOO_IFNAME] = name
    return name
