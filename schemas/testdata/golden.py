#!/usr/bin/env python3
"""Writes the annotated golden byte vectors of the v1 decision event.

An independent implementation of the byte table in ../README.md: each valid case is a
JSON event in v1/valid/NAME.json, from which this writes v1/valid/NAME.hex. The Rust tests
check both directions (encode(json) == hex, decode(hex) == json). Run it after adding a case;
the .hex files are committed.
"""
import json
import pathlib
import struct

VERDICT = {"allowed": 0, "denied": 1, "would_deny": 2}
SOURCE = {"counter_store": 0, "local_fallback": 1, "kill_switch": 2, "policy_off": 3}

# (name, struct format, how to get the value from the event)
FIELDS = [
    ("version", "B", lambda e: 1),
    ("verdict", "B", lambda e: VERDICT[e["verdict"]]),
    ("denied_by (bit0 bucket, bit1 window)", "B",
     lambda e: int(e["denied_by"]["bucket"]) | int(e["denied_by"]["window"]) << 1),
    ("source", "B", lambda e: SOURCE[e["source"]]),
    ("tier", "B", lambda e: e["tier"]),
    ("route_class", "B", lambda e: e["route_class"]),
    ("region", "<H", lambda e: e["region"]),
    ("event_time_ms", "<q", lambda e: e["event_time_ms"]),
    ("key_id", "16s", lambda e: bytes.fromhex(e["key_id"])),
    ("policy_version", "<Q", lambda e: e["policy_version"]),
    ("gateway_instance", "<I", lambda e: e["gateway_instance"]),
    ("remaining_tokens", "<I", lambda e: e["remaining_tokens"]),
    ("remaining_window", "<I", lambda e: e["remaining_window"]),
    ("retry_after_ms", "<I", lambda e: e["retry_after_ms"]),
    ("window_quota", "<I", lambda e: e["window_quota"]),
    ("sub_key", "B", lambda e: e["sub_key"]),
    ("sub_keys", "B", lambda e: e["sub_keys"]),
    ("reserved", "2s", lambda e: b"\0\0"),
]


def annotated_hex(event):
    lines, offset = [], 0
    for name, fmt, get in FIELDS:
        raw = struct.pack(fmt, get(event))
        lines.append(f"{raw.hex(' '):<48} # {offset:2}: {name}")
        offset += len(raw)
    assert offset == 64, offset
    return "\n".join(lines) + "\n"


here = pathlib.Path(__file__).parent / "v1" / "valid"
for case in sorted(here.glob("*.json")):
    case.with_suffix(".hex").write_text(annotated_hex(json.loads(case.read_text())))
    print("wrote", case.with_suffix(".hex").name)
