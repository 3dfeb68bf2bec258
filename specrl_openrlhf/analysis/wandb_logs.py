"""Offline wandb runs (`wandb/offline-run-*`, `wandb/run-*`), read from disk with no network: their logged scalars,
in the shape the report reads TensorBoard's ({'train/...' or 'eval/...': {step: value}}).

A run folder holds `run-<id>.wandb`, wandb's transaction log: a 7-byte header (":W&B", magic, version), then records
in 32 KiB blocks, each with a 7-byte header (checksum, length, type: full, first, middle or last piece) and a
`wandb_internal_pb2.Record` protobuf. The history records carry what `wandb.log` got: OpenRLHF's WandbLogger logs
`train/*` with `train/global_step`, and `eval/*` with `eval/global_step`. wandb ships the protobuf definitions; the
framing is read here, because wandb 0.31 offers no public reader of local runs.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

logger = logging.getLogger(__name__)

HEADER = b":W&B"
HEADER_LEN, BLOCK_LEN, PIECE_HEADER_LEN = 7, 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def run_folders(root: Path) -> list[Path]:
    """The offline and synced run folders under `root` (each holds one `run-*.wandb`)."""
    return sorted(
        {p.parent for pattern in ("offline-run-*/run-*.wandb", "run-*/run-*.wandb") for p in root.rglob(pattern)}
    )


def records(path: Path):
    """The records of a `.wandb` file, as protobuf bytes, in order."""
    data = Path(path).read_bytes()
    if data[:4] != HEADER:
        raise ValueError(f"{path}: not a wandb run file")
    position, pieces = HEADER_LEN, []
    while position + PIECE_HEADER_LEN <= len(data):
        room = BLOCK_LEN - position % BLOCK_LEN
        if room < PIECE_HEADER_LEN:  # a block's tail too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + PIECE_HEADER_LEN])
        start = position + PIECE_HEADER_LEN
        if length == 0 and kind == 0:  # zero fill past the last record
            break
        pieces.append(data[start : start + length])
        position = start + length
        if kind in (FULL, LAST):
            yield b"".join(pieces)
            pieces = []
        elif kind not in (FIRST, MIDDLE):
            raise ValueError(f"{path}: bad record type {kind} at byte {position}")


def scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Every number a run logged, by key and step (`train/global_step` for `train/*`, `eval/global_step` for
    `eval/*`); the last value logged for a step wins."""
    from wandb.proto import wandb_internal_pb2

    [path] = sorted(Path(folder).glob("run-*.wandb"))[-1:]
    out: dict[str, dict[int, float]] = {}
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            try:
                row[key] = json.loads(item.value_json)
            except ValueError:
                continue
        for prefix in ("train", "eval"):
            step = row.get(f"{prefix}/global_step")
            if step is None:
                continue
            for key, value in row.items():
                if key.startswith(f"{prefix}/") and key != f"{prefix}/global_step" and isinstance(value, (int, float)):
                    out.setdefault(key, {})[int(step)] = float(value)
    return out


def run_info(folder: Path) -> dict:
    """The run's name, group and config (what `wandb.init` got), from its run and config records."""
    from wandb.proto import wandb_internal_pb2

    [path] = sorted(Path(folder).glob("run-*.wandb"))[-1:]
    info: dict = {"config": {}}
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            info["name"] = record.run.display_name or None
            info["group"] = record.run.run_group or None
            updates = record.run.config.update
        elif kind == "config":
            updates = record.config.update
        else:
            continue
        for item in updates:
            try:
                value = json.loads(item.value_json)
            except ValueError:
                continue
            info["config"][item.key or "/".join(item.nested_key)] = (
                value.get("value", value) if isinstance(value, dict) else value
            )
    return info
