"""Hostfile parsing, `--include`/`--exclude` filtering and the world-info encoding.

These are pure functions over plain dicts so that every rule about which host and slot runs a
worker can be unit-tested without spawning anything. A resource pool maps a host name to its slot
count (`{"worker-1": 4}`); active resources map a host name to the list of slot ids it will use
(`{"worker-1": [0, 2]}`), in hostfile order.
"""
import base64
import json
import os
import re
from collections import OrderedDict

_HOST_LINE = re.compile(r"^(?P<host>\S+)\s+slots=(?P<slots>\S+)$")


def parse_hostfile(lines, source="<hostfile>"):
    """Turn hostfile lines into an ordered `{host: slots}` pool.

    Accepts `<hostname> slots=<N>` lines; `#` starts a comment and blank lines are skipped.
    Raises ValueError naming `source`, the line number and the problem, because a silently
    dropped host would start a smaller world than the user asked for.
    """
    pool = OrderedDict()
    first_seen = {}
    for lineno, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _HOST_LINE.match(line)
        if match is None:
            raise ValueError(
                f"Hostfile contains a bad entry: {source} line {lineno}: {raw.strip()!r}; "
                f"expected '<hostname> slots=<N>'")
        host, slots_text = match.group("host"), match.group("slots")
        if not slots_text.isdigit() or int(slots_text) < 1:
            raise ValueError(
                f"Hostfile contains a bad entry: {source} line {lineno}: slots={slots_text!r} for "
                f"host '{host}' is not a positive integer")
        if host in pool:
            raise ValueError(
                f"Hostfile contains multiple entries for {host}: {source} line {lineno} repeats the "
                f"host already given on line {first_seen[host]}")
        pool[host] = int(slots_text)
        first_seen[host] = lineno
    if not pool:
        raise ValueError(
            f"Hostfile is empty or not formatted correctly: {source} has no "
            f"'<hostname> slots=<N>' lines")
    return pool


def fetch_hostfile(path):
    """Read the pool from `path`, or return None when there is no such file.

    A missing file is not an error here: the default `/job/hostfile` is optional and the caller
    falls back to local devices. The caller decides whether an explicit path must exist.
    """
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return parse_hostfile(handle.readlines(), source=path)


def _parse_filter(filter_str, flag):
    """Split `NAME[:SLOT[,SLOT...]][@NAME...]` into `[(host, [slots] or None), ...]`."""
    specs = []
    for node_spec in filter_str.split("@"):
        node_spec = node_spec.strip()
        if not node_spec:
            raise ValueError(
                f"{flag} {filter_str!r} has an empty node entry; expected "
                f"NAME[:SLOT[,SLOT...]][@NAME[:SLOT[,SLOT...]]...]")
        host, sep, slots_text = node_spec.partition(":")
        if not host:
            raise ValueError(f"{flag} {filter_str!r}: node entry {node_spec!r} has no host name")
        if not sep:
            specs.append((host, None))
            continue
        slots = []
        for item in slots_text.split(","):
            item = item.strip()
            if not item.isdigit():
                raise ValueError(
                    f"{flag} {filter_str!r}: slot {item!r} on host '{host}' is not a "
                    f"non-negative integer")
            slots.append(int(item))
        specs.append((host, slots))
    return specs


def parse_resource_filter(host_info, include_str="", exclude_str=""):
    """Apply an include or exclude filter to `{host: [slot ids]}`; returns a filtered copy.

    Include keeps only the named hosts (and, when given, only the named slots); exclude removes
    named hosts entirely or just the named slots. Hosts keep their hostfile order and slots their
    ascending order, whatever order the filter lists them in, so ranks are stable.
    """
    include_str = include_str or ""
    exclude_str = exclude_str or ""
    if include_str and exclude_str:
        raise ValueError("--include and --exclude are mutually exclusive "
                         "(include_str and exclude_str are mutually exclusive)")
    if not include_str and not exclude_str:
        return OrderedDict((host, list(slots)) for host, slots in host_info.items())

    flag, filter_str = ("--include", include_str) if include_str else ("--exclude", exclude_str)
    selected = {}
    for host, slots in _parse_filter(filter_str, flag):
        if host not in host_info:
            raise ValueError(f"{flag}: Hostname '{host}' not found in hostfile "
                             f"(known hosts: {', '.join(host_info)})")
        if slots is None:
            selected[host] = None
            continue
        for slot in slots:
            if slot not in host_info[host]:
                raise ValueError(f"{flag}: No slot '{slot}' specified on host '{host}' "
                                 f"(its slots are {host_info[host]})")
        if host in selected and selected[host] is None:
            continue  # the whole host was already named
        selected.setdefault(host, set()).update(slots)

    filtered = OrderedDict()
    for host, slots in host_info.items():
        if include_str:
            if host not in selected:
                continue
            chosen = selected[host]
            keep = list(slots) if chosen is None else [s for s in slots if s in chosen]
        else:
            chosen = selected.get(host, set())
            keep = [] if chosen is None else [s for s in slots if s not in chosen]
        if keep:
            filtered[host] = keep
    if not filtered:
        raise ValueError(f"{flag} {filter_str!r} leaves no hosts or slots to run on")
    return filtered


def parse_inclusion_exclusion(resource_pool, inclusion, exclusion):
    """Filter a `{host: slot count}` pool into `{host: [slot ids]}` active resources."""
    host_info = OrderedDict((host, list(range(count))) for host, count in resource_pool.items())
    return parse_resource_filter(host_info, include_str=inclusion, exclude_str=exclusion)


def encode_world_info(active_resources):
    """Pack `{host: [slots]}` into one shell-safe token for the per-node launcher's command line."""
    payload = json.dumps(active_resources).encode("utf-8")
    return base64.urlsafe_b64encode(payload).decode("ascii")


def decode_world_info(world_info_b64):
    """Inverse of `encode_world_info`, with an error that says what was wrong."""
    try:
        info = json.loads(base64.urlsafe_b64decode(world_info_b64.encode("ascii")))
    except (ValueError, UnicodeError) as err:
        raise ValueError(f"--world_info {world_info_b64!r} is not base64-encoded JSON: {err}") from err
    if not isinstance(info, dict) or not info or not all(
            isinstance(slots, list) and slots and all(isinstance(s, int) for s in slots)
            for slots in info.values()):
        raise ValueError(f"--world_info must encode a non-empty {{host: [slot ids]}} map, got {info!r}")
    return OrderedDict(info)
