"""llm.c's token shard format for the plain-Python references: a 256-int32 header (magic 20240520,
version 1, token count), then the tokens as uint16."""
import struct

MAGIC, VERSION = 20240520, 1


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    if header[0] != MAGIC or header[1] != VERSION:
        raise SystemExit(f"{path}: not an llm.c token shard")
    n = header[2]
    return list(struct.unpack(f"<{n}H", data[1024:1024 + 2 * n]))
